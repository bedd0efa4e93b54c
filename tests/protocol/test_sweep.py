"""The two-phase sweep, step by step as the seeds describe it, through the real script."""

import time

import pytest

from echomq_django.core import JobOptions, NewJob, QueueStateError, Sweeper, connect
from tests.conftest import current_redis_url
from tests.helpers import fetch, finish, kill_lock, redis_now_ms, renew_lock, sweep, wait_until


def stalled_job(queue, attempts=3, **add):
    """Add a job, fetch it, and let its worker 'die' (lock gone)."""
    job_id = queue.add("work", {"x": 1}, opts=JobOptions(attempts=attempts), **add)
    [(fetched, _)] = fetch(queue)
    assert fetched == job_id
    kill_lock(queue, job_id)
    return job_id


def test_first_sweep_marks_and_second_recovers_with_one_attempt(queue):
    job_id = stalled_job(queue)

    first = sweep(queue)
    assert (first.marked, first.recovered) == (1, 0)
    assert queue.stalled_ids() == {job_id}
    assert queue.get_state(job_id) == "active", "the first sweep must not reclaim"
    assert queue.get_job(job_id).attempts_made == 0

    second = sweep(queue)
    assert (second.marked, second.recovered, second.failed) == (0, 1, 0)
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "wait"
    assert (job.attempts_made, job.stall_count) == (1, 1)
    assert job.token is None
    assert queue.stalled_ids() == set()
    assert queue.counts()["active"] == 0


def test_gate_lets_one_sweep_per_interval(queue):
    # A 30 s interval: however slow this machine, the gate is still closed for the second sweep.
    stalled_job(queue)
    first = sweep(queue, force=False, interval_ms=30_000)
    assert not first.skipped and first.marked == 1
    again = sweep(queue, force=False, interval_ms=30_000)
    assert again.skipped, "the gate must hold a second sweep within the interval"
    assert queue.get_state(queue.get_jobs("active")[0].id) == "active"
    assert 20_000 < queue.client.pttl(queue.keys.stalled_check) <= 30_000, "the gate lasts the interval"

    forced = sweep(queue, force=True, interval_ms=30_000)
    assert not forced.skipped and forced.recovered == 1, "a forced sweep skips the gate"

    # The interval passes (brought forward: the gate is made to lapse now), and the next sweep runs.
    queue.client.pexpire(queue.keys.stalled_check, 1)
    assert wait_until(lambda: not queue.client.exists(queue.keys.stalled_check), 30)
    assert not sweep(queue, force=False, interval_ms=30_000).skipped


def test_job_whose_worker_renews_before_the_next_sweep_is_left_alone(queue):
    job_id = stalled_job(queue)
    assert sweep(queue).marked == 1

    # The paused worker wakes up and renews: it takes its lapsed lock back.
    assert renew_lock(queue, job_id, "token-1", 30_000)
    assert queue.stalled_ids() == set(), "renewing clears the mark"

    report = sweep(queue)
    assert (report.marked, report.recovered, report.failed) == (0, 0, 0)
    assert queue.get_state(job_id) == "active"
    assert queue.get_job(job_id).attempts_made == 0


def test_marked_job_whose_lock_is_back_is_unmarked_not_recovered(queue):
    job_id = stalled_job(queue)
    sweep(queue)
    # The lock reappears without the mark being cleared (e.g. set by another client).
    queue.client.set(queue.keys.lock(job_id), "token-1", px=30_000)

    report = sweep(queue)
    assert (report.unmarked, report.recovered) == (1, 0)
    assert queue.stalled_ids() == set()
    assert queue.get_state(job_id) == "active"


def test_recovery_past_the_attempt_ceiling_fails_the_job_with_a_reason(queue):
    job_id = stalled_job(queue, attempts=1)
    sweep(queue)
    report = sweep(queue)
    assert (report.recovered, report.failed) == (0, 1)
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "failed"
    assert job.attempts_made == 1
    assert "attempt ceiling" in job.failed_reason and "1 of 1" in job.failed_reason
    assert job.finished_on is not None


def test_stalling_more_than_max_stalled_count_fails_the_job(queue):
    job_id = stalled_job(queue, attempts=10)
    for round_number in (1, 2):
        sweep(queue, max_stalled_count=1)
        report = sweep(queue, max_stalled_count=1)
        if round_number == 1:
            assert report.recovered == 1
            [(again, _)] = fetch(queue, token="token-2")
            assert again == job_id
            kill_lock(queue, job_id)
    assert report.failed == 1
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "failed"
    assert (job.attempts_made, job.stall_count) == (2, 2)
    assert "max_stalled_count" in job.failed_reason


