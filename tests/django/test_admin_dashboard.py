"""The queue dashboard: counts linked to the job browser, pause and resume, charts of the metrics, refresh."""

import re
import time
import xml.etree.ElementTree as ET

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from echomq_django.admin.charts_context import DAY, HOUR, Span, queue_charts, slot_metrics
from echomq_django.core import (
    COUNTED,
    JobOptions,
    Minute,
    NewJob,
    RateLimit,
    Worker,
    WorkerOptions,
    fail_for_good,
    now_ms,
    recent_minutes,
)
from echomq_django.core.reading.metrics import MINUTE_MS
from echomq_django.queues import make_sweeper
from tests.fault_proxy import FaultProxy
from tests.helpers import fetch, finish_attempt
from tests.redis_servers import RedisServer, free_port

pytestmark = pytest.mark.django_db
SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = '<script>alert("x")</script>'
DASHBOARD = "/admin/echomq/queue/"
CHART = '<svg xmlns="http://www.w3.org/2000/svg" class="echomq-chart"'  # the admin's theme icons are SVG too


def staff(username: str, *codenames: str, enforce_csrf_checks: bool = False) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="echomq", codename__in=codenames))
    client = Client(enforce_csrf_checks=enforce_csrf_checks)
    client.force_login(user)
    return client


@pytest.fixture
def superuser_client(echomq_settings) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def page_of(client: Client, query: str = "") -> str:
    response = client.get(DASHBOARD + query)
    assert response.status_code == 200
    return response.content.decode()


def content_block(page: str) -> str:
    """The page's own part: what the template's content block renders."""
    return page[page.index('<div id="content-main" class="echomq-dashboard">'):page.index('<footer')]


def charts_in(page: str) -> list[ET.Element]:
    """Every chart of the page, parsed as XML (which each must be)."""
    return [ET.fromstring(svg) for svg in re.findall(re.escape(CHART) + r".*?</svg>", page, flags=re.DOTALL)]


def chart_titled(page: str, title: str) -> ET.Element:
    [chart] = [svg for svg in charts_in(page) if svg.find(f"{SVG}title").text == title]
    return chart


def drawn_values(svg: ET.Element, kind: str, slots: int) -> dict[int, float]:
    """What a chart of `slots` slots draws for `kind`, read back from its geometry: slot -> value."""
    baseline = next(line for line in svg.iter(f"{SVG}line") if line.get("class") == "echomq-chart-baseline")
    left, right, base = (float(baseline.get(name)) for name in ("x1", "x2", "y1"))
    top = min(float(line.get("y1")) for line in svg.iter(f"{SVG}line")
              if line.get("class") == "echomq-chart-gridline")
    ceiling = max(float(text.text) for text in svg.iter(f"{SVG}text") if "echomq-chart-y" in text.get("class"))
    drawn = {}
    for line in svg.iter(f"{SVG}polyline"):
        if line.get("class") == f"echomq-series echomq-series-{kind}":
            pairs = [tuple(map(float, pair.split(","))) for pair in line.get("points").split()]
            assert len(pairs) == int(line.get("data-points")) > 0
            for x, y in pairs:
                drawn[round((x - left) / (right - left) * (slots - 1))] = (base - y) / (base - top) * ceiling
    return drawn


def last_drawn(svg: ET.Element, kind: str, slots: int) -> tuple[int, float]:
    """The last slot drawn for `kind`, and its value."""
    drawn = drawn_values(svg, kind, slots)
    return max(drawn), drawn[max(drawn)]


def settle_in_a_minute(seconds_needed: float = 25) -> None:
    """Wait, if need be, so the next `seconds_needed` s fall in one minute: metrics count by the minute."""
    into = (now_ms() % MINUTE_MS) / 1000
    if into > 60 - seconds_needed:
        time.sleep(60 - into + 0.05)


def run_jobs(queue, completed: int, failed: int) -> None:
    """Run `completed` jobs that succeed and `failed` that fail for good, with a real worker in burst mode."""
    for n in range(completed + failed):
        queue.add("work", {"fail": n >= completed}, opts=JobOptions(attempts=1))

    def handler(job):
        if job.data["fail"]:
            fail_for_good("planned failure")
        return "ok"

    worker = Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.2),
                    scripts=queue.scripts)
    assert worker.run(burst=True) == completed + failed
    assert queue.counts()["completed"] == completed and queue.counts()["failed"] == failed


