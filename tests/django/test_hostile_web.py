"""Defects a hostile tester found in the web side (admin pages, /echomq/metrics/, echomq_status).

Each was fixed; the tests stay, as regression tests.
"""

import io
import re

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from echomq_django.core import JobOptions, Queue, connect, now_ms
from echomq_django.core.protocol.codec import MAX_JSON_DEPTH, MAX_LOG_LINE_CHARS
from tests.helpers import commands_run, finish_attempt, take_jobs
from tests.redis_servers import redis_server

pytestmark = pytest.mark.django_db

TOKEN = "scrape-token-0123456789-abcdefghij"
DASHBOARD = "/admin/echomq/queue/"
METRICS = "/echomq/metrics/"
DEEP_JSON = "[" * 100_000 + "]" * 100_000  # valid JSON; json.loads raises RecursionError, not ValueError


@pytest.fixture
def root(echomq_settings) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def job_url(job_id: str, action: str = "detail") -> str:
    return reverse(f"admin:echomq_job_{action}", args=["q", job_id])


# -- a sweep report another client wrote, nested too deeply to decode ---------------------------

def test_a_deeply_nested_sweep_report_does_not_break_the_dashboard(root, queue):
    queue.client.hset(queue.keys.meta, "lastSweep", DEEP_JSON)
    assert root.get(DASHBOARD).status_code == 200


def test_a_deeply_nested_sweep_report_does_not_break_the_metrics(echomq_settings, queue):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "METRICS_TOKEN": TOKEN}
    queue.client.hset(queue.keys.meta, "lastSweep", DEEP_JSON)
    response = Client(raise_request_exception=False).get(METRICS, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200 and b'echomq_queue_jobs{queue="q",state="wait"} 0.0' in response.content


def test_a_deeply_nested_sweep_report_does_not_break_echomq_status(echomq_settings, queue):
    queue.client.hset(queue.keys.meta, "lastSweep", DEEP_JSON)
    out = io.StringIO()
    call_command("echomq_status", stdout=out)
    assert "unreadable report" in out.getvalue() or "never" in out.getvalue()


# -- job fields another client wrote, nested deeper than the API allows -------------------------

def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [1_000, 100_000])  # decoded, then too deep to show; too deep to decode
@pytest.mark.parametrize("field", ["data", "progress", "returnvalue", "stacktrace"])
def test_a_deeply_nested_job_field_is_shown_as_text_with_a_note(root, queue, field, depth):
    job_id = queue.add("work")
    queue.client.hset(queue.keys.job(job_id), field, nested(depth))
    response = root.get(job_url(job_id))
    assert response.status_code == 200, f"{field} at {depth} levels: status {response.status_code}"
    page = response.content.decode()
    assert f"nested more than {MAX_JSON_DEPTH} levels deep" in page, "the field says why it is text"
    assert "[[[[" in page and len(page) < 100_000, f"the start of its text only: {len(page):,} characters"


def test_a_deeply_nested_stacktrace_keeps_no_other_failed_job_out_of_the_list(root, queue):
    healthy = [queue.add("work") for _ in range(5)]
    deep = queue.add("work")
    queue.client.hset(queue.keys.job(deep), "stacktrace", nested(1_000))
    queue.client.zadd(queue.keys.failed, {job_id: now_ms() for job_id in [*healthy, deep]})
    response = root.get(reverse("admin:echomq_failedjob_changelist"))
    assert response.status_code == 200, f"status {response.status_code}"
    assert all(job_id in response.content.decode() for job_id in healthy)
    assert root.get(reverse("admin:echomq_failedjob_job", args=["q", deep])).status_code == 200


# -- the charts --------------------------------------------------------------------------------

def test_a_minute_count_near_the_float_limit_does_not_break_the_charts(root, queue):
    queue.client.hset(queue.keys.metrics_minute(now_ms() // 60_000), "completed", "1.5e308")
    assert root.get(DASHBOARD).status_code == 200


# -- /echomq/metrics/ ---------------------------------------------------------------------------

def test_a_short_metrics_token_lets_its_scraper_in_under_debug_only(echomq_settings, settings, queue):
    short = "twenty-chars-token-1"
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "METRICS_TOKEN": short}
    settings.DEBUG = True
    response = Client().get(METRICS, headers={"Authorization": f"Bearer {short}"})
    assert response.status_code == 200, response.content
    settings.DEBUG = False  # production: a guessable token opens nothing (and `manage.py check` says E023)
    response = Client().get(METRICS, headers={"Authorization": f"Bearer {short}"})
    assert response.status_code == 401 and b"echomq_queue_jobs" not in response.content


@pytest.mark.parametrize("configured", ["", "   ", "\t"])
@pytest.mark.parametrize("header", ["Bearer", "Bearer ", "bearer   ", "Bearer \t"])
def test_an_empty_metrics_token_is_no_token(echomq_settings, queue, configured, header):
    # env.str("METRICS_TOKEN", default="") gave "", which an empty Bearer header matched.
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "METRICS_TOKEN": configured}
    response = Client().get(METRICS, headers={"Authorization": header})
    assert response.status_code == 401 and b"echomq_queue_jobs" not in response.content


