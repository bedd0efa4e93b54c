"""The admin: dashboard, stalled and failed sets, actions, permissions, CSRF and escaping."""

import signal
import time

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from echomq_django.core import JobOptions
from echomq_django.mirror import sync_queue
from echomq_django.models import FailedJob
from tests.helpers import fetch, finish_attempt, kill_lock, sweep
from tests.redis_servers import RedisServer, free_port

pytestmark = pytest.mark.django_db
HOSTILE = '<script>alert("x")</script>'
ESCAPED = "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="echomq", codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def superuser_client(echomq_settings) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def failed_job(queue, data=None, reason="boom", stacktrace="", name="work") -> str:
    job_id = queue.add(name, data if data is not None else {"n": 1}, opts=JobOptions(attempts=1))
    fetch(queue, token="t")
    finish_attempt(queue, job_id, "t", 1_700_000_000_000, completed=False, value=reason,
                                   stacktrace=stacktrace, default_attempts=1)
    sync_queue(queue)
    return job_id


def stalled_jobs(queue, *attempts: int) -> list[str]:
    """One job per entry, each fetched, its worker dead, all marked by one sweep."""
    ids = [queue.add("work", {"n": n}, opts=JobOptions(attempts=a)) for n, a in enumerate(attempts)]
    fetch(queue, count=len(ids))
    for job_id in ids:
        kill_lock(queue, job_id)
    sweep(queue)
    sync_queue(queue)
    return ids


CONFIRMED = {"post": "yes"}


def job_page(job_id: str, queue_name: str = "q", model: str = "failedjob") -> str:
    return reverse(f"admin:echomq_{model}_job", args=[queue_name, job_id])


URLS = {
    "dashboard": lambda: reverse("admin:echomq_queue_changelist"),
    "failed": lambda: reverse("admin:echomq_failedjob_changelist"),
    "stalled": lambda: reverse("admin:echomq_stalledjob_changelist"),
}


def test_the_app_section_lists_the_three_views(superuser_client):
    page = superuser_client.get(reverse("admin:index")).content.decode()
    for url in URLS.values():
        assert url() in page


def test_staff_without_permissions_sees_and_changes_nothing(echomq_settings, queue):
    job_id = failed_job(queue)
    nobody = staff("nobody")
    assert reverse("admin:echomq_failedjob_changelist") not in nobody.get(reverse("admin:index")).content.decode()
    for url in URLS.values():
        assert nobody.get(url()).status_code == 403
    assert nobody.get(job_page(job_id)).status_code == 403
    for view in ("job_retry", "job_delete"):
        assert nobody.post(reverse(f"admin:echomq_failedjob_{view}", args=["q", job_id])).status_code == 403
    for name in ("echomq_queue_sweep", "echomq_queue_retry_failed", "echomq_queue_clean_failed"):
        assert nobody.post(reverse(f"admin:{name}", args=["q"]), {"days": "0"}).status_code == 403
    assert queue.get_state(job_id) == "failed"


def test_dashboard_shows_counts_marks_pause_and_last_sweep(superuser_client, queue):
    failed_job(queue)
    stalled_jobs(queue, 3)
    queue.pause()
    page = superuser_client.get(URLS["dashboard"]()).content.decode()
    assert "(paused)" in page and "s ago on" in page
    for state in ("stalled", "failed"):
        assert f'href="{reverse("admin:echomq_job_browse", args=["q", state])}">1</a>' in page
        assert f'class="echomq-search" href="/admin/echomq/{state}job/?queue=q"' in page
    assert "Sweep now" in page and "Retry all failed" in page


def test_view_only_staff_sees_no_buttons(echomq_settings, queue):
    failed_job(queue)
    viewer = staff("viewer", "view_queue", "view_failedjob", "view_stalledjob")
    page = viewer.get(URLS["dashboard"]()).content.decode()
    assert "Sweep now" not in page and "Retry all failed" not in page and "Clean" not in page
    assert viewer.get(URLS["failed"]()).status_code == 200


