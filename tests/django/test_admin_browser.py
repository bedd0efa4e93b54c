"""The admin's job browser: each state's list paged from Redis, a page per job, its actions and permissions."""

import re

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from echomq_django.core import JobOptions, NewJob, now_ms
from echomq_django.models import FailedJob, JobRecord
from tests.helpers import finish_attempt, kill_lock, sweep, take_jobs
from tests.redis_servers import free_port

pytestmark = pytest.mark.django_db
T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
IMG_ESCAPED = "&lt;img src=x onerror=alert(1)&gt;"


def user_with(username: str, *codenames: str) -> User:
    """A staff user with exactly these permissions (each looked up, so a misspelt one fails the test)."""
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set([Permission.objects.get(codename=codename, content_type__app_label="echomq")
                               for codename in codenames])
    return user


def client_of(user: User, *, enforce_csrf_checks: bool = False) -> Client:
    client = Client(enforce_csrf_checks=enforce_csrf_checks)
    client.force_login(user)
    return client


@pytest.fixture
def root(echomq_settings) -> Client:
    return client_of(User.objects.create_superuser("root", password="pw"))


def browse_url(state: str, queue_name: str = "q") -> str:
    return reverse("admin:echomq_job_browse", args=[queue_name, state])


def job_url(job_id: str, action: str = "detail", queue_name: str = "q") -> str:
    return reverse(f"admin:echomq_job_{action}", args=[queue_name, job_id])