def browse_url(queue_name: str, state: str) -> str:
    return reverse("admin:echomq_job_browse", args=[queue_name, state])


# -- counts link to their lists ------------------------------------------------------------------------

def test_each_count_links_to_its_list_in_the_job_browser(echomq_settings, queue):
    for n in range(3):
        queue.add("work", {"n": n})
    browser = staff("browser", "view_queue", "view_job")
    page = page_of(browser)
    for state in COUNTED:
        assert f'href="{browse_url("q", state)}"' in page, state
    assert f'<a href="{browse_url("q", "wait")}">3</a>' in page


def test_without_view_job_the_counts_are_not_links_but_the_mirror_lists_are(echomq_settings, queue):
    queue.add("work")
    viewer = staff("viewer", "view_queue", "view_failedjob", "view_stalledjob")
    page = page_of(viewer)
    assert "/admin/echomq/job/" not in page
    assert re.search(r'<td class="num">\s*1\s*</td>', page), "the wait count, unlinked"
    assert 'class="echomq-search" href="/admin/echomq/failedjob/?queue=q"' in page
    assert 'class="echomq-search" href="/admin/echomq/stalledjob/?queue=q"' in page
    bare = page_of(staff("bare", "view_queue"))
    assert "echomq-search" not in bare and "/admin/echomq/job/" not in bare


# -- pause and resume ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["echomq_queue_pause", "echomq_queue_resume"])
def test_pause_and_resume_need_a_login_post_and_the_permission(echomq_settings, queue, name):
    url = reverse(f"admin:{name}", args=["q"])
    if name == "echomq_queue_resume":
        queue.pause()
    paused_before = queue.is_paused()
    anonymous = Client().post(url)
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]
    assert staff("viewer", "view_queue", "sweep_queue").post(url).status_code == 403
    pauser = staff("pauser", "view_queue", "pause_queue")
    assert pauser.get(url).status_code == 405
    strict = staff("strict", "view_queue", "pause_queue", enforce_csrf_checks=True)
    assert strict.post(url).status_code == 403, "no CSRF token, no change"
    assert queue.is_paused() == paused_before
    assert pauser.post(reverse(f"admin:{name}", args=["unknown"])).status_code == 404


def test_pause_then_resume_from_the_dashboard(echomq_settings, queue):
    waiting = queue.add("work")
    pauser = staff("pauser", "view_queue", "pause_queue")
    page = page_of(pauser)
    assert f'action="{reverse("admin:echomq_queue_pause", args=["q"])}"' in page
    assert reverse("admin:echomq_queue_resume", args=["q"]) not in page

    response = pauser.post(reverse("admin:echomq_queue_pause", args=["q"]), follow=True)
    assert "Queue q paused" in response.content.decode()
    assert queue.is_paused() and queue.get_state(waiting) == "paused"
    page = page_of(pauser)
    assert "(paused)" in page and f'action="{reverse("admin:echomq_queue_resume", args=["q"])}"' in page
    assert reverse("admin:echomq_queue_pause", args=["q"]) not in page

    response = pauser.post(reverse("admin:echomq_queue_resume", args=["q"]), follow=True)
    assert "Queue q resumed" in response.content.decode()
    assert not queue.is_paused() and queue.get_state(waiting) == "wait"


def test_without_the_permission_there_is_no_pause_button(echomq_settings, queue):
    page = page_of(staff("viewer", "view_queue"))
    assert "echomq_queue_pause" not in page and "/q/pause/" not in page and 'value="Pause"' not in page


# -- charts: slotting (pure) ---------------------------------------------------------------------------

def minutes_ending(now_minute: int, count: int, **at: dict) -> list[Minute]:
    """`count` minutes ending with minute `now_minute`; at["m<offset>"] gives the fields of now_minute - offset."""
    return [Minute((now_minute - offset) * MINUTE_MS, **at.get(f"m{offset}", {}))
            for offset in range(count - 1, -1, -1)]