def test_sweep_now_forces_a_sweep_and_needs_post_csrf_and_permission(echomq_settings, queue):
    job_id = queue.add("work")
    fetch(queue)
    kill_lock(queue, job_id)
    url = reverse("admin:echomq_queue_sweep", args=["q"])
    sweeper_user = staff("sweeper", "view_queue", "sweep_queue")
    assert sweeper_user.get(url).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="sweeper"))
    assert strict.post(url).status_code == 403, "no CSRF token, no change"
    assert queue.stalled_ids() == set()
    response = sweeper_user.post(url, follow=True)
    assert "marked 1" in response.content.decode()
    assert queue.stalled_ids() == {job_id}
    assert staff("viewer", "view_queue").post(url).status_code == 403
    assert sweeper_user.post(reverse("admin:echomq_queue_sweep", args=["unknown"])).status_code == 404


def test_failed_changelist_searches_and_filters(superuser_client, queue):
    failed_job(queue, reason="disk full", name="backup")
    failed_job(queue, reason="timeout", name="mail")
    def listed(query):
        return superuser_client.get(URLS["failed"]() + query).content.decode()
    assert "disk full" in listed("?q=disk") and "timeout" not in listed("?q=disk")
    assert "disk full" in listed("?q=backup")
    assert "timeout" in listed("?name=mail") and "disk full" not in listed("?name=mail")
    assert "disk full" in listed("?queue=q")
    assert "disk full" not in listed("?queue=other")


def test_detail_page_shows_pretty_json_and_the_trace_escaped(superuser_client, queue):
    job_id = failed_job(queue, data={"payload": HOSTILE, "nested": {"a": 1}}, reason=HOSTILE,
                        stacktrace=f"Trace {HOSTILE}")
    page = superuser_client.get(job_page(job_id)).content.decode()
    assert "<script>alert" not in page
    assert page.count(ESCAPED) >= 2 and page.count("&lt;script&gt;") >= 3
    assert "&quot;nested&quot;: {\n" in page, "data shown as indented JSON"


def test_hostile_job_data_is_escaped_in_every_list(superuser_client, queue):
    failed = failed_job(queue, reason=HOSTILE, name=HOSTILE)
    stalled = queue.add(HOSTILE, {"html": HOSTILE})
    fetch(queue)
    kill_lock(queue, stalled)
    sweep(queue)
    sync_queue(queue)
    for url in (URLS["failed"](), URLS["stalled"](), URLS["dashboard"]()):
        page = superuser_client.get(url).content.decode()
        assert "<script>alert" not in page
    for url in (URLS["failed"](), URLS["stalled"]()):
        assert ESCAPED in superuser_client.get(url).content.decode(), "shown, escaped"
    for url in (job_page(failed), job_page(stalled, model="stalledjob")):
        page = superuser_client.get(url).content.decode()
        assert "<script>alert" not in page and ESCAPED in page


def post_action(client, action, rows):
    return client.post(URLS["failed"](), {"action": action, "_selected_action": [r.pk for r in rows]}, follow=True)


def test_retry_selected_moves_only_jobs_still_failed(echomq_settings, queue):
    first, second = failed_job(queue), failed_job(queue)
    queue.retry(second)  # someone else retried it meanwhile
    retrier = staff("retrier", "view_failedjob", "retry_failedjob")
    response = post_action(retrier, "retry_selected", FailedJob.objects.all())
    text = response.content.decode()
    assert "1 job(s) sent back to wait" in text and "no longer failed" in text
    assert queue.get_state(first) == "wait" and queue.get_state(second) == "wait"
    assert queue.client.lrange(queue.keys.wait, 0, -1).count(second) == 1
    assert not FailedJob.objects.exists()


def test_actions_need_their_permission(echomq_settings, queue):
    job_id = failed_job(queue)
    viewer = staff("viewer", "view_failedjob")
    post_action(viewer, "retry_selected", FailedJob.objects.all())
    post_action(viewer, "delete_selected", FailedJob.objects.all())
    assert queue.get_state(job_id) == "failed" and FailedJob.objects.count() == 1


