"""Flow control in the scripts: a queue's rate limit, its cap on active jobs, and RateLimited from a job.

Each test calls the real scripts on a real Redis: the decisions are made in
moveToActive and moveToFinished, so they hold for any number of workers.
(tests/system/test_flow_processes.py runs them with worker processes.)
"""

import logging

import pytest

from echomq_django.core import JobOptions, NewJob, RateLimit, RateLimited, Worker, WorkerOptions
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.scripts import Finish
from tests.helpers import kill_lock, running, sweep, wait_until


def take(queue, token, count=10, *, rate=None, cap=0, lock_ms=30_000):
    """One fetch with flow control: (wait ms, [job ids])."""
    return take_saying(queue, token, count, rate=rate, cap=cap, lock_ms=lock_ms)[:2]


def take_saying(queue, token, count=10, *, rate=None, cap=0, lock_ms=30_000):
    """One fetch with flow control: (wait ms, [job ids], what it said was broken)."""
    call = queue.scripts.fetch_call(queue.keys, token, lock_ms, now_ms(), count, "w", rate_limit=rate,
                                    max_active=cap)
    [reply] = queue.scripts.run_batch([call], raise_on_error=True)
    _due, wait, jobs = queue.scripts.fetched(reply)
    return wait, [job_id for job_id, _ in jobs], queue.scripts.broken_keys(reply)


def end(queue, job_id, token, *, limited_ms=None, completed=True):
    """One moveToFinished call: a completion, a failure, or with `limited_ms` a RateLimited."""
    finish = Finish(job_id, token, completed and limited_ms is None, "null" if completed else "boom",
                    backoff_ms=limited_ms or 0, rate_limited=limited_ms is not None)
    call = queue.scripts.finish_call(queue.keys, [finish], now_ms(), default_attempts=3)
    [[code]] = queue.scripts.run_batch([call], raise_on_error=True)
    return code


def test_a_rate_limit_starts_no_more_than_its_max_in_a_window_and_says_how_long_to_wait(queue):
    ids = queue.add_bulk([NewJob("work") for _ in range(5)])
    rate = RateLimit(max=2, duration_ms=60_000)
    assert take(queue, "t1", rate=rate) == (0, ids[:2])
    wait, taken = take(queue, "t2", rate=rate)
    assert taken == [] and 59_000 < wait <= 60_001, "the window frees when its oldest start leaves it"
    # Another worker, the same answer: the window is the queue's, in Redis.
    assert take(queue, "t3", count=1, rate=rate)[1] == []
    assert queue.client.zcard(queue.keys.limiter) == 2
    assert 0 < queue.client.pttl(queue.keys.limiter) <= 60_000, "the window's key goes when idle"


def age_the_window(queue, by_ms: int) -> None:
    """Date every start in the rate limit's window `by_ms` earlier: as if that much of Redis's time had passed."""
    starts = queue.client.zrange(queue.keys.limiter, 0, -1, withscores=True)
    assert starts, "the window holds starts"
    queue.client.zadd(queue.keys.limiter, {member: score - by_ms for member, score in starts}, xx=True)


def test_the_window_slides_a_start_leaves_it_one_duration_later(queue):
    # A 30 s window whose time is passed by dating its start back (the limit runs on Redis's clock, which a
    # test cannot pin): no stall of this machine empties it before the takes that must find it full.
    ids = queue.add_bulk([NewJob("work") for _ in range(3)])
    rate = RateLimit(max=1, duration_ms=30_000)
    assert take(queue, "t1", rate=rate)[1] == ids[:1]
    wait, taken = take(queue, "t2", rate=rate)
    assert taken == [] and 20_000 < wait <= 30_001
    age_the_window(queue, 20_000)  # the start is 20 s old: 10 s of its duration left
    wait, taken = take(queue, "t3", rate=rate)
    assert taken == [] and 0 < wait <= 10_001, "the wait is what is left of the oldest start's duration"
    age_the_window(queue, 10_000)  # one duration old
    assert take(queue, "t4", rate=rate)[1] == ids[1:2], "the window never freed"


