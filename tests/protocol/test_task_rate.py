"""A task's own rate limit (taskRate) and the end it gives a job too soon (moveToFinished's "postponed"), and
Celery's revoke without terminate (cancelJob's "leave")."""

import threading

from echomq_django.core import Backoff, Cancel, JobOptions
from echomq_django.core.producing.queue import now_ms
from tests.helpers import fetch, finish_attempt


def test_starts_are_spaced_evenly_and_a_held_start_is_kept(queue):
    waits = [queue.task_rate_wait("t.send", 10, 1000, f"job-{n}") for n in range(4)]
    assert waits[0] == 0
    # 10 a second: one start per 100 ms, each later job holding the next free one.
    assert [round(wait / 100) for wait in waits[1:]] == [1, 2, 3]
    # Asked again, a job that holds a start gets the same one (its own, not a new one further on).
    again = queue.task_rate_wait("t.send", 10, 1000, "job-3")
    assert 0 < again <= waits[3]
    assert queue.task_rate_wait("t.other", 10, 1000, "job-9") == 0, "each task has its own limit"
    assert queue.client.pttl(queue.keys.task_rate("t.send")) > 0, "the record expires once idle"


def test_many_threads_asking_at_once_each_get_their_own_start(queue):
    waits: dict[str, int] = {}
    barrier = threading.Barrier(8)

    def ask(number: int) -> None:
        barrier.wait()
        for n in range(5):
            job_id = f"job-{number}-{n}"
            waits[job_id] = queue.task_rate_wait("t.burst", 100, 1000, job_id)

    threads = [threading.Thread(target=ask, args=(number,)) for number in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(1 for wait in waits.values() if wait == 0) == 1, "one start now; each other one 10 ms after the last"
    held = queue.client.hgetall(queue.keys.task_rate("t.burst"))
    starts = sorted(float(value) for key, value in held.items() if key.startswith("r:"))
    assert len(starts) == 39 and len(set(starts)) == 39
    assert all(later - earlier >= 9.99 for earlier, later in zip(starts, starts[1:]))


def test_a_postponed_attempt_goes_to_delayed_without_using_an_attempt(queue):
    job_id = queue.add("t.send", opts=JobOptions(attempts=1))
    [(taken, _)] = fetch(queue)
    now = now_ms()
    code = finish_attempt(queue, taken, "token-1", now, completed=False, value="postponed", default_attempts=1,
                          backoff_ms=5000, postponed=True)
    assert code == 7
    assert queue.get_state(job_id) == "delayed"
    assert queue.client.zscore(queue.keys.delayed, job_id) == now + 5000
    job = queue.get_job(job_id)
    assert job.attempts_made == 0 and job.failed_reason is None, "no attempt used: its one attempt is still to come"
    assert queue.counts()["active"] == 0


def test_a_cancelled_job_is_not_postponed(queue):
    job_id = queue.add("t.send")
    [(taken, _)] = fetch(queue)
    assert queue.cancel(job_id) == Cancel.STOPPING
    code = finish_attempt(queue, taken, "token-1", now_ms(), completed=False, value="postponed",
                          default_attempts=3, backoff_ms=5000, postponed=True)
    assert code == 2 and queue.get_state(job_id) == "failed"


def test_revoke_without_terminate_leaves_a_running_job_and_cancels_a_waiting_one(queue):
    running = queue.add("t.send")
    waiting = queue.add("t.send")
    fetch(queue)
    assert queue.cancel(running, stop_running=False) == Cancel.RUNNING
    assert queue.get_job(running).cancel_reason is None, "not flagged: it runs on to its end"
    assert queue.cancel(waiting, stop_running=False) == Cancel.CANCELLED
    assert queue.get_state(waiting) == "failed"


def test_jitter_and_max_bound_the_backoff():
    backoff = Backoff("exponential", 1000, max_ms=5000, jitter=True)
    draws = [backoff.delay_before(10) for _ in range(2000)]
    assert 0 <= min(draws) < 500 and 4500 < max(draws) <= 5000
    assert Backoff("exponential", 1000, max_ms=5000).delay_before(10) == 5000
    assert Backoff.from_json(backoff.to_json()) == backoff
    assert Backoff("fixed", 10).to_json() == {"type": "fixed", "delay": 10}, "old shape kept without the new fields"


def test_a_corrupt_rate_record_counts_as_none(queue):
    """(Found by a hostile run: nan left the record without a TTL, and every start raised.)"""
    key = queue.keys.task_rate("t.corrupt")
    queue.client.hset(key, mapping={"tat": "nan", "r:job-1": "1e300"})
    assert queue.task_rate_wait("t.corrupt", 10, 1000, "job-1") == 0
    assert queue.client.pttl(key) > 0
    assert 0 < queue.task_rate_wait("t.corrupt", 10, 1000, "job-2") <= 100