def test_delete_selected_removes_the_jobs_from_redis(echomq_settings, queue):
    job_id = failed_job(queue)
    deleter = staff("deleter", "view_failedjob", "delete_failedjob")
    confirm = post_action(deleter, "delete_selected", FailedJob.objects.all())
    assert "Are you sure" in confirm.content.decode() and queue.get_job(job_id) is not None
    deleter.post(URLS["failed"](), {"action": "delete_selected", "post": "yes",
                                    "_selected_action": [FailedJob.objects.get().pk]})
    assert queue.get_job(job_id) is None and not FailedJob.objects.exists()


def test_retry_all_failed_and_clean_old_failed(echomq_settings, queue):
    ids = [failed_job(queue) for _ in range(3)]
    operator = staff("operator", "view_queue", "retry_failedjob", "delete_failedjob")
    operator.post(reverse("admin:echomq_queue_retry_failed", args=["q"]), CONFIRMED)
    assert [queue.get_state(i) for i in ids] == ["wait"] * 3 and not FailedJob.objects.exists()

    queue.client.delete(queue.keys.wait)
    old = failed_job(queue)  # failed at 1_700_000_000_000 ms: long ago
    response = operator.post(reverse("admin:echomq_queue_clean_failed", args=["q"]), {"days": "1", **CONFIRMED},
                             follow=True)
    assert "1 failed job(s) of q older than 1 day(s) deleted" in response.content.decode()
    assert queue.get_job(old) is None and not FailedJob.objects.exists()
    for bad in ("soon", "nan", "inf", "-1"):
        response = operator.post(reverse("admin:echomq_queue_clean_failed", args=["q"]), {"days": bad}, follow=True)
        assert response.status_code == 200 and "as a number" in response.content.decode()


def test_stalled_list_says_what_the_next_sweep_will_do(superuser_client, queue):
    recover_me, fail_me, came_back = stalled_jobs(queue, 3, 1, 3)
    queue.client.set(queue.keys.lock(came_back), "t", px=60_000)
    page = superuser_client.get(URLS["stalled"]()).content.decode()
    assert page.count("recover it to wait") == 1
    assert "fail it: attempt ceiling (1 of 1)" in page
    assert "unmark it: its lock is back" in page
    assert "gone" in page
    assert {recover_me, fail_me, came_back} <= set(queue.stalled_ids())


def test_the_page_of_a_stalled_mark_whose_job_is_gone_and_never_copied_is_a_404(superuser_client, queue):
    """A mark left by a job removed since, which the mirror never copied: nothing to show (it was a 500)."""
    queue.client.sadd(queue.keys.stalled, "ghost")
    response = superuser_client.get(job_page("ghost", model="stalledjob"))
    assert response.status_code == 404


@pytest.mark.parametrize("name", ["echomq_queue_sweep", "echomq_queue_retry_failed", "echomq_queue_clean_failed"])
def test_get_on_a_changing_view_is_405(superuser_client, name):
    assert superuser_client.get(reverse(f"admin:{name}", args=["q"])).status_code == 405


@pytest.mark.parametrize("processed_on", ["abc", "inf", "1e400", "-inf"])
def test_stalled_list_shows_a_dash_for_an_unreadable_start_time(superuser_client, queue, processed_on):
    [job_id] = stalled_jobs(queue, 3)
    queue.client.hset(queue.keys.job(job_id), "processedOn", processed_on)
    response = superuser_client.get(URLS["stalled"]())
    page = response.content.decode()
    assert response.status_code == 200 and "recover it to wait" in page and "inf s" not in page


def broken_queues(settings, queue, redis_client, prefix):
    """Queues "broken" (its wait and failed keys hold strings) and "q" (healthy, one failed job)."""
    from echomq_django.core import Queue

    settings.ECHOMQ = {**settings.ECHOMQ, "QUEUES": {"broken": {}, "q": {}}}
    broken = Queue("broken", redis_client, prefix=prefix)
    redis_client.set(broken.keys.wait, "x")
    redis_client.set(broken.keys.failed, "x")
    failed_job(queue)
    return broken


