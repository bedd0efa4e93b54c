"""The admin's bulk actions: the browser's lists and the failed and stalled lists, their confirmation pages,
permissions, CSRF, filters and audit lines."""

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import reverse

from echomq_django.core import JobOptions, state_ids
from echomq_django.mirror import sync_queue
from echomq_django.models import FailedJob, StalledJob
from echomq_django.models import Job as JobModel
from tests.helpers import fail_jobs, fetch, kill_lock, sweep

pytestmark = pytest.mark.django_db
SCRIPT = "<script>alert(1)</script>"
SCRIPT_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def client_with(username: str, *codenames: str, enforce_csrf_checks: bool = False) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set([Permission.objects.get(codename=codename, content_type__app_label="echomq")
                               for codename in codenames])
    client = Client(enforce_csrf_checks=enforce_csrf_checks)
    client.force_login(user)
    return client


@pytest.fixture
def root(echomq_settings) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def bulk_url(state: str, queue_name: str = "q") -> str:
    return reverse("admin:echomq_job_bulk", args=[queue_name, state])


def browse_url(state: str) -> str:
    return reverse("admin:echomq_job_browse", args=["q", state])


FAILED_LIST = reverse("admin:echomq_failedjob_changelist")
STALLED_LIST = reverse("admin:echomq_stalledjob_changelist")


def audit_lines(model) -> list[LogEntry]:
    kind = ContentType.objects.get_for_model(model, for_concrete_model=False)
    return list(LogEntry.objects.filter(content_type=kind).order_by("pk"))


# -- the job browser's lists --------------------------------------------------------------------------

def test_a_list_offers_the_actions_of_its_state_and_the_users_permissions(echomq_settings, queue):
    fail_jobs(queue, 2)
    queue.add("later", opts=JobOptions(delay_ms=60_000))
    retrier = client_with("retrier", "view_job", "retry_failedjob")
    page = retrier.get(browse_url("failed")).content.decode()
    assert f'action="{bulk_url("failed")}"' in page and '<option value="retry">' in page
    assert '<option value="delete">' not in page and "all 2 job(s) in failed" in page
    assert bulk_url("delayed") not in retrier.get(browse_url("delayed")).content.decode(), "no action it may run"
    viewer = client_with("viewer", "view_job")
    assert "echomq-bulk" not in viewer.get(browse_url("failed")).content.decode()


def test_retry_of_ticked_jobs_acts_at_once_on_those_alone(echomq_settings, queue):
    ids = fail_jobs(queue, 5)
    sync_queue(queue)
    retrier = client_with("retrier", "view_job", "retry_failedjob")
    response = retrier.post(bulk_url("failed"), {"action": "retry", "scope": "ticked", "ids": ids[:2],
                                                 "page_ids": ids}, follow=True)
    assert "2 job(s) sent back to wait, of 2 asked for in queue q" in response.content.decode()
    assert sorted(queue.client.lrange(queue.keys.wait, 0, -1)) == sorted(ids[:2])
    assert set(FailedJob.objects.values_list("job_id", flat=True)) == set(ids[2:]), "their rows went"
    [line] = audit_lines(JobModel)
    assert line.action_flag == CHANGE and "Retry: 2 job(s) sent back to wait" in line.change_message
    assert line.object_repr == "queue q, failed: the ticked jobs" and line.user.username == "retrier"


def test_the_page_scope_acts_on_the_page_shown_and_all_on_every_job_after_a_count(echomq_settings, queue):
    ids = fail_jobs(queue, 65)  # 50 a page
    retrier = client_with("retrier", "view_job", "retry_failedjob")
    shown = retrier.get(browse_url("failed")).content.decode()
    page_ids = [job_id for job_id in ids if f'name="page_ids" value="{job_id}"' in shown]
    assert len(page_ids) == 50
    retrier.post(bulk_url("failed"), {"action": "retry", "scope": "page", "page_ids": page_ids})
    assert queue.client.llen(queue.keys.wait) == 50 and queue.client.zcard(queue.keys.failed) == 15

    asked = retrier.post(bulk_url("failed"), {"action": "retry", "scope": "all"})
    page = asked.content.decode()
    assert asked.status_code == 200 and "Retry 15 failed job(s) of queue q?" in page
    assert 'name="scope" value="all"' in page and 'name="post" value="yes"' in page
    assert queue.client.zcard(queue.keys.failed) == 15, "the question changes nothing"
    retrier.post(bulk_url("failed"), {"action": "retry", "scope": "all", "post": "yes"})
    assert queue.client.zcard(queue.keys.failed) == 0
    wait = queue.client.lrange(queue.keys.wait, 0, -1)
    assert len(wait) == 65 and len(set(wait)) == 65
    assert [line.object_repr for line in audit_lines(JobModel)] == ["queue q, failed: the page's jobs",
                                                                    "queue q, failed: every job"]