def test_recovered_job_goes_to_paused_when_the_queue_is_paused(queue):
    job_id = stalled_job(queue)
    sweep(queue)
    queue.pause()
    queue.client.delete(queue.keys.marker)  # the add's wake-up, which no worker took here
    assert sweep(queue).recovered == 1
    assert queue.get_state(job_id) == "paused"
    assert queue.client.zcard(queue.keys.marker) == 0, "a paused queue wakes no worker"
    queue.resume()
    assert queue.get_state(job_id) == "wait"
    assert queue.client.zrange(queue.keys.marker, 0, -1, withscores=True) == [("0", 0.0)], "resuming does"


def test_live_jobs_are_never_marked(queue):
    for n in range(5):
        queue.add("work", {"n": n})
    fetch(queue, count=5)
    for _ in range(3):
        report = sweep(queue)
        assert (report.marked, report.recovered) == (0, 0)
    assert queue.counts()["active"] == 5


def test_job_put_in_active_by_another_client_is_swept(queue):
    """Detection is defined over `active` and the lock keys, not over our own bookkeeping."""
    keys = queue.keys
    queue.client.hset(keys.job("foreign-1"), mapping={"name": "x", "data": "{}", "opts": "{}", "atm": "0"})
    queue.client.lpush(keys.active, "foreign-1")

    assert sweep(queue).marked == 1
    assert sweep(queue, default_attempts=5).recovered == 1
    assert queue.get_state("foreign-1") == "wait"
    assert queue.get_job("foreign-1").attempts_made == 1


@pytest.mark.parametrize("budget", [1, 7, 1000])
@pytest.mark.parametrize("walk", [False, True], ids=["lock-index", "walk-of-active"])
def test_a_sweep_split_into_bounded_calls_handles_every_job_once(queue, budget, walk):
    live, dead = [], []
    for n in range(60):
        queue.add("work", {"n": n})
    for job_id, _ in fetch(queue, count=60):
        (dead if int(job_id.rsplit(".", 1)[1]) % 3 == 0 else live).append(job_id)
    for job_id in dead:
        kill_lock(queue, job_id)
    if walk:  # a lockless job another client moved into `active`: the lock index does not cover it
        queue.add("work", job_id="foreign-1")
        queue.client.lrem(queue.keys.wait, 1, "foreign-1")
        queue.client.lpush(queue.keys.active, "foreign-1")
        dead.append("foreign-1")

    first = sweep(queue, budget=budget)
    assert (first.marked, first.recovered) == (len(dead), 0)
    if walk:
        assert first.calls >= 61 // budget, "every id of active examined"
    else:
        assert len(dead) // budget <= first.calls <= len(dead) // budget + 3, "only the lapsed ids examined"
    second = sweep(queue, budget=budget)
    assert (second.marked, second.recovered) == (0, len(dead))

    waiting = queue.client.lrange(queue.keys.wait, 0, -1)
    assert sorted(waiting) == sorted(dead), "each dead job back in wait exactly once"
    assert sorted(queue.client.lrange(queue.keys.active, 0, -1)) == sorted(live)
    assert sorted(queue.client.zrange(queue.keys.locks, 0, -1)) == sorted(live), "the index follows active"
    assert all(queue.get_job(j).attempts_made == 1 for j in dead)
    assert all(queue.get_job(j).attempts_made == 0 for j in live)


def test_wrong_type_under_a_queue_key_is_a_clear_error_and_changes_nothing(queue):
    stalled_job(queue)
    sweep(queue)
    queue.client.delete(queue.keys.wait)
    queue.client.set(queue.keys.wait, "not a list")
    with pytest.raises(QueueStateError, match="wait holds a string, expected a list"):
        sweep(queue)
    assert len(queue.stalled_ids()) == 1
    assert queue.client.llen(queue.keys.active) == 1


def test_bad_job_hashes_fail_with_a_reason_and_the_sweep_goes_on(queue):
    good = stalled_job(queue)
    keys = queue.keys
    queue.client.hset(keys.job("bad-atm"), mapping={"name": "x", "atm": "1.0", "opts": "{}"})
    queue.client.hset(keys.job("bad-opts"), mapping={"name": "x", "atm": "0", "opts": "{nope"})
    queue.client.lpush(keys.active, "bad-atm", "bad-opts", "no-hash")

    assert sweep(queue).marked == 4
    report = sweep(queue)
    assert (report.recovered, report.failed) == (1, 3)
    assert queue.get_state(good) == "wait"
    reasons = {j: queue.client.hget(keys.job(j), "failedReason") for j in ("bad-atm", "bad-opts", "no-hash")}
    assert "atm is not an integer: 1.0" in reasons["bad-atm"]
    assert "opts is not a JSON object" in reasons["bad-opts"]
    assert "job hash was missing" in reasons["no-hash"]
    assert queue.counts()["active"] == 0


