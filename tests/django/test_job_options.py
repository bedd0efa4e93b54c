"""The task options a Celery user reaches for on @job: priority, eta (issue 28)."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from echomq_django import jobs
from echomq_django.core import PayloadError, Queue, now_ms

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(settings, redis_url, prefix, redis_client, monkeypatch) -> Queue:
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}}}
    monkeypatch.setattr(jobs, "_registry", dict(jobs.registered_jobs()))
    return Queue("default", redis_client, prefix=prefix)


def test_priority_on_the_job_function_and_on_each_enqueue(queue):
    urgent = jobs.job(name="opts.urgent", priority=5)(lambda: None)
    first, second, third = urgent.enqueue(), urgent.enqueue_with(priority=-3), urgent.enqueue_with(priority=0)
    assert queue.get_job(first).opts.priority == 5 and queue.get_state(first) == "prioritized"
    assert queue.get_job(second).opts.priority == -3 and queue.get_state(third) == "wait"
    with pytest.raises(PayloadError, match="priority"):
        jobs.job(name="opts.loud", priority=101)(lambda: None)
    with pytest.raises(PayloadError, match="priority"):
        urgent.enqueue_with(priority=True and 1000)
    with pytest.raises(PayloadError, match="group cannot have a priority"):
        urgent.enqueue_with(group="tenant-a")
    assert queue.counts()["prioritized"] == 2 and queue.counts()["wait"] == 1, "the refused ones added nothing"


def test_eta_runs_at_a_time(queue):
    later = jobs.job(name="opts.later")(lambda: None)
    at = timezone.now() + timedelta(minutes=1)
    job_id = later.enqueue_with(eta=at)
    due = queue.client.zscore(queue.keys.delayed, job_id)
    assert queue.get_state(job_id) == "delayed" and abs(due - at.timestamp() * 1000) < 2
    assert queue.get_state(later.enqueue_with(eta=timezone.now() - timedelta(hours=1))) == "wait", "past: now"
    with pytest.raises(PayloadError, match="time zone"):
        later.enqueue_with(eta=datetime.now() + timedelta(minutes=1))  # naive, with USE_TZ
    with pytest.raises(PayloadError, match="delay_ms or eta"):
        later.enqueue_with(eta=at, delay_ms=1000)
    with pytest.raises(PayloadError, match="delay"):
        later.enqueue_with(eta=at + timedelta(days=365 * 11))
    assert queue.counts()["delayed"] == 1 and queue.counts()["wait"] == 1


def test_a_naive_eta_means_time_zone_without_use_tz(queue, settings):
    settings.USE_TZ, settings.TIME_ZONE = False, "America/New_York"
    later = jobs.job(name="opts.later")(lambda: None)
    at = datetime.now() + timedelta(minutes=5)  # naive: New York's wall clock, as Django reads it
    job_id = later.enqueue_with(eta=at)
    expected = timezone.make_aware(at).timestamp() * 1000
    assert abs(queue.client.zscore(queue.keys.delayed, job_id) - expected) < 2
    assert queue.client.zscore(queue.keys.delayed, job_id) > now_ms()