def test_the_hour_is_one_point_per_minute_and_the_live_count_is_the_last_waiting_point(settings):
    settings.TIME_ZONE = "Asia/Kathmandu"  # +05:45: the labels follow the site's time zone
    now_minute = 1_700_000_000_000 // MINUTE_MS  # 2023-11-14 22:13 UTC, 03:58 in Kathmandu
    minutes = minutes_ending(now_minute, 1440, m0={"completed": 7, "failed": 2, "waiting": 30},
                             m1={"completed": 3, "waiting": 12}, m59={"failed": 1}, m60={"completed": 99})
    slots = slot_metrics(minutes, HOUR, live_waiting=5)
    assert len(slots.labels) == len(slots.completed) == len(slots.waiting) == 60
    assert (slots.labels[0], slots.labels[-1]) == ("02:59", "03:58")
    assert slots.completed[-2:] == [3, 7] and slots.failed[-1] == 2
    assert slots.completed[0] == 0 and slots.failed[0] == 1, "the minute an hour ago is the first, not the one before"
    assert sum(slots.completed) == 10
    assert slots.waiting[-2:] == [12, 5], "the count now replaces the current minute's sample"
    assert slots.waiting[:-2] == [None] * 58, "a minute no sweep sampled is a gap"
    assert slot_metrics(minutes, HOUR).waiting[-1] == 30


def test_the_day_is_96_slots_of_15_minutes_as_means_per_minute_and_the_last_sample(settings):
    settings.TIME_ZONE = "UTC"
    now_minute = 1_700_000_000_000 // MINUTE_MS  # 22:13 UTC
    minutes = minutes_ending(
        now_minute, 1440,
        m0={"completed": 30, "failed": 3}, m14={"completed": 15, "waiting": 8},  # the last slot: m0 .. m14
        m15={"completed": 6, "waiting": 40}, m20={"waiting": 41}, m29={"failed": 15, "waiting": 42},  # slot -2
        m1439={"completed": 150, "waiting": 1})  # the first minute of the day: slot 0
    slots = slot_metrics(minutes, DAY, live_waiting=None)
    assert len(slots.labels) == len(slots.completed) == len(slots.failed) == len(slots.waiting) == 96
    assert slots.labels[-1] == "22:13" and slots.labels[-2] == "21:58" and slots.labels[0] == "22:28"
    assert slots.completed[-1] == 45 / 15 and slots.failed[-1] == 3 / 15
    assert slots.completed[-2] == 6 / 15 and slots.failed[-2] == 1
    assert slots.waiting[-2] == 40, "the last sample of the slot (m15 is its newest minute)"
    assert slots.waiting[-1] == 8
    assert slots.completed[0] == 10 and slots.waiting[0] == 1
    assert slots.waiting[1:-2] == [None] * 93 and slots.completed[1:-2] == [0] * 93
    assert slot_metrics(minutes, DAY, live_waiting=3).waiting[-1] == 3


def test_minutes_not_kept_are_gaps_not_zeros():
    now_minute = 28_000_000
    kept = minutes_ending(now_minute, 20, m19={"completed": 30})  # METRICS_MINUTES = 20
    day = slot_metrics(kept, DAY)
    assert day.completed[:-2] == [None] * 94 and day.waiting[:-2] == [None] * 94
    assert day.completed[-2] == 30 / 5, "the mean of the 5 minutes of the slot that are kept"
    hour = slot_metrics(kept, HOUR)
    assert hour.completed[:40] == [None] * 40 and hour.completed[40] == 30
    with pytest.raises(ValueError, match="at least the minute now"):
        slot_metrics([], HOUR)


def test_a_span_of_one_slot_of_one_minute():
    slots = slot_metrics([Minute(0, completed=4)], Span("now", "now", slot_minutes=1, slots=1))
    assert slots.completed == [4] and slots.waiting == [None] and slots.labels == ["00:00"]


def test_the_charts_draw_what_the_slots_hold():
    slots = slot_metrics(minutes_ending(28_000_000, 60, m0={"completed": 7, "failed": 2}), HOUR, live_waiting=4)
    throughput, waiting = (ET.fromstring(str(chart)) for chart in queue_charts("q", slots, HOUR))
    assert last_drawn(throughput, "completed", 60) == (59, pytest.approx(7, abs=0.05))
    assert last_drawn(throughput, "failed", 60) == (59, pytest.approx(2, abs=0.05))
    assert drawn_values(waiting, "waiting", 60) == {59: pytest.approx(4, abs=0.05)}