def test_stale_mark_of_a_job_not_in_active_is_dropped(queue):
    queue.client.sadd(queue.keys.stalled, "ghost")
    report = sweep(queue)
    assert report.recovered == 0
    assert queue.stalled_ids() == set()


def test_an_id_twice_in_active_is_recovered_once(queue):
    job_id = stalled_job(queue)
    queue.client.lpush(queue.keys.active, job_id)  # another client pushed it a second time
    sweep(queue)
    report = sweep(queue)
    assert report.recovered == 1
    assert queue.client.lrange(queue.keys.wait, 0, -1) == [job_id]
    assert queue.client.llen(queue.keys.active) == 0
    assert queue.get_job(job_id).attempts_made == 1


def test_a_forced_sweep_closes_the_gate_for_an_interval(queue):
    stalled_job(queue)
    assert sweep(queue, force=True, interval_ms=5000).marked == 1
    assert sweep(queue, force=False, interval_ms=5000).skipped, "no regular sweep right after a forced one"
    assert 4000 < queue.client.pttl(queue.keys.stalled_check) <= 5000


def test_a_corrupt_priority_counts_as_none(queue):
    job_id = stalled_job(queue)
    queue.client.hset(queue.keys.job(job_id), "pri", "nan")
    sweep(queue)
    assert sweep(queue).recovered == 1
    assert queue.get_state(job_id) == "wait"


def test_the_sweeper_goes_on_with_other_queues_when_one_is_broken(queue, redis_client, caplog):
    import logging
    import threading

    from echomq_django.core import Queue, Sweeper

    broken = Queue("broken", redis_client, prefix=queue.keys.prefix)
    redis_client.set(broken.keys.active, "not a list")
    job_id = stalled_job(queue)
    sweeper = Sweeper(redis_client, ["broken", "q"], prefix=queue.keys.prefix, interval_ms=50)
    thread = threading.Thread(target=sweeper.run, args=(lambda report: None,), daemon=True)
    with caplog.at_level(logging.ERROR, logger="echomq.sweeper"):
        thread.start()
        assert wait_until(lambda: queue.get_state(job_id) == "wait", 5)
        sweeper.stop()
        thread.join(5)
    assert any("queue broken: sweep failed" in message for message in caplog.messages)


def test_a_budget_above_luas_unpack_limit_keeps_active_whole(queue):
    ids = queue.add_bulk([NewJob("work") for _ in range(9000)])
    assert len(fetch(queue, count=9000)) == 9000
    kill_lock(queue, ids[0])  # the oldest: at the tail of active
    sweep(queue, budget=10_000)
    report = sweep(queue, budget=10_000)
    assert report.recovered == 1
    assert queue.client.llen(queue.keys.active) == 8999 == queue.client.zcard(queue.keys.locks)


def test_a_job_key_of_another_type_fails_alone_in_fetch_and_sweep(queue):
    good, bad = queue.add("work", opts=JobOptions(attempts=5)), queue.add("work")
    queue.client.delete(queue.keys.job(bad))
    queue.client.set(queue.keys.job(bad), "not a hash")
    fetched = [job_id for job_id, _ in fetch(queue, count=2)]
    assert fetched == [good] and queue.get_state(bad) == "failed"

    third = queue.add("work", opts=JobOptions(attempts=5))
    fetch(queue, token="token-2", count=1)
    queue.client.delete(queue.keys.job(third))
    queue.client.set(queue.keys.job(third), "broken later")
    kill_lock(queue, good)
    kill_lock(queue, third)
    sweep(queue)
    report = sweep(queue)
    assert (report.recovered, report.failed) == (1, 1)
    assert queue.get_state(good) == "wait" and queue.get_job(good).attempts_made == 1
    assert queue.get_state(third) == "failed"
    assert queue.client.llen(queue.keys.active) == 0 == queue.client.zcard(queue.keys.locks)


def test_a_failed_id_whose_key_is_not_a_hash_stays_failed_and_visible(queue):
    good, bad = queue.add("work", opts=JobOptions(attempts=1)), queue.add("work")
    queue.client.delete(queue.keys.job(bad))
    queue.client.set(queue.keys.job(bad), "not a hash")
    fetch(queue, count=2)  # the bad one goes to failed at once
    finish(queue, good, "token-1", completed=False, value="boom")
    assert {job.id for job in queue.get_jobs("failed")} == {good}, "listed without the unreadable one"
    assert queue.retry(bad) is False and queue.get_state(bad) == "failed"
    assert queue.retry_all_failed() == 1
    assert (queue.get_state(good), queue.get_state(bad)) == ("wait", "failed")


