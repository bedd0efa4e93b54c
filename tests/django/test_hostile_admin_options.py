"""Hostile: the admin's job pages and lists render jobs that carry issue 28's fields (ddk, exp, rexp, Retry errc)."""

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from echomq_django.core import Dedupe, JobOptions, now_ms
from echomq_django.mirror import sync_queue
from tests.helpers import finish_attempt, take_jobs

pytestmark = pytest.mark.django_db
SCRIPT = "<script>alert(1)</script>"


@pytest.fixture
def root(echomq_settings) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def ok(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, response.content.decode()[:2000]
    page = response.content.decode()
    assert SCRIPT not in page
    return page


def test_job_pages_and_lists_render_jobs_with_dedupe_expiry_result_ttl_and_retry(root, queue):
    now = now_ms()
    waiting = queue.add("x", opts=JobOptions(expires_ms=60_000, result_ttl_ms=5_000), dedupe=Dedupe(SCRIPT))
    delayed = queue.add("x", {"v": SCRIPT}, dedupe=Dedupe("d" + SCRIPT, debounce_ms=60_000))
    done = queue.add("x", opts=JobOptions(result_ttl_ms=60_000), dedupe=Dedupe("t", ttl_ms=60_000))
    retried = queue.add("x", opts=JobOptions(attempts=2), job_id="retried")
    expired = queue.add("x", opts=JobOptions(expires_ms=1000), timestamp_ms=now - 10_000, job_id="expired")
    [(first, _)] = take_jobs(queue, "t1", 30_000, now, 1, "w")[1]
    assert first == waiting
    finish_attempt(queue, waiting, "t1", now, completed=True, value='"' + SCRIPT.replace('"', '\\"') + '"',
                   default_attempts=3)
    taken = dict(take_jobs(queue, "t2", 30_000, now, 3, "w")[1])  # and the expired one fails
    assert set(taken) == {done, retried}
    finish_attempt(queue, done, "t2", now, completed=True, value="1", default_attempts=3)
    finish_attempt(queue, retried, "t2", now, completed=False, value="Retry: retry requested: " + SCRIPT,
                   backoff_ms=60_000, error_class="echomq_django.core.errors.Retry", default_attempts=3)
    assert queue.get_job(expired).failed_reason == "expired"
    sync_queue(queue)
    for job_id in (waiting, delayed, done, retried, expired):
        ok(root, reverse("admin:echomq_job_detail", args=["q", job_id]))
    for state in ("completed", "delayed", "failed"):
        ok(root, reverse("admin:echomq_job_browse", args=["q", state]))
    ok(root, reverse("admin:echomq_failedjob_job", args=["q", expired]))
    assert expired in ok(root, reverse("admin:echomq_failedjob_changelist") + "?why=expired")