def text(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content.decode()[:2000]
    return response.content.decode()


def listed(page: str) -> list[str]:
    """The job ids of a list page, in the order shown."""
    return re.findall(r'<tr><th scope="row">(?:<a href="[^"]+">)?([^<]+)', page)


def start(queue, worker_id: str = "worker-A", count: int = 1, now: int | None = None, token: str = "tok") -> list[str]:
    """Take ready jobs as worker `worker_id` would (lock of 30 s); returns their ids."""
    _due, jobs = take_jobs(queue, token, 30_000, T0 if now is None else now, count, worker_id)
    return [job_id for job_id, _ in jobs]


def end(queue, job_id: str, *, at: int, completed: bool, value: str, token: str = "tok", **options) -> int:
    options.setdefault("default_attempts", 1)
    return finish_attempt(queue, job_id, token, at, completed=completed, value=value, **options)


def failed(queue, reason: str = "boom", name: str = "work", at: int = T0 + 1_000) -> str:
    job_id = queue.add(name, {"n": 1}, opts=JobOptions(attempts=1), timestamp_ms=T0)
    assert start(queue, token=f"tok-{job_id}") == [job_id], "no other job may be ready"
    end(queue, job_id, at=at, completed=False, value=reason, token=f"tok-{job_id}")
    return job_id


# -- each state's list -----------------------------------------------------------------------------

def test_wait_lists_the_newest_first_with_name_attempts_and_created(root, queue):
    ids = [queue.add("work", {"n": n}, timestamp_ms=T0) for n in range(3)]
    page = text(root, browse_url("wait"))
    assert listed(page) == ids[::-1]
    assert f'<a href="{job_url(ids[0])}">{ids[0]}</a>' in page
    assert '<th scope="col">attempts (made / started)</th>' in page and "<td>0 / 0</td>" in page
    assert "<td>2023-11-14 22:13:20 UTC</td>" in page and "3 job(s) wait." in page


def test_prioritized_lists_in_the_order_workers_take_them_with_the_priority(root, queue):
    low = queue.add("work", opts=JobOptions(priority=-3))
    high = queue.add("work", opts=JobOptions(priority=10))
    mid = queue.add("work", opts=JobOptions(priority=5))
    page = text(root, browse_url("prioritized"))
    assert listed(page) == [high, mid, low]
    assert '<th scope="col">priority</th>' in page and "<td>10</td>" in page and "<td>-3</td>" in page


def test_delayed_lists_the_soonest_due_first_with_the_due_time(root, queue):
    later = queue.add("work", opts=JobOptions(delay_ms=3_600_000), timestamp_ms=T0)
    sooner = queue.add("work", opts=JobOptions(delay_ms=60_000), timestamp_ms=T0)
    page = text(root, browse_url("delayed"))
    assert listed(page) == [sooner, later]
    assert '<th scope="col">due</th>' in page
    assert "<td>2023-11-14 22:14:20 UTC</td>" in page and "<td>2023-11-14 23:13:20 UTC</td>" in page


def test_paused_lists_what_arrived_while_the_queue_was_paused(root, queue):
    queue.pause()
    ids = [queue.add("work") for _ in range(2)]
    assert listed(text(root, browse_url("paused"))) == ids[::-1]
    assert listed(text(root, browse_url("wait"))) == []


def test_active_lists_start_time_lock_ttl_and_worker(root, queue):
    first, second = queue.add("work"), queue.add("work")
    start(queue, "worker-A", count=2, now=now_ms())
    queue.client.hset(queue.keys.job(first), "processedOn", T0)
    page = text(root, browse_url("active"))
    assert listed(page) == [second, first]
    for header in ("started", "lock TTL", "worker"):
        assert f'<th scope="col">{header}</th>' in page
    assert "<td>2023-11-14 22:13:20 UTC</td>" in page and page.count("<td>worker-A</td>") == 2
    assert re.search(r"<td>(29|30)\.\d s</td>", page), "the lock's time left"


def test_stalled_lists_the_marked_jobs_with_their_lapsed_lock(root, queue):
    marked, healthy = queue.add("work"), queue.add("work")
    start(queue, "worker-B", count=2, now=now_ms())
    kill_lock(queue, marked)
    sweep(queue)
    page = text(root, browse_url("stalled"))
    assert listed(page) == [marked]
    assert "<td>gone</td>" in page and "<td>worker-B</td>" in page and "1 job(s) marked stalled" in page
    assert healthy not in listed(text(root, browse_url("stalled")))


def test_completed_lists_the_latest_finished_first_with_run_time(root, queue):
    ids = [queue.add("work", timestamp_ms=T0) for _ in range(2)]
    start(queue, count=2)
    end(queue, ids[0], at=T0 + 2_500, completed=True, value="1")
    end(queue, ids[1], at=T0 + 60_000, completed=True, value="2")
    page = text(root, browse_url("completed"))
    assert listed(page) == [ids[1], ids[0]]
    assert "<td>2023-11-14 22:13:22 UTC</td>" in page and "<td>2.5 s</td>" in page and "<td>60.0 s</td>" in page


def test_failed_lists_the_latest_failure_first_with_the_reason_cut_short(root, queue):
    long_reason = "disk full " * 30
    older = failed(queue, reason="timeout", at=T0 + 1_000)
    newer = failed(queue, reason=long_reason, at=T0 + 9_000)
    page = text(root, browse_url("failed"))
    assert listed(page) == [newer, older]
    assert "<td>timeout</td>" in page and "<td>2023-11-14 22:13:29 UTC</td>" in page
    assert long_reason[:119] + "…</td>" in page and long_reason not in page
    assert 'href="/admin/echomq/failedjob/?queue=q">Search and filter them</a>' in page
    assert "Search and filter" not in text(client_of(user_with("viewer", "view_job")), browse_url("failed"))


def test_an_entry_without_a_readable_hash_shows_its_id_and_why(root, queue):
    queue.client.lpush(queue.keys.wait, "ghost")
    queue.client.set(queue.keys.job("odd"), "not a hash")
    queue.client.lpush(queue.keys.wait, "odd")
    page = text(root, browse_url("wait"))
    assert listed(page) == ["odd", "ghost"]
    assert "the job hash no longer exists in Redis" in page and "holds another type than a hash" in page
    odd = text(root, job_url("odd"))
    assert "This job could not be read from Redis: " in odd
    assert "the key of job &#x27;odd&#x27; of queue &#x27;q&#x27; is not a hash" in odd


def test_the_index_links_every_state_of_every_queue(root, echomq_settings):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"q": {}, "mail": {}}}
    assert reverse("admin:echomq_job_changelist") in text(root, reverse("admin:index"))
    page = text(root, reverse("admin:echomq_job_changelist"))
    for queue_name in ("q", "mail"):
        for state in ("wait", "prioritized", "paused", "active", "delayed", "completed", "failed", "stalled"):
            assert f'href="{browse_url(state, queue_name)}"' in page
    assert '<option value="mail">' in page


# -- paging ----------------------------------------------------------------------------------------