# -- charts: on the page -------------------------------------------------------------------------------

def test_the_page_draws_a_run_of_jobs_in_the_current_minute(superuser_client, queue):
    settle_in_a_minute()
    run_jobs(queue, completed=7, failed=2)
    for n in range(4):
        queue.add("work", {"n": n})
    sweeper = make_sweeper(["q"], long_running=False)
    sweeper.sweep(sweeper.targets[0], force=True)  # samples waiting: 4
    queue.add("late", opts=JobOptions(priority=5))  # the count now (wait and prioritized): 5, newer than the sample
    assert recent_minutes(queue, 1)[0].waiting == 4
    page = page_of(superuser_client)
    throughput = chart_titled(page, "Queue q: jobs finished per minute, last hour")
    completed = [line for line in throughput.iter(f"{SVG}polyline") if "echomq-series-completed" in line.get("class")]
    assert [line.get("data-points") for line in completed] == ["60"], "60 minutes, none a gap"
    assert last_drawn(throughput, "completed", 60) == (59, pytest.approx(7, abs=0.05))
    assert last_drawn(throughput, "failed", 60) == (59, pytest.approx(2, abs=0.05))
    waiting = chart_titled(page, "Queue q: jobs waiting, last hour")
    assert last_drawn(waiting, "waiting", 60) == (59, pytest.approx(5, abs=0.05))


def test_the_day_on_the_page_puts_past_minutes_in_their_slots(superuser_client, queue, settings):
    """Minutes written by the real scripts at known past times, read back through the page's own read."""
    now = now_ms()
    ids = [queue.add("work", {"n": n}, opts=JobOptions(attempts=1)) for n in range(9)]
    fetch(queue, token="t", count=9)
    for n, job_id in enumerate(ids):  # 6 completed 20 minutes ago, 3 failed 25 minutes ago: the slot before last
        minutes_ago = 20 if n < 6 else 25
        finish_attempt(queue, job_id, "t", now - minutes_ago * MINUTE_MS, completed=n < 6, value="null",
                       default_attempts=1)
    queue.add("waiting")
    queue.scripts.move_stalled_jobs_to_wait(  # a sweep 20 minutes ago sampled 1 waiting job
        queue.keys, max_stalled_count=1, now=now - 20 * MINUTE_MS, interval_ms=30_000, phase="start", cursor=0,
        budget=100, default_attempts=1, force=True, lock_ms=30_000, metrics_minutes=1440)
    queue.add("another")

    slots = slot_metrics(recent_minutes(queue, 1440), DAY, live_waiting=2)
    assert slots.completed[-2] == 6 / 15 and slots.failed[-2] == 3 / 15 and slots.waiting[-2] == 1
    assert slots.completed[-1] == 0 and slots.waiting[-1] == 2 and sum(filter(None, slots.completed)) == 6 / 15

    page = page_of(superuser_client, "?range=day")
    throughput = chart_titled(page, "Queue q: jobs finished per minute, by 15 minutes, last day")
    assert drawn_values(throughput, "completed", 96)[94] == pytest.approx(0.4, abs=0.005)
    assert drawn_values(throughput, "failed", 96)[94] == pytest.approx(0.2, abs=0.005)
    waiting = chart_titled(page, "Queue q: jobs waiting, last day")
    assert drawn_values(waiting, "waiting", 96) == {94: pytest.approx(1, abs=0.01), 95: pytest.approx(2, abs=0.01)}
    assert "Queue q: jobs waiting, last hour" not in page


def test_the_range_and_refresh_toggles_keep_each_other(superuser_client, queue):
    hour = page_of(superuser_client)
    assert '<meta http-equiv="refresh" content="30">' in hour
    assert 'href="/admin/echomq/queue/?refresh=0">Stop refreshing</a>' in hour
    assert 'href="/admin/echomq/queue/?range=day">Last day</a>' in hour
    stopped = page_of(superuser_client, "?refresh=0")
    assert 'http-equiv="refresh"' not in stopped
    assert 'href="/admin/echomq/queue/">Refresh every 30 s</a>' in stopped
    assert 'href="/admin/echomq/queue/?range=day&amp;refresh=0">Last day</a>' in stopped
    day_stopped = page_of(superuser_client, "?range=day&refresh=0")
    assert 'http-equiv="refresh"' not in day_stopped and "jobs waiting, last day" in day_stopped
    assert 'href="/admin/echomq/queue/?refresh=0">Last hour</a>' in day_stopped
    assert 'href="/admin/echomq/queue/?range=day">Refresh every 30 s</a>' in day_stopped
    assert "last hour" in page_of(superuser_client, "?range=<b>year</b>"), "an unknown range is the hour"


