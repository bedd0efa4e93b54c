"""The admin's bulk actions on more jobs than a request changes: run by the queue's workers, with a page of their own
(admin/bulk_runs.py, bulk_steps.py, core/reading/bulk_runs.py)."""

import re

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from echomq_django.admin.bulk_runs import BACKGROUND_ABOVE
from echomq_django.core import Worker, WorkerOptions
from echomq_django.core.reading.bulk_runs import STEP_JOBS
from echomq_django.jobs import run_job
from echomq_django.models import FailedJob
from tests.django.test_admin_bulk import audit_lines, client_with
from tests.helpers import fail_jobs, running, wait_until

pytestmark = pytest.mark.django_db(transaction=True)  # the worker's threads write the audit line on their connection
JOBS = BACKGROUND_ABOVE + 1  # more than a request changes: two steps of a run (STEP_JOBS each)
BULK = reverse("admin:echomq_job_bulk", args=["q", "failed"])
RETRY_ALL = {"action": "retry", "scope": "all", "post": "yes"}


@pytest.fixture
def root(echomq_settings) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def worker_of(queue) -> Worker:
    return Worker(queue.name, run_job, queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.2))


def test_a_large_action_with_no_worker_for_its_queue_changes_nothing_and_says_why(root, queue):
    fail_jobs(queue, JOBS)
    page = root.post(BULK, RETRY_ALL, follow=True).content.decode()
    assert "no live worker serves it. Start one (manage.py echomq_worker q)" in page
    assert queue.counts()["failed"] == JOBS and queue.counts()["wait"] == 0
    assert not queue.client.keys(queue.keys.bulk_run("*")) and not LogEntry.objects.exists()


def test_a_large_retry_runs_as_jobs_of_the_queue_its_page_shows_progress_and_the_audit_line_the_counts(root, queue):
    assert JOBS > STEP_JOBS
    ids = fail_jobs(queue, JOBS)
    queue.pause()  # a live worker that takes nothing yet: the request's own part can be looked at
    with running(worker_of(queue)):
        assert wait_until(lambda: queue.workers(), 10)
        response = root.post(BULK, RETRY_ALL)
        assert response.status_code == 302
        run_page = response["Location"]
        run_id = re.fullmatch(r"/admin/echomq/job/q/bulk-run/([0-9a-f]+)/", run_page).group(1)
        assert queue.counts()["failed"] == JOBS, "the request changed jobs itself"
        page = root.get(run_page).content.decode()
        assert "Queue q is paused" in page and "Waiting for its first step" in page
        queue.resume()
        assert wait_until(lambda: "Done:" in root.get(run_page).content.decode(), 120), root.get(run_page).content
        # The worker runs the retried jobs too (no function of theirs is registered: each fails at once).
        assert wait_until(lambda: queue.counts()["failed"] == JOBS and not queue.counts()["wait"], 120)
    page = root.get(run_page).content.decode()
    assert f"Done: {JOBS:,} job(s) sent back to wait, of {JOBS:,} asked for in queue q." in page
    pipe = queue.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(queue.keys.job(job_id), "atm")
    assert set(pipe.execute()) == {"2"}, "each job retried once: one more attempt made, not two"
    steps = [job_id for job_id in queue.client.zrange(queue.keys.completed, 0, -1) if job_id.startswith("bulk-run-")]
    assert sorted(steps) == sorted([f"bulk-run-{run_id}-0", f"bulk-run-{run_id}-{STEP_JOBS}"])
    [line] = audit_lines(FailedJob)
    assert (line.user.username, line.action_flag, line.object_repr) == ("root", CHANGE, "queue q, failed: every job")
    assert line.change_message == f"Retry: {JOBS:,} job(s) sent back to wait, of {JOBS:,} asked for in queue q."


def test_a_runs_page_needs_the_actions_permission(root, queue):
    fail_jobs(queue, JOBS)
    queue.pause()
    with running(worker_of(queue)):
        assert wait_until(lambda: queue.workers(), 10)
        run_page = root.post(BULK, RETRY_ALL)["Location"]
    assert client_with("viewer", "view_job").get(run_page).status_code == 403
    assert client_with("retrier", "view_job", "retry_failedjob").get(run_page).status_code == 200
    assert root.get(run_page.replace("/bulk-run/", "/bulk-run/x")).status_code == 404


@pytest.mark.parametrize("broken", ["user gone", "content type broken", "flag broken"])
def test_the_last_step_of_a_run_whose_user_is_gone_ends_without_an_audit_line(queue, broken):
    """The jobs were changed all the same: the step ends (it failed for good on the missing user before)."""
    from django.contrib.contenttypes.models import ContentType

    from echomq_django.bulk_steps import audit_once
    from echomq_django.core.reading.bulk_runs import read_run, run_step, start_run

    user = User.objects.create_user("gone", password="pw")
    fields = {"user_id": str(user.pk), "content_type": str(ContentType.objects.get_for_model(FailedJob).pk),
              "flag": str(CHANGE), "username": "gone"}
    fields.update({"user gone": {}, "content type broken": {"content_type": "x"}, "flag broken": {"flag": ""}}[broken])
    ids = fail_jobs(queue, 3)
    run_id = start_run(queue, "retry", "failed", list(ids), fields)
    if broken == "user gone":
        user.delete()
    run = run_step(queue, run_id)
    assert run.finished and queue.counts()["wait"] == 3
    audit_once(queue, read_run(queue, run_id))
    assert not LogEntry.objects.exists()