def test_wait_is_paged_by_fifty_newest_first(root, queue):
    ids = queue.add_bulk([NewJob("work", {"n": n}) for n in range(120)])
    first = text(root, browse_url("wait"))
    assert listed(first) == ids[::-1][:50]
    assert "page 1 of 3" in first and "120 job(s) wait." in first
    assert 'href="?p=2" rel="next"' in first and 'href="?p=3">last' in first and "previous" not in first
    second = text(root, browse_url("wait") + "?p=2")
    assert listed(second) == ids[::-1][50:100] and 'href="?p=1" rel="prev"' in second
    last = text(root, browse_url("wait") + "?p=3")
    assert listed(last) == ids[19::-1] and "page 3 of 3" in last and "next" not in last
    for beyond in ("4", "999999", "10" + "0" * 25):
        assert listed(text(root, browse_url("wait") + f"?p={beyond}")) == ids[19::-1], "past the end: the last page"
    for bad in ("0", "-1", "two", "1" * 5000, "1e3"):
        assert root.get(browse_url("wait") + f"?p={bad}").status_code == 404


def test_an_empty_state_is_one_empty_page(root, queue):
    page = text(root, browse_url("completed") + "?p=7")
    assert listed(page) == [] and "page 1 of 1" in page and "0 job(s) completed." in page


def test_stalled_pages_follow_the_scan_cursor_until_the_set_is_covered(root, queue):
    # Ids that are not numbers, and more than a set keeps in its compact encoding, so SSCAN really pages.
    ids = queue.add_bulk([NewJob("work", {"n": n}, job_id=f"job-{n}") for n in range(200)])
    start(queue, count=200, now=now_ms())
    for job_id in ids:
        kill_lock(queue, job_id)
    sweep(queue)
    seen, url, pages = [], browse_url("stalled"), 0
    while url:
        page = text(root, url)
        seen += listed(page)
        pages += 1
        following = re.search(r'href="\?cursor=(\d+)" rel="next"', page)
        url = browse_url("stalled") + f"?cursor={following.group(1)}" if following else None
        assert "200 job(s) marked stalled" in page and pages < 50
    assert pages > 1 and set(seen) == set(ids)
    assert root.get(browse_url("stalled") + "?cursor=abc").status_code == 404
    assert root.get(browse_url("stalled") + f"?cursor={2**64}").status_code == 404


# -- a job's page ----------------------------------------------------------------------------------

def test_the_job_page_shows_every_attempt_error_log_progress_and_the_return_value(root, queue):
    job_id = queue.add("billing.charge", {"order": 7, "lines": [1, 2]}, opts=JobOptions(attempts=3),
                       timestamp_ms=T0)
    for attempt, error in ((1, "builtins.ValueError"), (2, "billing.errors.CardDeclined")):
        start(queue, f"worker-{attempt}", token=f"t{attempt}", now=T0 + attempt * 1_000)
        queue.scripts.add_log(queue.keys, job_id, f"t{attempt}", f"attempt {attempt} began", 100)
        end(queue, job_id, at=T0 + attempt * 1_000 + 500, completed=False, value=f"reason {attempt}",
            token=f"t{attempt}", stacktrace=f"Traceback (attempt {attempt})\n  line {attempt}", error_class=error,
            default_attempts=3)
    start(queue, "worker-3", token="t3", now=T0 + 3_000)
    queue.scripts.update_progress(queue.keys, job_id, "t3", "42")
    end(queue, job_id, at=T0 + 4_000, completed=True, value='{"charged": 12.5}', token="t3")
    page = text(root, job_url(job_id))
    assert f'<a href="{browse_url("completed")}">completed</a>' in page and "billing.charge" in page
    assert "attempt 1: worker-1</li><li>attempt 2: worker-2</li><li>attempt 3: worker-3" in page
    assert "<h3>1. builtins.ValueError</h3>\n    <pre>Traceback (attempt 1)\n  line 1</pre>" in page
    assert "<h3>2. billing.errors.CardDeclined</h3>" in page and "Errors (2)" in page
    assert "Log (2 lines)" in page and "<li>attempt 1 began</li><li>attempt 2 began</li>" in page
    assert '<progress max="100" value="42">' in page
    assert "&quot;charged&quot;: 12.5" in page
    assert "&quot;lines&quot;: [\n    1,\n    2\n  ]" in page, "data as indented JSON"
    assert "&quot;attempts&quot;: 3" in page
    assert "<td>2023-11-14 22:13:20 UTC</td>" in page and "<td>2023-11-14 22:13:24 UTC</td>" in page, "timeline"


