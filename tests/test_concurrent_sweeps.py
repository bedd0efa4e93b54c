"""Many sweepers at once: the atomic script recovers each job once with atm +1, and
the seeds' non-atomic loop of round trips, written here only as the contrast, does not."""

import multiprocessing
from collections import Counter

import pytest

from echomq_django.core import Sweeper, connect
from echomq_django.core.keys import QueueKeys

pytestmark = pytest.mark.slow
JOBS = 3000
SWEEPERS = 8


def stage_marked_dead_jobs(queue, count=JOBS):
    """`count` jobs in active, each marked by an earlier sweep, none with a lock."""
    pipe = queue.client.pipeline(transaction=False)
    for n in range(1, count + 1):
        pipe.hset(queue.keys.job(str(n)), mapping={"name": "w", "data": "{}", "opts": '{"attempts": 5}',
                                                   "atm": 0, "stc": 0})
    pipe.lpush(queue.keys.active, *map(str, range(1, count + 1)))
    pipe.sadd(queue.keys.stalled, *map(str, range(1, count + 1)))
    pipe.execute()


def atomic_sweeper(url, prefix, queue_name, barrier, results):
    client = connect(url)
    sweeper = Sweeper(client, [queue_name], prefix=prefix, budget=10)
    barrier.wait()
    report = sweeper.sweep(sweeper.targets[0], force=True)
    results.put(report.recovered)


def non_atomic_sweeper(url, prefix, queue_name, barrier, results):
    """The Go port's StalledChecker shape: every step its own round trip. Never do this."""
    client = connect(url)
    keys = QueueKeys(queue_name, prefix)
    barrier.wait()
    recovered = 0
    for job_id in client.lrange(keys.active, 0, -1):
        if client.exists(keys.lock(job_id)) == 0 and client.sismember(keys.stalled, job_id):
            attempts = int(client.hgetall(keys.job(job_id))["atm"]) + 1
            client.lrem(keys.active, 1, job_id)
            client.lpush(keys.wait, job_id)
            client.hset(keys.job(job_id), "atm", attempts)
            client.srem(keys.stalled, job_id)
            recovered += 1
    results.put(recovered)


def run_concurrently(target, redis_url, queue):
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(SWEEPERS), context.Queue()
    processes = [context.Process(target=target, args=(redis_url, queue.keys.prefix, queue.name, barrier, results))
                 for _ in range(SWEEPERS)]
    for process in processes:
        process.start()
    recoveries = [results.get(timeout=120) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    waiting = Counter(queue.client.lrange(queue.keys.wait, 0, -1))
    pipe = queue.client.pipeline(transaction=False)
    for n in range(1, JOBS + 1):
        pipe.hget(queue.keys.job(str(n)), "atm")
    attempts = [int(value) for value in pipe.execute()]
    return recoveries, waiting, attempts


def test_overlapping_atomic_sweeps_recover_each_job_exactly_once(queue, redis_url):
    stage_marked_dead_jobs(queue)
    recoveries, waiting, attempts = run_concurrently(atomic_sweeper, redis_url, queue)
    assert sum(recoveries) == JOBS
    assert sum(1 for count in recoveries if count) > 1, "the sweeps did not overlap"
    assert len(waiting) == JOBS and set(waiting.values()) == {1}, "each job in wait exactly once"
    assert set(attempts) == {1}, "atm exactly +1 for every job"
    assert queue.counts()["active"] == 0 and queue.stalled_ids() == set()


def test_the_non_atomic_loop_double_recovers_or_loses_attempts(queue, redis_url):
    stage_marked_dead_jobs(queue)
    recoveries, waiting, attempts = run_concurrently(non_atomic_sweeper, redis_url, queue)
    recovered_twice = sum(1 for n in waiting.values() if n > 1)
    lost_updates = sum(recoveries) - sum(attempts)
    print(f"non-atomic: {recovered_twice} jobs recovered twice, {lost_updates} lost atm updates")
    assert recovered_twice > 0 or lost_updates > 0, (
        "the round-trip loop showed no race this time; the contrast needs overlapping sweepers")