def test_an_index_entry_whose_id_left_active_behind_the_scripts_back_is_dropped(queue):
    job_id = queue.add("work")
    fetch(queue)
    kill_lock(queue, job_id)
    sweep(queue)  # marked
    queue.client.lrem(queue.keys.active, 1, job_id)  # another client takes it out of active only
    queue.add("work", job_id="foreign-1")
    queue.client.lrem(queue.keys.wait, 1, "foreign-1")
    queue.client.lpush(queue.keys.active, "foreign-1")  # and puts an unindexed id in: counts equal
    sweep(queue)  # drops the stale mark and the ghost entry; the counts differ, so it walks active
    assert queue.client.zcard(queue.keys.locks) == 0
    assert queue.stalled_ids() == {"foreign-1"}, "the walk found the id the index never covered"
    assert sweep(queue).recovered == 1


def test_after_a_gap_in_sweeping_nothing_is_marked_or_recovered_for_one_lock_duration(queue):
    """The hold: Redis was away (no sweep could run), so every lock may have lapsed under live workers."""
    sweeper = Sweeper(queue.client, [queue.name], prefix=queue.keys.prefix, interval_ms=100, lock_duration_ms=800)
    target = sweeper.targets[0]
    job_id = queue.add("work")
    fetch(queue)
    assert not sweeper.sweep(target, force=True).held_ms
    kill_lock(queue, job_id)
    time.sleep(0.6)  # the fault: no sweep for longer than interval + half a lock (0.5 s)
    held = sweeper.sweep(target, force=True)
    assert 0 < held.held_ms <= 800 and held.marked == 0
    assert "held for" in held.summary()
    assert queue.stalled_ids() == set()
    # A live worker renews within the hold: its job is never marked.
    assert renew_lock(queue, job_id, "token-1", 800)
    kill_lock(queue, job_id)  # now its worker dies for real
    assert wait_until(lambda: sweeper.sweep(target, force=True).marked == 1, 30, 0.05), "marked once the hold ends"
    # Swept again until recovered: a stall of this machine past half a lock between two sweeps is a gap too.
    assert wait_until(lambda: sweeper.sweep(target, force=True).recovered == 1, 30, 0.05), "recovered after"


def test_the_hold_lives_in_redis_so_another_sweeper_is_held_as_well(queue):
    # A 10 s hold, so that it is still on however slowly the other sweeper's client is made.
    sweeper = Sweeper(queue.client, [queue.name], prefix=queue.keys.prefix, interval_ms=100,
                      lock_duration_ms=10_000)
    job_id = queue.add("work")
    fetch(queue)
    assert not sweeper.sweep(sweeper.targets[0], force=True).held_ms
    kill_lock(queue, job_id)
    # The fault without waiting it out: the last sweep is dated a minute back, as if none had run since.
    queue.client.hset(queue.keys.meta, "sweptAt", redis_now_ms(queue) - 60_000)
    held = sweeper.sweep(sweeper.targets[0], force=True)
    assert 0 < held.held_ms <= 10_000 and held.marked == 0
    other_client = connect(current_redis_url())
    try:
        other = Sweeper(other_client, [queue.name], prefix=queue.keys.prefix, interval_ms=100,
                        lock_duration_ms=10_000)
        report = other.sweep(other.targets[0], force=True)
    finally:
        other_client.close()
    assert report.held_ms > 0 and report.marked == 0, "the other sweeper, just one interval on, is held too"
    assert queue.stalled_ids() == set()


def test_sweeps_at_their_interval_never_hold(queue):
    # A 10 s lock: only a gap of more than 5.2 s opens a hold, so no stall of this machine fails this.
    sweeper = Sweeper(queue.client, [queue.name], prefix=queue.keys.prefix, interval_ms=200,
                      lock_duration_ms=10_000)
    job_id = queue.add("work")
    fetch(queue)
    kill_lock(queue, job_id)
    reports = []
    for _ in range(3):
        reports.append(sweeper.sweep(sweeper.targets[0]))
        # The next sweep is due once its gate lapses, one interval on, as Sweeper.run schedules it.
        assert wait_until(lambda: not queue.client.exists(queue.keys.stalled_check), 30, 0.01)
    assert [(r.held_ms, r.marked, r.recovered) for r in reports] == [(0, 1, 0), (0, 0, 1), (0, 0, 0)]