def test_the_job_page_of_a_delayed_job_says_when_it_is_due(root, queue):
    job_id = queue.add("work", opts=JobOptions(delay_ms=60_000), timestamp_ms=T0)
    page = text(root, job_url(job_id))
    assert '<tr><th scope="row">due</th><td>2023-11-14 22:14:20 UTC</td></tr>' in page
    assert "The job has reported no progress." in page and "No log lines." in page


def test_the_job_page_of_a_running_job_shows_its_lock_worker_and_json_progress(root, queue):
    job_id = queue.add("work")
    start(queue, "worker-Z", now=now_ms())
    queue.scripts.update_progress(queue.keys, job_id, "tok", '{"step": "upload", "done": 3}')
    page = text(root, job_url(job_id))
    assert re.search(r"<th scope=\"row\">lock TTL</th><td>(29|30)\.\d s</td>", page)
    assert '<th scope="row">worker</th><td>worker-Z</td>' in page and "next sweep will" in page
    assert "&quot;step&quot;: &quot;upload&quot;" in page and "<progress" not in page


def test_a_job_page_of_a_missing_job_is_a_friendly_404(root, queue):
    response = root.get(job_url("no-such-job"))
    assert response.status_code == 404 and "Queue q has no job no-such-job in Redis" in response.content.decode()


def test_a_job_page_of_an_id_whose_hash_is_gone_shows_the_state_and_offers_delete(root, queue):
    queue.client.lpush(queue.keys.wait, "ghost")
    page = text(root, job_url("ghost"))
    assert "Redis has no job hash for it" in page and f'action="{job_url("ghost", "delete")}"' in page


# -- lookup by id ----------------------------------------------------------------------------------

def test_the_lookup_form_goes_to_the_job_or_says_why_not(root, queue):
    job_id = queue.add("work")
    index = reverse("admin:echomq_job_changelist")
    response = root.get(index, {"queue": "q", "id": f" {job_id} "})
    assert response.status_code == 302 and response["Location"] == job_url(job_id)
    assert "Queue q has no job &#x27;nope&#x27;" in text(root, f"{index}?queue=q&id=nope")
    assert "No job can have that id" in text(root, f"{index}?queue=q&id=a/b")
    assert "No job can have that id" in text(root, f"{index}?queue=q&id=wait"), "a queue key's name"
    assert "Choose one of the configured queues" in text(root, f"{index}?queue=other&id={job_id}")


# -- actions, each with its state and permission --------------------------------------------------

def delayed(queue) -> str:
    return queue.add("work", opts=JobOptions(delay_ms=3_600_000))


ACTIONS = {  # action: (permission, how to make a job it works on, the state it leaves the job in)
    "retry": ("retry_failedjob", failed, "wait"),
    "promote": ("promote_job", delayed, "wait"),
    "cancel": ("cancel_job", lambda queue: queue.add("work"), "failed"),
    "delete": ("delete_job", lambda queue: queue.add("work"), None),
}


@pytest.mark.parametrize("action", ACTIONS)
def test_each_action_needs_post_csrf_and_its_own_permission(echomq_settings, queue, action):
    permission, make, after = ACTIONS[action]
    job_id = make(queue)
    before = queue.get_state(job_id)
    url, data = job_url(job_id, action), {"post": "yes"}
    assert Client().post(url, data)["Location"].startswith("/admin/login/"), "anonymous: log in first"
    others = [codename for codename, _, _ in ACTIONS.values() if codename != permission]
    assert client_of(user_with("others", "view_job", *others)).post(url, data).status_code == 403
    allowed = user_with("allowed", permission)
    assert client_of(allowed).get(url).status_code == 405
    assert client_of(allowed, enforce_csrf_checks=True).post(url, data).status_code == 403
    assert queue.get_state(job_id) == before, "nothing changed so far"
    assert client_of(allowed).post(url, data).status_code == 302
    assert queue.get_state(job_id) == after
    if action == "cancel":
        assert queue.get_job(job_id).failed_reason == "cancelled: in the admin by allowed"
    if action == "delete":
        assert queue.get_job(job_id) is None


@pytest.mark.parametrize("name, args", [("echomq_job_changelist", []), ("echomq_job_browse", ["q", "wait"]),
                                        ("echomq_job_detail", ["q", "JOB"])])