def test_dashboard_shows_a_broken_queue_as_an_error_and_the_others(superuser_client, echomq_settings, queue,
                                                                    redis_client, prefix):
    broken_queues(echomq_settings, queue, redis_client, prefix)
    response = superuser_client.get(URLS["dashboard"]())
    page = response.content.decode()
    assert response.status_code == 200
    assert "wrong type" in page and "broken" in page
    assert f'href="{reverse("admin:echomq_job_browse", args=["q", "failed"])}">1</a>' in page, \
        "the healthy queue still has its row"


@pytest.mark.parametrize("name", ["echomq_queue_sweep", "echomq_queue_retry_failed", "echomq_queue_clean_failed"])
def test_buttons_of_a_broken_queue_answer_with_a_message(superuser_client, echomq_settings, queue, redis_client,
                                                         prefix, name):
    broken_queues(echomq_settings, queue, redis_client, prefix)
    for data in ({"days": "1"}, {"days": "1", **CONFIRMED}):  # the confirmation page, then the change
        response = superuser_client.post(reverse(f"admin:{name}", args=["broken"]), data, follow=True)
        assert response.status_code == 200 and "wrong type" in response.content.decode()


@pytest.mark.parametrize("last_sweep", ["not json", "[1, 2]", '{"marked": 1}', '{"finished_at_ms": "soon"}',
                                        '{"finished_at_ms": 1e400, "host": "h"}'])
def test_dashboard_survives_a_last_sweep_report_it_cannot_read(superuser_client, queue, last_sweep):
    queue.client.hset(queue.keys.meta, "lastSweep", last_sweep)
    response = superuser_client.get(URLS["dashboard"]())
    assert response.status_code == 200 and "Sweep now" in response.content.decode()


@pytest.mark.parametrize("days", ["1e308", "36501", "1e20"])
def test_clean_failed_refuses_an_age_beyond_a_century(superuser_client, queue, days):
    job_id = failed_job(queue)
    response = superuser_client.post(reverse("admin:echomq_queue_clean_failed", args=["q"]), {"days": days},
                                     follow=True)
    assert response.status_code == 200 and "as a number" in response.content.decode()
    assert queue.get_state(job_id) == "failed"


@pytest.mark.parametrize("queue_name", ["unknown", "..", "a\u200bb", "bad{name}", "wait:x", "x" * 300])
@pytest.mark.parametrize("name", ["echomq_queue_sweep", "echomq_queue_retry_failed", "echomq_queue_clean_failed"])
def test_buttons_answer_404_for_a_queue_not_configured_or_not_valid(superuser_client, queue_name, name):
    assert superuser_client.post(reverse(f"admin:{name}", args=[queue_name]), {"days": "1"}).status_code == 404


def test_dashboard_shows_a_configuration_error_instead_of_failing(superuser_client, echomq_settings):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"a/b": {}, "q": {}}}
    response = superuser_client.get(URLS["dashboard"]())
    assert response.status_code == 200 and "may hold only" in response.content.decode()
    assert superuser_client.post(reverse("admin:echomq_queue_sweep", args=["q"])).status_code == 404


def test_actions_on_a_mirrored_job_with_an_id_no_longer_valid_answer_with_a_message(superuser_client, queue):
    # Written by another client (or before the id alphabet was narrowed): the mirror shows it anyway.
    queue.client.hset(queue.keys.job("ümlaut id"), mapping={"name": "old", "failedReason": "ancient"})
    queue.client.zadd(queue.keys.failed, {"ümlaut id": 1_000})
    sync_queue(queue)
    for action in ("retry_selected", "delete_selected"):
        response = post_action(superuser_client, action, FailedJob.objects.all())
        assert response.status_code == 200
    response = superuser_client.post(URLS["failed"](), {"action": "delete_selected", "post": "yes",
                                                        "_selected_action": [FailedJob.objects.get().pk]},
                                     follow=True)
    assert response.status_code == 200 and "may hold only" in response.content.decode()
    assert queue.client.zscore(queue.keys.failed, "ümlaut id") is not None


# -- the list shows what Redis has now (C2) --------------------------------------------------------