def test_a_retry_and_a_recovered_job_start_within_the_limit_too(queue):
    job_id = queue.add("work", opts=JobOptions(attempts=3))
    rate = RateLimit(max=2, duration_ms=60_000)
    assert take(queue, "t1", rate=rate)[1] == [job_id]
    assert end(queue, job_id, "t1", completed=False) == 3, "retried at once"
    assert take(queue, "t2", rate=rate)[1] == [job_id], "its second start: the window's second"
    kill_lock(queue, job_id)
    sweep(queue, max_stalled_count=5)
    sweep(queue, max_stalled_count=5)
    assert queue.get_state(job_id) == "wait", "recovered"
    wait, taken = take(queue, "t3", rate=rate)
    assert taken == [] and wait > 0, "a third start would break the limit"


def test_the_cap_takes_only_what_active_has_room_for_and_frees_on_finish_and_recovery(queue):
    ids = queue.add_bulk([NewJob("work") for _ in range(5)])
    assert take(queue, "t1", cap=2) == (0, ids[:2])
    assert take(queue, "t2", cap=2) == (-1, []), "-1: capped, until an active job ends"
    assert end(queue, ids[0], "t1") == 1
    assert take(queue, "t2", cap=2) == (0, ids[2:3])
    kill_lock(queue, ids[1])  # its worker died
    sweep(queue)
    assert take(queue, "t3", cap=2) == (-1, []), "marked, not yet recovered: the slot is still taken"
    sweep(queue)
    assert take(queue, "t3", cap=2)[1] == [ids[3]], "recovered: the dead worker's slot is back"


def test_a_rate_limited_job_goes_back_first_without_an_attempt_and_holds_the_whole_queue(queue):
    ids = queue.add_bulk([NewJob("call-api") for _ in range(3)])
    assert take(queue, "t1", count=1)[1] == ids[:1]
    assert end(queue, ids[0], "t1", limited_ms=60_000) == 6
    attempts_made, attempts_started, token = queue.client.hmget(queue.keys.job(ids[0]), "atm", "ats", "tok")
    assert (attempts_made, attempts_started, token) == ("0", "1", None), "no attempt used, no owner left"
    assert queue.client.lrange(queue.keys.wait, -1, -1) == [ids[0]], "back ahead of the others"
    wait, taken = take(queue, "t2")
    assert taken == [] and 59_000 < wait <= 60_000, "every worker waits out the pause"
    [(_, until)] = [(ms, fields) for ms, fields in limited_events(queue)]
    assert abs(int(until) - int(queue.client.hget(queue.keys.meta, "limitedUntil"))) == 0
    assert end(queue, ids[0], "t1", limited_ms=60_000) == 5, "a re-sent finish changes nothing"
    assert queue.client.llen(queue.keys.wait) == 3


def test_a_shorter_pause_never_cuts_a_longer_one(queue):
    ids = queue.add_bulk([NewJob("call-api") for _ in range(2)])
    take(queue, "t1", count=2)
    end(queue, ids[0], "t1", limited_ms=60_000)
    until = queue.client.hget(queue.keys.meta, "limitedUntil")
    end(queue, ids[1], "t1", limited_ms=10)
    assert queue.client.hget(queue.keys.meta, "limitedUntil") == until


def test_a_cancel_wins_over_rate_limited(queue):
    job_id = queue.add("call-api")
    take(queue, "t1", count=1)
    assert queue.cancel(job_id, "not needed")
    assert end(queue, job_id, "t1", limited_ms=60_000) == 2, "failed for good"
    assert queue.get_state(job_id) == "failed"
    assert not queue.client.hexists(queue.keys.meta, "limitedUntil")


def limited_events(queue):
    return [(int(stream_id.split("-")[0]), fields["until"])
            for stream_id, fields in queue.client.xrange(queue.keys.events) if fields["event"] == "limited"]


def test_a_worker_runs_a_rate_limited_job_again_after_the_pause_without_using_an_attempt(queue):
    runs: list[int] = []

    def handler(job):
        runs.append(now_ms())
        if len(runs) == 1:
            raise RateLimited(retry_after=0.3)
        return {"runs": len(runs)}

    job_id = queue.add("call-api", opts=JobOptions(attempts=1))
    worker = Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=5))
    with running(worker):
        assert wait_until(lambda: queue.get_state(job_id) == "completed", 10), queue.counts()
    job = queue.get_job(job_id)
    assert (job.attempts_made, job.attempts_started) == (1, 2), "one attempt used, with attempts=1"
    assert runs[1] - runs[0] >= 300, "the pause was waited out"
    assert job.returnvalue == {"runs": 2}