def test_every_page_needs_the_view_permission(echomq_settings, queue, name, args):
    job_id = queue.add("work")
    url = reverse(f"admin:{name}", args=[job_id if arg == "JOB" else arg for arg in args])
    assert Client().get(url)["Location"].startswith("/admin/login/")
    every_other = ("delete_job", "promote_job", "cancel_job", "retry_failedjob")
    assert client_of(user_with("busy", *every_other)).get(url).status_code == 403
    assert client_of(user_with("viewer", "view_job")).get(url).status_code == 200


def test_buttons_show_only_where_the_state_and_the_permission_allow(root, echomq_settings, queue):
    jobs = {"failed": failed(queue), "delayed": delayed(queue), "active": queue.add("work")}
    start(queue, now=now_ms())
    jobs["wait"] = queue.add("work")
    expected = {"failed": {"retry", "delete"}, "delayed": {"promote", "cancel", "delete"},
                "wait": {"cancel", "delete"}, "active": {"cancel"}}
    for state, job_id in jobs.items():
        assert queue.get_state(job_id) == state
        page = text(root, job_url(job_id))
        shown = {action for action in ACTIONS if f'action="{job_url(job_id, action)}"' in page}
        assert shown == expected[state], state
    viewer = client_of(user_with("viewer", "view_job"))
    assert "<form" not in text(viewer, job_url(jobs["failed"])).split('id="content-main"')[1]


def test_retry_drops_the_mirror_row(root, queue):
    from echomq_django.mirror import sync_queue

    job_id = failed(queue)
    sync_queue(queue)
    assert FailedJob.objects.filter(job_id=job_id).exists()
    response = root.post(job_url(job_id, "retry"), follow=True)
    assert f"Job {job_id} of q was sent back to wait." in response.content.decode()
    assert queue.get_state(job_id) == "wait" and not FailedJob.objects.exists()


def test_delete_asks_first_and_deletes_only_on_the_confirming_post(root, queue):
    from echomq_django.mirror import sync_queue

    job_id = failed(queue)
    sync_queue(queue)
    page = root.post(job_url(job_id, "delete")).content.decode()
    assert "this cannot be undone" in page and 'name="post" value="yes"' in page
    assert queue.get_state(job_id) == "failed" and JobRecord.objects.count() == 1
    response = root.post(job_url(job_id, "delete"), {"post": "yes"})
    assert response["Location"] == browse_url("failed")
    assert queue.get_job(job_id) is None and not JobRecord.objects.exists()


def test_delete_refuses_an_active_job_and_a_job_a_worker_holds(root, queue):
    running = queue.add("work")
    start(queue, now=now_ms())
    response = root.post(job_url(running, "delete"), {"post": "yes"}, follow=True)
    refusal = "is in active, and only a job that is not active can be deleted; it was left alone"
    assert refusal in response.content.decode()
    assert queue.get_state(running) == "active"
    held = failed(queue)
    queue.client.set(queue.keys.lock(held), "someone", px=60_000)  # a worker took it after the state was read
    response = root.post(job_url(held, "delete"), {"post": "yes"}, follow=True)
    assert "is held by a live worker" in response.content.decode() and queue.get_state(held) == "failed"


def test_cancel_of_a_running_job_flags_it_and_its_page_says_so(root, queue):
    running = queue.add("work", opts=JobOptions(attempts=3))
    assert start(queue, now=now_ms()) == [running]
    response = root.post(job_url(running, "cancel"), follow=True)
    assert "is running, and is being cancelled: its worker stops it at its next lock renewal" \
        in response.content.decode()
    assert queue.get_state(running) == "active", "its worker ends it"
    assert queue.get_job(running).cancel_reason == "cancelled: in the admin by root"
    page = text(root, job_url(running))
    assert "cancel requested" in page and "cancelled: in the admin by root: its worker stops it" in page


def test_a_cancel_reason_with_html_is_shown_escaped_and_cancel_takes_only_a_csrf_post(root, queue):
    running = queue.add("work")
    assert start(queue, now=now_ms()) == [running]
    assert queue.cancel(running, "<script>alert(1)</script>")
    page = text(root, job_url(running))
    assert "cancel requested" in page
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert root.get(job_url(running, "cancel")).status_code == 405
    forged = client_of(user_with("forger", "view_job", "cancel_job"), enforce_csrf_checks=True)
    assert forged.post(job_url(running, "cancel")).status_code == 403