def fail_unsynced(queue, name="work", count=1, reason="boom") -> list[str]:
    """Jobs that fail after the mirror's last sync (no sweep has copied them)."""
    ids = [queue.add(name, {"n": n}, opts=JobOptions(attempts=1)) for n in range(count)]
    for n, (job_id, _) in enumerate(fetch(queue, token="late", count=count)):
        finish_attempt(queue, job_id, "late", 1_700_000_000_000 + n * 60_000, completed=False,
                                       value=f"{reason} {n}", default_attempts=1)
    return ids


def test_the_failed_list_shows_a_job_that_failed_since_the_last_sync(superuser_client, queue):
    failed_job(queue)
    [late] = fail_unsynced(queue, reason="failed after the sweep")
    page = superuser_client.get(URLS["failed"]()).content.decode()
    assert "failed after the sweep 0" in page and job_page(late) in page
    assert "copied from Redis as this page opened" in page and "Last complete copy: 20" in page


def test_the_stalled_list_shows_marks_made_since_the_last_sync_and_drops_recovered_ones(superuser_client, queue):
    [recovered] = stalled_jobs(queue, 3)
    fresh = queue.add("work", job_id="marked-later")
    fetch(queue, token="another-worker")
    kill_lock(queue, fresh)
    sweep(queue)  # recovers the first, marks the second; nobody syncs the mirror
    page = superuser_client.get(URLS["stalled"]()).content.decode()
    assert job_page(fresh, model="stalledjob") in page
    assert job_page(recovered, model="stalledjob") not in page


def test_a_large_backlog_is_copied_only_in_part_when_the_list_opens(superuser_client, queue, monkeypatch):
    from echomq_django.admin import mirror_lists

    monkeypatch.setattr(mirror_lists, "VIEW_SYNC_LIMIT", 2)
    fail_unsynced(queue, count=9, reason="late failure")
    page = superuser_client.get(URLS["failed"]()).content.decode()
    assert FailedJob.objects.count() == 4, "the two oldest and the two newest"
    assert "late failure 8" in page and "job(s) are not copied yet" in page and "Last complete copy: never" in page
    sync_queue(queue)  # the sweeper's sync copies the rest
    page = superuser_client.get(URLS["failed"]()).content.decode()
    assert FailedJob.objects.count() == 9 and "copied from Redis as this page opened" in page


# -- no row-id pages (C6), job pages by queue and job id (C7) ---------------------------------------

@pytest.mark.parametrize("url", ["/admin/echomq/queue/1/change/", "/admin/echomq/queue/1/history/",
                                 "/admin/echomq/queue/1/delete/", "/admin/echomq/queue/1/",
                                 "/admin/echomq/queue/add/", "/admin/echomq/failedjob/1/change/",
                                 "/admin/echomq/failedjob/1/history/", "/admin/echomq/failedjob/1/delete/",
                                 "/admin/echomq/stalledjob/1/change/"])
def test_row_id_pages_do_not_exist(superuser_client, queue, url):
    failed_job(queue)
    assert superuser_client.get(url).status_code == 404
    assert superuser_client.post(url, CONFIRMED).status_code in (404, 405)


@pytest.mark.parametrize("queue_name, job_id", [("q", "no-such-job"), ("unknown", "job-1"), ("q", ".."),
                                                ("q", "a\u200bb"), ("bad{name}", "x"), ("q", "x" * 300)])
def test_a_job_page_of_a_job_or_queue_that_does_not_exist_is_404(superuser_client, queue_name, job_id):
    assert superuser_client.get(f"/admin/echomq/failedjob/{queue_name}/{job_id}/").status_code == 404


def test_the_failed_list_links_each_job_to_its_page_by_queue_and_job_id(superuser_client, queue):
    job_id = failed_job(queue)
    page = superuser_client.get(URLS["failed"]()).content.decode()
    assert f'href="/admin/echomq/failedjob/q/{job_id}/"' in page
    detail = superuser_client.get(job_page(job_id)).content.decode()
    assert "2023-11-14 22:13:20 UTC" in detail, "times to the second"
    assert "state now" in detail and "failed" in detail


