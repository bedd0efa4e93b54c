"""Expiry (issue 28): a job not started by its `exp` never starts; moveToActive fails it "expired"."""

import pytest

from echomq_django.core import JobOptions, NewJob, PayloadError
from echomq_django.core.producing.queue import now_ms
from tests.helpers import fetch, finish, take_jobs


def test_a_waiting_job_past_its_expiry_fails_expired_and_the_next_one_runs(queue):
    stale = queue.add("x", opts=JobOptions(expires_ms=1000), timestamp_ms=now_ms() - 5000)
    fresh = queue.add("x", opts=JobOptions(expires_ms=60_000))
    [(taken, fields)] = fetch(queue)
    assert taken == fresh and fields["exp"] == str(int(queue.client.hget(queue.keys.job(fresh), "timestamp")) + 60_000)
    job = queue.get_job(stale)
    assert queue.get_state(stale) == "failed" and job.failed_reason == "expired" and job.attempts_started == 0
    assert queue.counts()["active"] == 1


def test_a_delayed_job_expires_if_it_is_taken_after_its_expiry(queue):
    job_id = queue.add("x", opts=JobOptions(delay_ms=1000, expires_ms=2000), timestamp_ms=now_ms() - 10_000)
    _due, jobs = take_jobs(queue, "t", 30_000, now_ms(), 5, "w")  # promoted as due, then found expired
    assert jobs == [] and queue.get_job(job_id).failed_reason == "expired"


def test_a_retry_past_the_expiry_does_not_start(queue):
    job_id = queue.add("x", opts=JobOptions(attempts=3, expires_ms=3_000))
    [(taken, _)] = fetch(queue)
    finish(queue, taken, "token-1", completed=False, value="boom")  # retried at once: back in wait
    _due, jobs = take_jobs(queue, "t2", 30_000, now_ms() + 5_000, 1, "w")  # taken after the expiry
    assert jobs == [] and queue.get_job(job_id).failed_reason == "expired"
    assert queue.get_job(job_id).attempts_started == 1


def test_an_expiry_not_after_the_delay_or_out_of_range_is_refused(queue):
    with pytest.raises(PayloadError, match="before it is due"):
        queue.add("x", opts=JobOptions(delay_ms=5000, expires_ms=5000))
    with pytest.raises(PayloadError, match="expiry"):
        JobOptions(expires_ms=-1)
    with pytest.raises(PayloadError, match="expiry"):
        queue.add_bulk([NewJob("x", opts=JobOptions(expires_ms=10**18))])
    assert sum(queue.counts().values()) == 0


def test_jobs_without_an_expiry_have_no_exp_field(queue):
    job_id = queue.add("x")
    assert queue.client.hget(queue.keys.job(job_id), "exp") is None