def test_the_page_has_no_script_and_no_inline_style(superuser_client, queue):
    run_jobs(queue, completed=1, failed=1)
    page = page_of(superuser_client)
    content = content_block(page)
    assert content.count(CHART) == 2
    assert "<script" not in content and "style=" not in content and "<style" not in content
    assert "<style" not in page, "the dashboard's styles are in echomq.css"
    assert '<link rel="stylesheet" href="/static/echomq/echomq.css">' in page


def test_charts_need_the_metrics_permission(echomq_settings, queue):
    viewer = staff("viewer", "view_queue")
    response = viewer.get(DASHBOARD)
    assert CHART not in response.content.decode() and "Throughput" not in response.content.decode()
    [row] = response.context["queues"]
    assert "charts" not in row and "charts_error" not in row, "no metrics read for a page that shows none"
    assert page_of(staff("watcher", "view_queue", "view_metrics")).count(CHART) == 2


def test_with_metrics_off_the_page_says_so(superuser_client, echomq_settings):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "METRICS_MINUTES": 0}
    page = page_of(superuser_client)
    assert CHART not in page and "metrics are off" in page


def test_the_css_styles_every_class_of_the_dashboard():
    from pathlib import Path

    import echomq_django

    root = Path(echomq_django.__file__).parent
    css = (root / "static" / "echomq" / "echomq.css").read_text()
    template = (root / "templates" / "admin" / "echomq" / "queue_dashboard.html").read_text()
    assert "/* charts */" in css and "/* dashboard */" in css
    for name in set(re.findall(r"\b(echomq-[a-z-]+)", template)) - {"echomq-dashboard"}:
        assert f".{name}" in css, name


# -- a queue or Redis that cannot be read, and escaping --------------------------------------------------

def test_a_broken_queue_has_no_charts_and_the_others_do(superuser_client, echomq_settings, queue, redis_client,
                                                         prefix):
    from echomq_django.core import Queue

    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"broken": {}, "q": {}}}
    redis_client.set(Queue("broken", redis_client, prefix=prefix).keys.wait, "x")
    page = page_of(superuser_client)
    assert "wrong type" in page and "No charts: the queue's counts could not be read." in page
    assert page.count(CHART) == 2 and "Queue q: jobs waiting" in page
    assert 'value="Pause"' in page and page.count('value="Pause"') == 1, "no button for a state not read"


def test_a_metrics_minute_another_client_broke_reads_as_empty(superuser_client, queue):
    queue.client.set(queue.keys.metrics_minute(now_ms() // MINUTE_MS), "not a hash")
    page = page_of(superuser_client)
    assert page.count(CHART) == 2


class DownAtTheMetricsRead(FaultProxy):
    """A proxy that loses Redis for good as a client asks for a metrics minute: after the counts, before the charts."""

    def _label(self, request: bytes) -> str:
        if b"HGETALL" in request.upper() and b":metrics:" in request:
            self.down()
        return super()._label(request)


def test_redis_lost_before_the_charts_still_renders_the_counts(superuser_client, echomq_settings):
    server = RedisServer()
    server.start()
    proxy = DownAtTheMetricsRead(server.port).start()
    echomq_settings.ECHOMQ = {"REDIS_URL": proxy.url, "PREFIX": "p", "ENQUEUE_TIMEOUT": 1, "QUEUES": {"q": {}}}
    try:
        page = page_of(superuser_client)
    finally:
        proxy.stop()
        server.stop()
        server.workdir.cleanup()
    assert proxy.connections_cut >= 1, "the proxy went down at the metrics read"
    assert "No charts: the metrics could not be read (Redis did not answer" in page
    assert "never" in page and 'value="Pause"' in page, "the counts and buttons of the queue are shown"
    assert CHART not in page


def test_redis_out_of_reach_still_renders_the_page(superuser_client, echomq_settings):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                              "ENQUEUE_TIMEOUT": 0.5, "QUEUES": {"q": {}, "r": {}}}
    page = page_of(superuser_client)
    assert page.count("Redis did not answer") >= 2 and CHART not in page
    assert page.count("No charts") == 2


def test_hostile_job_names_never_reach_the_dashboard(superuser_client, queue):
    queue.add(HOSTILE, {"html": HOSTILE})
    failed = queue.add(HOSTILE, opts=JobOptions(attempts=1))
    fetch(queue, token="t", count=2)
    finish_attempt(queue, failed, "t", now_ms(), completed=False, value=HOSTILE, default_attempts=1)
    page = page_of(superuser_client)
    assert "alert" not in page


def test_a_settings_error_is_shown_escaped(superuser_client, echomq_settings):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"<b>bold</b>": {}}}
    page = page_of(superuser_client)
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "<b>bold</b>" not in page