def test_the_job_page_retries_by_post_with_csrf_and_permission(echomq_settings, queue):
    job_id = failed_job(queue)
    url = reverse("admin:echomq_failedjob_job_retry", args=["q", job_id])
    viewer = staff("viewer", "view_failedjob")
    page = viewer.get(job_page(job_id)).content.decode()
    assert url not in page and "Retry" not in page
    assert viewer.post(url).status_code == 403
    retrier = staff("retrier", "view_failedjob", "retry_failedjob")
    assert f'action="{url}"' in retrier.get(job_page(job_id)).content.decode()
    assert retrier.get(url).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="retrier"))
    assert strict.post(url).status_code == 403 and queue.get_state(job_id) == "failed"
    response = retrier.post(url, follow=True)
    assert f"Job {job_id} of q sent back to wait." in response.content.decode()
    assert queue.get_state(job_id) == "wait" and not FailedJob.objects.exists()
    assert retrier.get(job_page(job_id)).status_code == 404, "no longer failed, and no row: not a failed job"


def test_the_job_page_deletes_only_after_a_confirmation(echomq_settings, queue):
    job_id = failed_job(queue)
    url = reverse("admin:echomq_failedjob_job_delete", args=["q", job_id])
    deleter = staff("deleter", "view_failedjob", "delete_failedjob")
    confirm = deleter.post(url).content.decode()
    assert "this cannot be undone" in confirm and 'name="post" value="yes"' in confirm
    assert queue.get_state(job_id) == "failed"
    deleter.post(url, CONFIRMED)
    assert queue.get_job(job_id) is None and not FailedJob.objects.exists()
    assert staff("viewer", "view_failedjob").post(url, CONFIRMED).status_code == 403


def test_a_job_page_shows_the_copy_when_redis_lost_the_job(superuser_client, queue):
    job_id = failed_job(queue, reason=HOSTILE)
    queue.client.delete(queue.keys.job(job_id))
    queue.client.zrem(queue.keys.failed, job_id)
    page = superuser_client.get(job_page(job_id)).content.decode()
    assert "Redis no longer has this job" in page and ESCAPED in page and "<script>alert" not in page


def test_a_stalled_job_page_says_what_the_next_sweep_will_do(superuser_client, queue):
    [job_id] = stalled_jobs(queue, 1)
    page = superuser_client.get(job_page(job_id, model="stalledjob")).content.decode()
    assert "fail it: attempt ceiling (1 of 1)" in page and "gone" in page


# -- bulk buttons ask first (C8) --------------------------------------------------------------------

def test_retry_all_failed_asks_first_and_acts_only_on_the_confirming_post(echomq_settings, queue):
    ids = [failed_job(queue) for _ in range(2)]
    operator = staff("operator", "view_queue", "retry_failedjob")
    url = reverse("admin:echomq_queue_retry_failed", args=["q"])
    page = operator.post(url).content.decode()
    assert "Send all 2 failed job(s) of queue q back to wait?" in page and 'name="post" value="yes"' in page
    assert [queue.get_state(i) for i in ids] == ["failed"] * 2
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="operator"))
    assert strict.post(url, CONFIRMED).status_code == 403 and queue.get_state(ids[0]) == "failed"
    operator.post(url, CONFIRMED)
    assert [queue.get_state(i) for i in ids] == ["wait"] * 2


def test_clean_failed_asks_first_saying_how_many_it_would_delete(echomq_settings, queue):
    ids = [failed_job(queue) for _ in range(3)]
    operator = staff("operator", "view_queue", "delete_failedjob")
    url = reverse("admin:echomq_queue_clean_failed", args=["q"])
    page = operator.post(url, {"days": "0"}).content.decode()
    assert "Delete 3 failed job(s) of queue q that failed before now?" in page and 'name="days" value="0"' in page
    assert operator.post(url, {"days": "36500"}).content.decode().count("Delete 0 failed job(s)") == 1
    assert [queue.get_state(i) for i in ids] == ["failed"] * 3
    operator.post(url, {"days": "0", **CONFIRMED})
    assert [queue.get_job(i) for i in ids] == [None] * 3


# -- search inside the name (C9) --------------------------------------------------------------------