def test_cancel_and_delete_ask_first_and_say_how_many(echomq_settings, queue):
    waiting = [queue.add("work", {"n": n}) for n in range(3)]
    delayed = [queue.add("later", {"n": n}, opts=JobOptions(delay_ms=60_000)) for n in range(4)]
    operator = client_with("operator", "view_job", "cancel_job", "delete_job")
    page = operator.post(bulk_url("wait"), {"action": "cancel", "scope": "ticked", "ids": waiting[:2]})
    assert "Cancel 2 wait job(s) of queue q?" in page.content.decode()
    assert queue.client.llen(queue.keys.wait) == 3
    response = operator.post(bulk_url("wait"), {"action": "cancel", "scope": "ticked", "ids": waiting[:2],
                                                "post": "yes"}, follow=True)
    assert "2 job(s) cancelled" in response.content.decode()
    assert [queue.get_state(job_id) for job_id in waiting] == ["failed", "failed", "wait"]
    assert queue.get_job(waiting[0]).failed_reason == "cancelled: in the admin by operator"

    assert "Delete 4 delayed job(s)" in operator.post(bulk_url("delayed"), {"action": "delete",
                                                                             "scope": "all"}).content.decode()
    operator.post(bulk_url("delayed"), {"action": "delete", "scope": "all", "post": "yes"})
    assert queue.client.zcard(queue.keys.delayed) == 0 and all(queue.get_job(i) is None for i in delayed)
    flags = [line.action_flag for line in audit_lines(JobModel)]
    assert flags == [CHANGE, DELETION]


@pytest.mark.parametrize(("action", "state", "codename"), [("retry", "failed", "retry_failedjob"),
                                                           ("cancel", "wait", "cancel_job"),
                                                           ("delete", "wait", "delete_job")])
def test_each_action_needs_its_permission(echomq_settings, queue, action, state, codename):
    failed, waiting = fail_jobs(queue, 1), queue.add("work")
    others = [c for c in ("retry_failedjob", "cancel_job", "delete_job", "view_job") if c != codename]
    client = client_with("someone", *others)
    for scope in ("ticked", "all"):
        for extra in ({}, {"post": "yes"}):
            response = client.post(bulk_url(state), {"action": action, "scope": scope,
                                                     "ids": failed + [waiting], **extra})
            assert response.status_code == 403
    assert queue.get_state(failed[0]) == "failed" and queue.get_state(waiting) == "wait"
    assert not LogEntry.objects.exists()


def test_get_changes_nothing_and_csrf_is_enforced(echomq_settings, queue):
    ids = fail_jobs(queue, 3)
    root_user = User.objects.create_superuser("root", password="pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(root_user)
    assert client.get(bulk_url("failed"), {"action": "retry", "scope": "all", "post": "yes"}).status_code == 405
    forged = client.post(bulk_url("failed"), {"action": "retry", "scope": "all", "post": "yes"})
    assert forged.status_code == 403 and queue.client.zcard(queue.keys.failed) == 3
    # The confirmation page's own form carries the token, and then it goes through.
    page = client.post(bulk_url("failed"), {"action": "retry", "scope": "all",
                                            "csrfmiddlewaretoken": token_of(client, browse_url("failed"))})
    assert page.status_code == 200 and 'name="csrfmiddlewaretoken"' in page.content.decode()
    client.post(bulk_url("failed"), {"action": "retry", "scope": "all", "post": "yes",
                                     "csrfmiddlewaretoken": token_of(client, browse_url("failed"))})
    assert sorted(queue.client.lrange(queue.keys.wait, 0, -1)) == sorted(ids)


def token_of(client: Client, url: str) -> str:
    import re

    page = client.get(url).content.decode()
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)


@pytest.mark.parametrize("data", [
    {"action": "promote", "scope": "all"},  # no bulk action
    {"action": "retry", "scope": "everything"},
    {"action": "retry", "scope": "ticked", "ids": ["../x"]},
    {"action": "retry", "scope": "ticked", "ids": [f"id{n}" for n in range(501)]},
])
def test_a_form_no_list_sends_is_404(root, queue, data):
    fail_jobs(queue, 1)
    assert root.post(bulk_url("failed"), data).status_code == 404
    assert root.post(bulk_url("failed", "nope"), {"action": "retry", "scope": "all"}).status_code == 404
    assert root.post(bulk_url("wait"), {"action": "retry", "scope": "all"}).status_code == 404, "not of wait"
    assert queue.client.zcard(queue.keys.failed) == 1