# -- flow control ---------------------------------------------------------------------------------------

def test_a_queue_without_limits_or_groups_has_no_flow_section(superuser_client, queue):
    queue.add("work")
    assert "Flow control" not in page_of(superuser_client)


def test_the_flow_section_shows_each_limit_beside_its_use_and_the_groups_most_waiting(
        superuser_client, echomq_settings, queue):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"q": {
        "RATE_LIMIT": {"MAX": 10, "DURATION": 60}, "MAX_ACTIVE": 4, "GROUP_MAX_ACTIVE": 2}}}
    for group, jobs in (("tenant-a", 5), ("tenant-b", 2), ("tenant-c", 1)):
        queue.add_bulk([NewJob("work", opts=JobOptions(group=group)) for _ in range(jobs)])
    call = queue.scripts.fetch_call(queue.keys, "t", 30_000, now_ms(), 3, "w", rate_limit=RateLimit(10, 60_000),
                                    max_active=4, group_max_active=2)
    queue.scripts.run_batch([call])  # three jobs start: one of each group, by turns
    page = content_block(page_of(superuser_client))
    flow = page[page.index("<h2>Flow control</h2>"):]
    assert "3 of 10 started in the last 60.0 s" in flow
    assert "3 of at most 4" in flow and "at most 2 running" in flow
    assert "2 groups waiting, 3 running" in flow
    rows = re.findall(r"<tr><td>([^<]+)</td><td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td></tr>", flow)
    assert rows == [("tenant-a", "4", "1"), ("tenant-b", "1", "1")]
    assert queue.counts()["wait"] == 5


def test_a_rate_limited_pause_is_shown_while_it_lasts(superuser_client, queue):
    queue.client.hset(queue.keys.meta, "limitedUntil", now_ms() + 90_000)
    page = content_block(page_of(superuser_client))
    assert "a job raised RateLimited: no job starts for" in page


def test_a_group_name_another_client_wrote_is_escaped(superuser_client, queue):
    queue.client.zadd(queue.keys.group_waiting, {HOSTILE: 3})
    page = page_of(superuser_client)
    assert HOSTILE not in page and "&lt;script&gt;" in page


def test_counters_another_client_broke_read_as_nothing_not_an_error(superuser_client, queue):
    queue.client.zadd(queue.keys.group_waiting, {"tenant-x": 3})
    queue.client.hset(queue.keys.group_active, "tenant-x", "abc")
    queue.client.hset(queue.keys.meta, "limitedUntil", "1e20")
    page = content_block(page_of(superuser_client))
    assert "tenant-x" in page and "RateLimited" not in page


# -- worker slots held by threads past their time limit -------------------------------------------

def test_slots_held_by_threads_past_their_limit_are_shown_under_the_last_sweep(superuser_client, queue):
    assert "echomq-abandoned" not in page_of(superuser_client)
    queue.client.zadd(queue.keys.abandoned, {"report-7 host:1:abc:def": now_ms() + 60_000})  # as a worker writes it
    page = content_block(page_of(superuser_client))
    assert ('<p class="echomq-abandoned">1 worker slot(s) held by thread(s) running on past their time limit '
            "(job(s) report-7): no job starts in them until they end</p>") in page