def test_search_finds_a_function_by_a_part_of_its_dotted_name(superuser_client, queue):
    failed_job(queue, name="demo_project.demo_app.jobs.doomed", reason="gave up")
    failed_job(queue, name="demo_project.demo_app.jobs.flaky", reason="timeout")
    page = superuser_client.get(URLS["failed"]() + "?q=DOOMED").content.decode()
    assert "gave up" in page and "timeout" not in page
    assert "demo_project.<wbr>demo_app.<wbr>jobs.<wbr>doomed<wbr>" in page, "a line may break after each dot"


# -- the verdicts come from core.inspection, with the queue's settings (A4) -------------------------

def test_the_stalled_list_uses_the_queues_default_attempts_as_the_sweep_does(superuser_client, echomq_settings,
                                                                             queue):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"q": {"ATTEMPTS": 1}}}
    [job_id] = stalled_jobs(queue, 3)
    queue.client.hset(queue.keys.job(job_id), "opts", "{}")  # no attempts of its own: the queue's default counts
    page = superuser_client.get(URLS["stalled"]()).content.decode()
    assert "fail it: attempt ceiling (1 of 1)" in page
    sweep(queue, default_attempts=1)  # what echomq_sweep does with ATTEMPTS 1
    assert queue.get_state(job_id) == "failed"


@pytest.mark.parametrize("name, args", [
    ("admin:echomq_queue_sweep", ["q"]), ("admin:echomq_queue_retry_failed", ["q"]),
    ("admin:echomq_failedjob_job_retry", ["q", "JOB"]), ("admin:echomq_failedjob_job_delete", ["q", "JOB"]),
])
def test_buttons_answer_within_enqueue_timeout_when_redis_does_not(superuser_client, echomq_settings, queue,
                                                                   name, args):
    job_id = failed_job(queue)  # and its row, which the job page falls back on
    args = [job_id if arg == "JOB" else arg for arg in args]
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                              "ENQUEUE_TIMEOUT": 1}
    started = time.monotonic()
    response = superuser_client.post(reverse(name, args=args), {"post": "yes"}, follow=True)
    took_s = time.monotonic() - started
    assert response.status_code == 200 and "Redis did not answer" in response.content.decode()
    assert took_s < 2, f"a web request waited {took_s:.1f} s for Redis"


def test_a_job_page_shows_data_that_is_not_valid_utf_8(superuser_client, queue):
    job_id = failed_job(queue)
    queue.client.hset(queue.keys.job(job_id), "data", '{"k": "\\ud800"}')  # valid JSON, a lone surrogate
    response = superuser_client.get(job_page(job_id))
    assert response.status_code == 200 and "\\ud800" in response.content.decode()


@pytest.mark.parametrize("page", ["dashboard", "failed", "stalled"])
def test_a_page_waits_for_an_absent_redis_once_not_once_per_queue(superuser_client, echomq_settings, page):
    server = RedisServer()
    server.start()
    # ENQUEUE_TIMEOUT 2: once is 2 s, once per queue 8 s, and 5 s between leaves a slow machine room.
    echomq_settings.ECHOMQ = {"REDIS_URL": server.url, "PREFIX": "p", "ENQUEUE_TIMEOUT": 2,
                              "QUEUES": {name: {} for name in ("a", "b", "c", "d")}}
    superuser_client.get(URLS[page]())  # connected, so the freeze hits calls, not connects
    server.process.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        response = superuser_client.get(URLS[page]())
        took_s = time.monotonic() - started
    finally:
        server.process.send_signal(signal.SIGCONT)
        server.stop()
        server.workdir.cleanup()
    assert response.status_code == 200 and "Redis did not answer" in response.content.decode()
    assert took_s < 5, f"{took_s:.1f} s for four queues with ENQUEUE_TIMEOUT 2"


def test_a_job_page_says_when_redis_could_not_be_read_rather_than_that_it_lost_the_job(
        superuser_client, echomq_settings, queue):
    job_id = failed_job(queue)
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                              "ENQUEUE_TIMEOUT": 1}
    page = superuser_client.get(job_page(job_id)).content.decode()
    assert "Redis could not be read (Redis did not answer" in page and "no longer has" not in page
    assert "boom" in page, "the copy is shown"