@pytest.mark.parametrize("action, make, says", [
    ("retry", lambda queue: queue.add("work"), "is in wait, and only a failed job can be retried"),
    ("promote", lambda queue: queue.add("work"), "is in wait, and only a delayed job can be promoted"),
    ("cancel", failed, "is in failed, and only a job that has not finished can be cancelled"),
])
def test_an_action_on_a_job_in_another_state_changes_nothing(root, queue, action, make, says):
    job_id = make(queue)
    before = queue.get_state(job_id)
    response = root.post(job_url(job_id, action), follow=True)
    assert says in response.content.decode() and queue.get_state(job_id) == before


# -- hostile content, bad names, Redis out of reach ------------------------------------------------

def test_hostile_content_is_escaped_on_every_new_page(root, queue):
    job_id = queue.add(SCRIPT, {"a": SCRIPT, "b": IMG}, opts=JobOptions(attempts=2))
    start(queue, worker_id=IMG)
    queue.scripts.add_log(queue.keys, job_id, "tok", f"{SCRIPT} {IMG}", 100)
    queue.scripts.update_progress(queue.keys, job_id, "tok", f'"{SCRIPT}{IMG}"')
    end(queue, job_id, at=T0, completed=False, value=f"{SCRIPT}{IMG}", stacktrace=IMG, error_class=SCRIPT,
        default_attempts=2, final=True)
    queue.client.hset(queue.keys.job(job_id), "name", IMG)  # another client's name, with spaces
    queue.client.lpush(queue.keys.wait, SCRIPT)  # and an id no job can have
    index = reverse("admin:echomq_job_changelist")
    pages = [text(root, url) for url in (job_url(job_id), browse_url("failed"), browse_url("wait"))]
    pages.append(text(root, f"{index}?queue=q&id={IMG}"))
    for page in pages:
        assert "<script>alert" not in page and "<img src=x" not in page
        assert SCRIPT_ESCAPED in page or IMG_ESCAPED in page
    detail = pages[0]
    assert detail.count(SCRIPT_ESCAPED) >= 4 and detail.count(IMG_ESCAPED) >= 5, "data, log, progress, reason, trace"
    assert f"<th scope=\"row\">{SCRIPT_ESCAPED}</th>" in pages[2], "an unlinked id"


@pytest.mark.parametrize("url", [
    "/admin/echomq/job/unknown/wait/", "/admin/echomq/job/q/nope/", "/admin/echomq/job/q/WAIT/",
    "/admin/echomq/job/bad{name}/wait/", "/admin/echomq/job/q/job/../", "/admin/echomq/job/q/job/a\u200bb/",
    "/admin/echomq/job/q/job/" + "x" * 300 + "/", "/admin/echomq/job/q/job/wait/", "/admin/echomq/job/unknown/job/1/",
])
def test_bad_queue_names_ids_and_states_are_404(root, queue, url):
    assert root.get(url).status_code == 404


@pytest.mark.parametrize("action", ACTIONS)
@pytest.mark.parametrize("queue_name, job_id", [("unknown", "1"), ("q", "wait"), ("q", "a\u200bb")])
def test_actions_on_bad_names_are_404(root, queue, action, queue_name, job_id):
    assert root.post(f"/admin/echomq/job/{queue_name}/job/{job_id}/{action}/", {"post": "yes"}).status_code == 404


@pytest.mark.parametrize("url", [browse_url("wait"), browse_url("stalled"), job_url("1"),
                                 reverse("admin:echomq_job_changelist") + "?queue=q&id=1"])
def test_pages_say_when_redis_does_not_answer(root, echomq_settings, url):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                              "ENQUEUE_TIMEOUT": 1}
    response = root.get(url)
    assert response.status_code == 200 and "Redis did not answer" in response.content.decode()


@pytest.mark.parametrize("action", ACTIONS)
def test_actions_say_when_redis_does_not_answer(root, echomq_settings, action):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                              "ENQUEUE_TIMEOUT": 1}
    response = root.post(job_url("1", action), {"post": "yes"})
    assert response.status_code == 302 and response["Location"] == job_url("1")
    messages = [str(message) for message in response.wsgi_request._messages]
    assert len(messages) == 1 and "was left alone: Redis did not answer" in messages[0]


def test_the_pages_need_no_inline_style_or_script(root, queue):
    job_id = failed(queue)
    for url in (reverse("admin:echomq_job_changelist"), browse_url("failed"), job_url(job_id)):
        page = text(root, url)
        assert "<style" not in page and " style=" not in page and "echomq/echomq.css" in page
        assert not re.search(r"<script(?![^>]*\bsrc=)", page), "every script is a file"