def test_metrics_with_a_settings_error_answer_in_one_line(echomq_settings):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "METRICS_TOKEN": TOKEN, "ENQUEUE_TIMEOUT": 0}
    response = Client(raise_request_exception=False).get(METRICS, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code != 500 and response["Content-Type"].startswith("text/plain")


# -- a job's page: what it reads ----------------------------------------------------------------

def test_a_job_page_with_a_full_log_stays_small(root, queue):
    job_id = queue.add("work")
    queue.client.rpush(queue.keys.logs(job_id), *["<" * 10_000] * 1_000)  # what MAX_LOG_LINES and Job.log allow
    response = root.get(job_url(job_id))
    assert response.status_code == 200
    assert len(response.content) < 5_000_000, f"{len(response.content) / 1e6:.0f} MB"


def test_foreign_log_lines_are_cut_on_the_page_as_the_api_cuts_them(root, queue):
    job_id = queue.add("work")
    queue.client.rpush(queue.keys.logs(job_id), *["<" * 1_000_000] * 10)  # written around Job.log
    response = root.get(job_url(job_id))
    assert response.status_code == 200
    lines = re.findall(r"<li>((?:&lt;)+)(…?)</li>", response.content.decode())
    assert len(lines) == 10 and all(cut == "…" and len(text) // 4 == MAX_LOG_LINE_CHARS - 1 for text, cut in lines)


def commands_of(client, action) -> dict[str, int]:
    before = commands_run(client)
    action()
    after = commands_run(client)
    return {name: calls - before.get(name, 0) for name, calls in after.items()
            if calls > before.get(name, 0) and name != "info"}


def test_the_page_of_a_completed_job_does_not_scan_the_backlog(root, echomq_settings, prefix):
    # Commands counted on a server of the test's own (nobody else's are): counts, unlike Redis's time, do not
    # change with the speed of the machine or a stall of it.
    with redis_server() as url:
        echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "REDIS_URL": url}
        queue = Queue("q", connect(url), prefix=prefix)
        done = queue.add("work")
        take_jobs(queue, "tok", 30_000, 1, 1, "w")
        finish_attempt(queue, done, "tok", 2, completed=True, value="1", default_attempts=1)
        assert queue.get_state(done) == "completed"

        def page():
            assert root.get(job_url(done)).status_code == 200

        page()  # warm: the scripts, the client
        baseline = commands_of(queue.client, page)
        pipe = queue.client.pipeline(transaction=False)
        for first in range(0, 300_000, 10_000):  # ids alone: LPOS does not look at hashes
            pipe.rpush(queue.keys.wait, *[f"b{n}" for n in range(first, first + 10_000)])
        pipe.execute()
        backlogged = commands_of(queue.client, page)
    assert backlogged == baseline, f"{baseline} -> {backlogged}: the backlog changed what the page asks"
    walks = {name: calls for name, calls in backlogged.items() if name in ("lpos", "lrem", "sort")}
    assert not walks, f"the page of a completed job walks a list: {walks}"


# -- what an action says it did -----------------------------------------------------------------

def test_retry_of_a_failed_id_without_a_hash_says_what_happened(root, queue):
    queue.client.zadd(queue.keys.failed, {"ghost": 1})
    page = root.post(job_url("ghost", "retry"), follow=True).content.decode()
    assert queue.get_state("ghost") == "failed"
    assert "no longer failed" not in page


def test_cancel_of_a_waiting_id_without_a_hash_says_what_happened(root, queue):
    queue.client.lpush(queue.keys.wait, "ghost")
    page = root.post(job_url("ghost", "cancel"), follow=True).content.decode()
    assert queue.get_state("ghost") is None, "the cancel script took the id out of wait"
    assert "was left alone" not in page


# -- kept green: a sanity check that the fixtures above build what they mean to -------------------

def test_the_hostile_fixtures_leave_an_ordinary_queue_alone(root, queue):
    job_id = queue.add("work", opts=JobOptions(delay_ms=60_000))
    assert root.get(job_url(job_id)).status_code == 200 and root.get(DASHBOARD).status_code == 200