def test_the_confirmation_page_escapes_what_it_lists(root, queue):
    job_id = queue.add(SCRIPT, {"x": SCRIPT})
    page = root.post(bulk_url("wait"), {"action": "delete", "scope": "ticked", "ids": [job_id]}).content.decode()
    assert f"{job_id} ({SCRIPT_ESCAPED})" in page and SCRIPT not in page


def test_a_job_left_alone_is_named_in_the_message(root, queue):
    ids = fail_jobs(queue, 3)
    queue.retry(ids[0])  # someone else retried it meanwhile
    response = root.post(bulk_url("failed"), {"action": "retry", "scope": "ticked", "ids": ids}, follow=True)
    text = response.content.decode()
    assert "2 job(s) sent back to wait, of 3 asked for" in text
    assert f"1 left alone, no longer failed (moved on or removed meanwhile): {ids[0]}" in text
    assert queue.client.lrange(queue.keys.wait, 0, -1).count(ids[0]) == 1


# -- the failed and stalled lists (the mirror) ------------------------------------------------------

def select_across(client: Client, action: str, query: str = "", **extra) -> object:
    return client.post(FAILED_LIST + query, {"action": action, "select_across": "1", "index": "0",
                                             "_selected_action": [FailedJob.objects.first().pk], **extra},
                       follow=True)


def test_failed_list_filters_by_exception_class_and_error_text(root, queue):
    declined = fail_jobs(queue, 3, reason="card declined", error_class="shop.errors.CardDeclined")
    timeouts = fail_jobs(queue, 2, reason="gateway timeout", error_class="builtins.TimeoutError")
    cancelled = fail_jobs(queue, 1, reason="cancelled: by hand")
    sync_queue(queue)
    page = root.get(FAILED_LIST).content.decode()
    assert "By exception class" in page and "shop.errors.CardDeclined" in page and "By error text" in page

    def listed(query: str) -> set[str]:
        page = root.get(FAILED_LIST + query).content.decode()
        return {job_id for job_id in declined + timeouts + cancelled if f">{job_id}</a>" in page}

    assert listed("?error_class=shop.errors.CardDeclined") == set(declined)
    assert listed("?error=TIMEOUT") == set(timeouts)
    assert listed("?error=gateway&error_class=shop.errors.CardDeclined") == set()
    assert listed("?error_class__isnull=True") == set(), "every row has its class read"
    kept = root.get(FAILED_LIST + "?queue=q&error=x").content.decode()
    assert '<input type="hidden" name="queue" value="q">' in kept, "the text filter keeps the others"


def test_rows_copied_before_the_class_column_get_it_at_the_next_sync(queue):
    [job_id] = fail_jobs(queue, 1, error_class="shop.errors.CardDeclined")
    sync_queue(queue)
    FailedJob.objects.update(error_class=None)  # as the migration leaves an old row
    from echomq_django.models import MirrorCursor

    MirrorCursor.objects.update(failed_through_ms=0)
    sync_queue(queue)
    assert FailedJob.objects.get(job_id=job_id).error_class == "shop.errors.CardDeclined"


def test_select_all_retries_every_row_the_filters_match_after_a_count(root, queue):
    declined = fail_jobs(queue, 130, reason="card declined", error_class="shop.errors.CardDeclined")
    other = fail_jobs(queue, 4, reason="gateway timeout", error_class="builtins.TimeoutError")
    sync_queue(queue)
    query = "?error=declined"
    page = select_across(root, "retry_selected", query).content.decode()
    assert "Retry 130 failed job(s), all that the list&#x27;s filters and search match," in page
    assert queue.client.zcard(queue.keys.failed) == 134
    response = select_across(root, "retry_selected", query, post="yes")
    assert "130 job(s) sent back to wait, of 130 asked for in queue q" in response.content.decode()
    assert sorted(queue.client.lrange(queue.keys.wait, 0, -1)) == sorted(declined)
    assert sorted(queue.client.zrange(queue.keys.failed, 0, -1)) == sorted(other)
    assert set(FailedJob.objects.values_list("job_id", flat=True)) == set(other)
    [line] = audit_lines(FailedJob)
    assert line.object_repr == "failed list: every job the list matched (error=declined)"
    assert line.action_flag == CHANGE and "130 job(s) sent back to wait" in line.change_message


