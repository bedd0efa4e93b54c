"""Durable steps on both pools, with the core worker: on the processes pool the child's steps reach Redis through
its worker, and an error the worker meets reaches the job."""

import pytest

from echomq_django.core import JobOptions, Retention, Worker, WorkerOptions
from tests import pool_jobs
from tests.helpers import running, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_steps_replay_sleep_and_a_signal_on_each_pool(queue, redis_url, pool):
    key = f"{queue.keys.prefix}:runs"
    job_id = queue.add("durable", {"url": redis_url, "key": key}, opts=JobOptions(attempts=3))
    worker = Worker(queue.name, pool_jobs.by_name, queue.client, WorkerOptions(
        prefix=queue.keys.prefix, pool=pool, concurrency=1, block_timeout_s=0.2, keep_completed=Retention()))
    with running(worker):
        assert wait_until(lambda: queue.get_state(job_id) == "parked", 60), queue.get_state(job_id)
        assert queue.signal(job_id, "go", {"ok": 1}) is True
        assert wait_until(lambda: queue.get_state(job_id) == "completed", 60), queue.get_state(job_id)
    job = queue.get_job(job_id)
    assert job.returnvalue["payload"] == {"ok": 1} and job.returnvalue["second"] == [job.returnvalue["first"]]
    assert job.attempts_made == 2, "one failed attempt; the sleep and the wait used none"
    assert queue.client.lrange(key, 0, -1) == [f"{job_id}:first", f"{job_id}:second"], "each step ran once"
    steps = queue.client.hgetall(queue.keys.steps(job_id))
    assert sorted(steps) == ["first", "go", "nap", "second"]
    queue.client.delete(key)