@pytest.mark.parametrize("bad", [-1, float("nan"), 86_401])
def test_rate_limited_refuses_a_retry_after_that_is_no_time(bad):
    with pytest.raises(ValueError, match="retry_after"):
        RateLimited(retry_after=bad)


@pytest.mark.parametrize("bad", [(0, 1000), (1, 0), (1.5, 1000), (1, 86_400_001)])
def test_a_rate_limit_is_whole_jobs_per_a_window_of_a_day_at_most(bad):
    with pytest.raises(ValueError, match="rate limit"):
        RateLimit(*bad)


def test_a_worker_refuses_a_negative_cap(queue):
    with pytest.raises(ValueError, match="max_active"):
        Worker(queue.name, lambda job: None, queue.client, WorkerOptions(max_active=-1))


def test_a_job_id_added_again_after_its_job_is_gone_counts_as_a_new_start(queue):
    rate = RateLimit(max=2, duration_ms=60_000)
    for round_ in range(2):
        job_id = queue.add("work", job_id="same-id")
        assert take(queue, f"t{round_}", rate=rate)[1] == [job_id]
        assert end(queue, job_id, f"t{round_}") == 1
        assert queue.remove(job_id)
    queue.add("work", job_id="same-id")
    wait, taken = take(queue, "t2", rate=rate)
    assert taken == [] and wait > 0, "a third start of the id in the window"


def test_rate_limited_survives_pickling_as_a_process_pool_would_send_it():
    import pickle

    again = pickle.loads(pickle.dumps(RateLimited(30, "slow down")))
    assert (again.retry_after, str(again)) == (30, "slow down")


def test_a_rate_limited_job_with_a_priority_goes_back_ahead_of_its_priority(queue):
    first, second = queue.add_bulk([NewJob("call-api", opts=JobOptions(priority=5)) for _ in range(2)])
    assert take(queue, "t1", count=1)[1] == [first]
    assert end(queue, first, "t1", limited_ms=10) == 6
    assert queue.client.zrange(queue.keys.prioritized, 0, -1) == [first, second]


@pytest.mark.parametrize("score", ["an hour ahead", "+inf"])
def test_starts_scored_ahead_of_redis_hold_a_worker_a_window_at_most_reported_once(queue, caplog, score):
    rate = RateLimit(max=1, duration_ms=500)
    foreign = {"another client's": now_ms() + 3_600_000 if score == "an hour ahead" else score}
    queue.client.zadd(queue.keys.limiter, foreign)
    ids = queue.add_bulk([NewJob("work") for _ in range(3)])
    wait, taken, broken = take_saying(queue, "t1", rate=rate)
    assert taken == [] and 0 < wait <= 500, "never a wait longer than the window"
    assert broken == [f"{queue.keys.limiter} holds starts scored after Redis's clock (another client's): they "
                      "count against the rate limit until they are removed"]
    done: list[str] = []
    worker = Worker(queue.name, lambda job: done.append(job.id), queue.client,
                    WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.1, rate_limit=rate))
    with caplog.at_level(logging.ERROR, logger="echomq.worker"), running(worker):
        for _ in range(3):  # three fetches, each seen by the start it drops from the window
            queue.client.zadd(queue.keys.limiter, {"left the window": 1})
            assert wait_until(lambda: queue.client.zscore(queue.keys.limiter, "left the window") is None, 20)
        assert done == []
        queue.client.zrem(queue.keys.limiter, "another client's")
        assert wait_until(lambda: set(ids) <= set(done), 20), "the jobs run once it is gone, the worker not restarted"
    assert len([record for record in caplog.records if "scored after Redis's clock" in record.getMessage()]) == 1


def test_a_limiter_of_another_type_holds_the_queue_a_window_at_a_time_until_it_is_deleted(queue):
    rate = RateLimit(max=5, duration_ms=400)
    queue.client.set(queue.keys.limiter, "another client's")
    ids = queue.add_bulk([NewJob("work") for _ in range(2)])
    assert take_saying(queue, "t1", rate=rate) == (400, [], [
        f"{queue.keys.limiter} holds a string, not a sorted set: no job starts until it is deleted"])
    queue.client.delete(queue.keys.limiter)
    assert take(queue, "t2", rate=rate) == (0, ids)
