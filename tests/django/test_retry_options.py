"""Retry control from inside a job, and Celery's autoretry_for / retry_backoff / max_retries (issue 28, item 4)."""

import pytest
from django.core.management import call_command

from echomq_django import jobs
from echomq_django.core import Backoff, PayloadError, Queue, Retry, now_ms
from echomq_django.jobs import current_job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(settings, redis_url, prefix, redis_client, monkeypatch) -> Queue:
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {"ATTEMPTS": 5}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    return Queue("default", redis_client, prefix=prefix)


def work() -> None:
    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0")


def test_raise_retry_waits_its_countdown_and_runs_again(queue):
    def poll():
        job = current_job()
        if job.attempts_made == 0:
            raise Retry(countdown=30, reason="not ready")
        return "done"

    job_id = jobs.job(name="retry.poll")(poll).enqueue()
    before = now_ms()
    work()
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "delayed" and job.attempts_made == 1
    assert job.failed_reason == "Retry: retry requested: not ready (in 30 s)"
    assert job.error_classes == ["echomq_django.core.errors.Retry"]
    due = queue.client.zscore(queue.keys.delayed, job_id)
    assert 30_000 <= due - before < 31_000 + (now_ms() - before)
    queue.promote(job_id)
    work()
    assert queue.get_state(job_id) == "completed" and queue.get_job(job_id).returnvalue == "done"


def test_current_job_retry_counts_attempts_and_fails_when_none_are_left(queue):
    def always():
        current_job().retry(countdown=0, reason="again")

    job_id = jobs.job(name="retry.always", attempts=2)(always).enqueue()
    work()
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "failed" and job.attempts_made == 2
    assert "again" in job.failed_reason
    with pytest.raises(ValueError, match="countdown"):
        Retry(countdown=-1)


def test_autoretry_for_retries_only_those_with_the_backoff_and_max_retries(queue):
    calls = {"flaky": 0, "broken": 0}

    def flaky():
        calls["flaky"] += 1
        raise ConnectionError("reset")

    def broken():
        calls["broken"] += 1
        raise KeyError("missing")

    options = {"autoretry_for": (ConnectionError,), "retry_backoff": True, "max_retries": 2}
    flaky_id = jobs.job(name="retry.flaky", **options)(flaky).enqueue()
    broken_id = jobs.job(name="retry.broken", **options)(broken).enqueue()
    assert queue.get_job(flaky_id).opts.attempts == 3
    assert queue.get_job(flaky_id).opts.backoff == Backoff("exponential", 1000)
    work()
    assert queue.get_state(broken_id) == "failed" and calls["broken"] == 1, "not in autoretry_for: for good"
    assert queue.get_state(flaky_id) == "delayed" and calls["flaky"] == 1
    for expected_attempts in (2, 3):
        queue.promote(flaky_id)
        work()
        assert calls["flaky"] == expected_attempts
    assert queue.get_state(flaky_id) == "failed" and queue.get_job(flaky_id).attempts_made == 3


def test_celery_names_for_attempts_and_backoff_are_checked(queue):
    assert jobs.job(name="retry.a", retry_backoff=2)(print).backoff == Backoff("exponential", 2000)
    assert jobs.job(name="retry.b", retry_backoff=Backoff("fixed", 500))(print).backoff == Backoff("fixed", 500)
    assert jobs.job(name="retry.c", max_retries=0)(print).attempts == 1
    with pytest.raises(PayloadError, match="attempts or max_retries"):
        jobs.job(name="retry.d", attempts=3, max_retries=2)(print)
    with pytest.raises(PayloadError, match="backoff or retry_backoff"):
        jobs.job(name="retry.e", backoff=Backoff(), retry_backoff=True)(print)
    with pytest.raises(PayloadError, match="retry_backoff is"):
        jobs.job(name="retry.f", retry_backoff=-1)(print)
    with pytest.raises(PayloadError, match="max_retries is"):
        jobs.job(name="retry.g", max_retries=-1)(print)
    with pytest.raises(PayloadError, match="autoretry_for is"):
        jobs.job(name="retry.h", autoretry_for=("ConnectionError",))(print)