def test_search_is_honoured_by_select_all(root, queue):
    fail_jobs(queue, 3, name="charge")
    kept = fail_jobs(queue, 2, name="refund")
    sync_queue(queue)
    select_across(root, "delete_selected", "?q=charge", post="yes")
    assert sorted(queue.client.zrange(queue.keys.failed, 0, -1)) == sorted(kept)


def test_delete_selected_asks_with_the_count_and_logs_one_line(root, queue):
    ids = fail_jobs(queue, 120)
    sync_queue(queue)
    page = select_across(root, "delete_selected").content.decode()
    assert "Delete 120 failed job(s)" in page and queue.client.zcard(queue.keys.failed) == 120
    select_across(root, "delete_selected", post="yes")
    assert queue.client.zcard(queue.keys.failed) == 0 and all(queue.get_job(i) is None for i in ids[:5])
    assert not FailedJob.objects.exists()
    [line] = audit_lines(FailedJob)
    assert line.action_flag == DELETION and "120 job(s) deleted" in line.change_message


def test_deleting_ticked_failed_rows_lists_them_on_the_confirmation_page(root, queue):
    ids = fail_jobs(queue, 3, name=SCRIPT)
    sync_queue(queue)
    ticked = FailedJob.objects.filter(job_id__in=ids[:2])
    page = root.post(FAILED_LIST, {"action": "delete_selected", "index": "0",
                                   "_selected_action": [row.pk for row in ticked]}).content.decode()
    assert "Delete 2 failed job(s)" in page and SCRIPT not in page
    assert all(f"{job_id} ({SCRIPT_ESCAPED}) of queue {queue.name}" in page for job_id in ids[:2])
    assert ids[2] not in page and queue.client.zcard(queue.keys.failed) == 3


def test_list_actions_need_their_permission(echomq_settings, queue):
    fail_jobs(queue, 2)
    sync_queue(queue)
    viewer = client_with("viewer", "view_failedjob")
    for action in ("retry_selected", "delete_selected"):
        for extra in ({}, {"post": "yes"}):
            select_across(viewer, action, **extra)
    assert queue.client.zcard(queue.keys.failed) == 2 and FailedJob.objects.count() == 2
    assert not LogEntry.objects.exists()


def test_stalled_list_cancels_the_selected_jobs(root, queue):
    ids = [queue.add("work", {"n": n}, opts=JobOptions(attempts=3)) for n in range(3)]
    fetch(queue, count=3)
    for job_id in ids:
        kill_lock(queue, job_id)
    sweep(queue)
    sync_queue(queue)
    assert set(state_ids(queue, "stalled")) == set(ids)
    data = {"action": "cancel_selected", "select_across": "1", "index": "0",
            "_selected_action": [StalledJob.objects.first().pk]}
    assert "Cancel 3 stalled job(s)" in root.post(STALLED_LIST, data).content.decode()
    root.post(STALLED_LIST, {**data, "post": "yes"})
    assert all(queue.get_job(job_id).cancel_reason == "cancelled: in the admin by root" for job_id in ids)
    [line] = audit_lines(StalledJob)
    assert ("0 job(s) cancelled (failed, Retry brings them back), of 3 asked for in queue q; "
            "3 running: its worker stops it") in line.change_message


def test_the_dashboards_bulk_buttons_leave_an_audit_line_too(echomq_settings, queue):
    """Retry all failed and Clean are bulk actions as well: each confirmed one is a line of the admin's history."""
    fail_jobs(queue, 3)
    operator = client_with("operator", "view_queue", "retry_failedjob", "delete_failedjob")
    operator.post(reverse("admin:echomq_queue_clean_failed", args=["q"]), {"days": "0"})  # asks first: no change
    assert audit_lines(FailedJob) == []
    operator.post(reverse("admin:echomq_queue_clean_failed", args=["q"]), {"days": "0", "post": "yes"})
    [cleaned] = audit_lines(FailedJob)
    assert cleaned.action_flag == DELETION
    assert "3 failed job(s) of q older than 0 day(s) deleted" in cleaned.change_message
    assert cleaned.user.username == "operator"
    fail_jobs(queue, 2)
    operator.post(reverse("admin:echomq_queue_retry_failed", args=["q"]), {"post": "yes"})
    retried = audit_lines(FailedJob)[-1]
    assert retried.action_flag == CHANGE and "2 failed job(s) of q sent back to wait" in retried.change_message
