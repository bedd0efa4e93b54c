"""Per-minute metrics, counted by the scripts that move jobs (lua/includes/metrics.lua), and their reads."""

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from redis.exceptions import ResponseError

from echomq_django.core import (
    JobOptions,
    Minute,
    NewJob,
    Queue,
    Retention,
    Sweeper,
    Worker,
    WorkerOptions,
    connect,
    oldest_waiting_age_ms,
    recent_minutes,
    totals,
)
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.scripts import Finish
from echomq_django.core.reading.metrics import MINUTE_MS
from tests.helpers import finish_attempt, kill_lock, sweep, take_jobs, wait_until

WORKER = Path(__file__).resolve().parents[1] / "worker_process.py"
SUMMED = ("completed", "failed", "retried", "recovered", "wait_count", "wait_sum_ms", "run_count", "run_sum_ms")
MAXED = ("wait_max_ms", "run_max_ms")
ZERO_TOTALS = {"completed": 0, "failed": 0, "retried": 0, "recovered": 0}


def make_worker(queue, handler, **options) -> Worker:
    options.setdefault("block_timeout_s", 0.2)
    return Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, **options))


def make_sweeper(queue, **options) -> Sweeper:
    return Sweeper(queue.client, [queue.name], prefix=queue.keys.prefix, scripts=queue.scripts, **options)


def minutes_since(queue, start_ms: int, end_ms: int | None = None) -> list[Minute]:
    """Every minute from the one holding `start_ms` to the one holding `end_ms` (now), oldest first."""
    end = now_ms() if end_ms is None else end_ms
    return recent_minutes(queue, end // MINUTE_MS - start_ms // MINUTE_MS + 1, now=end)


def summed(minutes: list[Minute]) -> dict[str, int]:
    """The minutes added up: counts and sums add, maxima keep the larger."""
    total = {name: sum(getattr(m, name) for m in minutes) for name in SUMMED}
    total.update({name: max(getattr(m, name) for m in minutes) for name in MAXED})
    return total


def counts_of(minute: Minute) -> dict[str, int]:
    return {name: getattr(minute, name) for name in SUMMED + MAXED}


def metrics_keys(queue) -> list[str]:
    return sorted(queue.client.scan_iter(match=f"{queue.keys.base}metrics*", count=1000))


def minute_keys(queue) -> list[str]:
    return [key for key in metrics_keys(queue) if key != queue.keys.metrics_total]


def latest_sample(queue, start_ms: int) -> int | None:
    """The `waiting` sample of the latest minute since `start_ms` that has one."""
    samples = [m.waiting for m in minutes_since(queue, start_ms) if m.waiting is not None]
    return samples[-1] if samples else None


def handler(job):
    """ok: completes; slow: completes after 0.2 s; bad: always fails; flaky: fails its first attempt."""
    if job.name == "slow":
        time.sleep(0.2)
    if job.name == "bad" or (job.name == "flaky" and job.attempts_made == 0):
        raise RuntimeError(f"{job.name} fails")
    return job.name


def stall(queue, count: int, token: str = "dead-worker", metrics_minutes: int | None = None) -> list[str]:
    """Take `count` ready jobs with `token` and let their locks lapse; returns their ids."""
    now = now_ms()
    if metrics_minutes is None:
        _due, taken = take_jobs(queue, token, 30_000, now, count, "dead-worker")
    else:
        call = queue.scripts.fetch_call(queue.keys, token, 30_000, now, count, "dead-worker", metrics_minutes)
        [reply] = queue.scripts.run_batch([call], raise_on_error=True)
        _due, _wait, taken = queue.scripts.fetched(reply)
    ids = [job_id for job_id, _flat in taken]
    assert len(ids) == count
    for job_id in ids:
        kill_lock(queue, job_id)
    return ids


# -- what a run counts -----------------------------------------------------


def test_a_known_run_is_counted_exactly(queue):
    started = now_ms()
    recovered_n, swept_failed_n = 3, 2  # K recovered by a sweep, J failed by it (attempt ceiling)
    queue.add_bulk([NewJob("ok", {"k": i}, JobOptions(attempts=3)) for i in range(recovered_n)])
    queue.add_bulk([NewJob("ok", {"j": i}, JobOptions(attempts=1)) for i in range(swept_failed_n)])
    stall(queue, recovered_n + swept_failed_n)
    assert sweep(queue).marked == recovered_n + swept_failed_n
    second = sweep(queue)
    assert (second.recovered, second.failed) == (recovered_n, swept_failed_n)

    # N completed (one of them slow), M failed for good, R retried once then completed.
    completed_n, failed_n, retried_n = 6, 3, 2
    old = now_ms() - 5000
    queue.add("slow", opts=JobOptions(attempts=1), timestamp_ms=old)
    for _ in range(completed_n - 1):
        queue.add("ok", opts=JobOptions(attempts=1), timestamp_ms=old)
    for _ in range(failed_n):
        queue.add("bad", opts=JobOptions(attempts=1), timestamp_ms=old)
    for _ in range(retried_n):
        queue.add("flaky", opts=JobOptions(attempts=2), timestamp_ms=old)
    make_worker(queue, handler, concurrency=2).run(burst=True)
    assert queue.counts()["completed"] == completed_n + retried_n + recovered_n
    assert queue.counts()["failed"] == failed_n + swept_failed_n

    expected_totals = {"completed": completed_n + retried_n + recovered_n, "failed": failed_n + swept_failed_n,
                       "retried": retried_n, "recovered": recovered_n}
    assert totals(queue) == expected_totals

    minutes = minutes_since(queue, started)
    got = summed(minutes)
    first_starts = completed_n + failed_n + retried_n + recovered_n + swept_failed_n
    assert {name: got[name] for name in ("completed", "failed", "retried", "recovered", "wait_count",
                                         "run_count")} == {
        **expected_totals,
        "wait_count": first_starts,  # a recovered or retried job's later starts are not waits
        "run_count": completed_n + failed_n + 2 * retried_n + recovered_n,  # the stalled attempts never finished
    }
    if len(minutes) == 1:  # the usual case: the whole run fell into the minute now
        assert counts_of(recent_minutes(queue, 2)[-1]) == got
        assert counts_of(recent_minutes(queue, 2)[0]) == counts_of(Minute(0))

    # Waits: the jobs added 5 s ago waited at least that long, and no wait ended after now.
    ended = now_ms()
    assert 5000 <= got["wait_max_ms"] <= ended - old
    assert got["wait_sum_ms"] >= 5000 * (completed_n + failed_n + retried_n)
    assert got["wait_max_ms"] <= got["wait_sum_ms"] <= got["wait_count"] * got["wait_max_ms"]
    # Runs: the slow job ran at least 0.2 s.
    assert 200 <= got["run_max_ms"] <= ended - old - 5000
    assert got["run_max_ms"] <= got["run_sum_ms"] <= got["run_count"] * got["run_max_ms"]
    for minute in minutes:
        if minute.wait_count:
            assert 0 <= minute.mean_wait_ms <= minute.wait_max_ms
        if minute.run_count:
            assert 0 <= minute.mean_run_ms <= minute.run_max_ms
        assert minute.to_json()["mean_run_ms"] == minute.mean_run_ms


def test_sums_add_and_maxima_keep_the_larger_across_calls(queue):
    minute_start = now_ms() // MINUTE_MS * MINUTE_MS
    at = minute_start + 1000  # every call's clock pinned inside this minute
    waits, runs = [1000, 5000, 2000], [300, 100, 200]
    for n, (wait, run) in enumerate(zip(waits, runs)):
        job_id = queue.add("ok", opts=JobOptions(attempts=1), timestamp_ms=at - wait, job_id=f"job{n}")
        _due, [(taken, _flat)] = take_jobs(queue, f"t{n}", 30_000, at, 1, "w")  # one call per job
        assert taken == job_id
        assert finish_attempt(queue, job_id, f"t{n}", at + run, completed=True, value="1", default_attempts=1) == 1
    [minute] = recent_minutes(queue, 1, now=at)
    assert counts_of(minute) == {
        "completed": 3, "failed": 0, "retried": 0, "recovered": 0,
        "wait_count": 3, "wait_sum_ms": 8000, "wait_max_ms": 5000,
        "run_count": 3, "run_sum_ms": 600, "run_max_ms": 300,
    }
    assert (minute.start_ms, minute.mean_wait_ms, minute.mean_run_ms) == (minute_start, 8000 / 3, 200.0)
    assert minute.waiting is None, "no sweep looked"


def test_one_call_counts_many_jobs_with_their_largest_time(queue):
    at = now_ms() // MINUTE_MS * MINUTE_MS + 1000
    # One fetch takes three jobs, oldest first, that waited 5000, 1000 and 2000 ms.
    ids = [queue.add("ok", opts=JobOptions(attempts=1), timestamp_ms=at - wait, job_id=f"wait{wait}")
           for wait in (5000, 1000, 2000)]
    _due, taken = take_jobs(queue, "three", 30_000, at, 3, "w")
    assert [job_id for job_id, _ in taken] == ids
    [minute] = recent_minutes(queue, 1, now=at)
    assert (minute.wait_count, minute.wait_sum_ms, minute.wait_max_ms) == (3, 8000, 5000)

    # One finish call ends three attempts that ran 300, 100 and 200 ms (each taken by a fetch of its own).
    runs = {f"run{run}": run for run in (300, 100, 200)}
    for job_id, run in runs.items():
        queue.add("ok", opts=JobOptions(attempts=1), timestamp_ms=at + 5000 - run, job_id=job_id)
        _due, [(taken_id, _flat)] = take_jobs(queue, job_id, 30_000, at + 5000 - run, 1, "w")
        assert taken_id == job_id
    call = queue.scripts.finish_call(queue.keys, [Finish(job_id, job_id, True, "1") for job_id in runs],
                                     at + 5000, default_attempts=1)
    assert queue.scripts.run_batch([call], raise_on_error=True) == [[1, 1, 1]]
    [minute] = recent_minutes(queue, 1, now=at)
    assert (minute.run_count, minute.run_sum_ms, minute.run_max_ms, minute.completed) == (3, 600, 300, 3)
    assert (minute.wait_count, minute.wait_sum_ms, minute.wait_max_ms) == (6, 8000, 5000)


def test_a_negative_wait_or_run_counts_as_zero(queue):
    at = now_ms() // MINUTE_MS * MINUTE_MS + 1000
    job_id = queue.add("ok", opts=JobOptions(attempts=1), timestamp_ms=at + 700)  # a producer's clock ahead
    take_jobs(queue, "t", 30_000, at, 1, "w")
    assert finish_attempt(queue, job_id, "t", at - 50, completed=True, value="1", default_attempts=1) == 1
    [minute] = recent_minutes(queue, 1, now=at)
    assert (minute.wait_count, minute.wait_sum_ms, minute.wait_max_ms) == (1, 0, 0)
    assert (minute.run_count, minute.run_sum_ms, minute.run_max_ms) == (1, 0, 0)


def test_a_delayed_jobs_wait_counts_from_its_due_time(queue):
    started = now_ms()
    added = started - 10_000
    job_id = queue.add("ok", opts=JobOptions(delay_ms=9000), timestamp_ms=added)
    assert queue.client.hget(queue.keys.job(job_id), "due") == str(added + 9000)
    make_worker(queue, handler).run(burst=True)
    assert queue.get_state(job_id) == "completed"
    got = summed(minutes_since(queue, started))
    assert got["wait_count"] == 1
    assert got["wait_sum_ms"] == got["wait_max_ms"]
    # From the due time (1 s ago), not from the creation (10 s ago).
    assert 1000 <= got["wait_max_ms"] < 6000


def test_a_promoted_jobs_wait_counts_from_its_promotion(queue):
    job_id = queue.add("ok", opts=JobOptions(delay_ms=3_600_000))
    assert queue.promote(job_id)
    promoted = now_ms()
    taken_at = promoted + 5000  # the worker's clock when it takes the job, 5 s after the promotion
    _due, [(taken, _flat)] = take_jobs(queue, "late-taker", 30_000, taken_at, 1, "w")
    assert taken == job_id
    got = summed(minutes_since(queue, promoted, taken_at))
    assert got["wait_count"] == 1
    assert got["wait_max_ms"] >= 5000


def test_a_resent_fetch_and_a_resent_finish_count_once(queue):
    started = now_ms()
    job_id = queue.add("ok")
    now = now_ms()
    _due, first = take_jobs(queue, "resent", 30_000, now, 1, "w")
    _due, again = take_jobs(queue, "resent", 30_000, now, 1, "w")  # the reply was lost: sent again
    assert [i for i, _ in first] == [i for i, _ in again] == [job_id]
    for _ in range(2):
        code = finish_attempt(queue, job_id, "resent", now_ms(), completed=True, value='"ok"', default_attempts=1)
    assert code == 5, "the second finish answers 'already done'"
    got = summed(minutes_since(queue, started))
    assert (got["wait_count"], got["run_count"], got["completed"]) == (1, 1, 1)
    assert totals(queue) == {**ZERO_TOTALS, "completed": 1}


def test_a_forced_sweep_samples_the_jobs_waiting(queue):
    started = now_ms()
    assert latest_sample(queue, started) is None
    queue.add_bulk([NewJob("ok") for _ in range(3)])
    queue.add_bulk([NewJob("ok", opts=JobOptions(priority=5)) for _ in range(2)])
    sweep(queue)
    assert latest_sample(queue, started) == 5  # 3 in wait + 2 prioritized

    queue.pause()  # wait -> paused
    queue.add("ok")  # to paused
    assert queue.counts()["paused"] == 4 and queue.counts()["wait"] == 0
    sweep(queue)
    assert latest_sample(queue, started) == 6  # 4 paused + 2 prioritized

    queue.resume()
    queue.add("ok")
    report = sweep(queue, force=False)  # the forced sweep closed the gate for an interval
    assert report.skipped
    assert latest_sample(queue, started) == 6, "a sweep the gate turned away samples nothing"


def test_a_sweep_through_the_gate_samples_too(queue):
    started = now_ms()
    queue.add_bulk([NewJob("ok") for _ in range(4)])
    assert not sweep(queue, force=False).skipped
    assert latest_sample(queue, started) == 4


# -- turned off, and kept for a while --------------------------------------


def everything_that_counts(queue: Queue, metrics_minutes: int) -> None:
    """Starts, finishes of every kind, recoveries, failures by the sweep and a sample, with these metrics."""
    queue.add_bulk([NewJob("ok", opts=JobOptions(attempts=3)) for _ in range(2)])
    queue.add("ok", opts=JobOptions(attempts=1))
    stall(queue, 3, metrics_minutes=metrics_minutes)
    sweeper = make_sweeper(queue, metrics_minutes=metrics_minutes)
    assert sweeper.sweep(sweeper.targets[0], force=True).marked == 3
    report = sweeper.sweep(sweeper.targets[0], force=True)
    assert (report.recovered, report.failed) == (2, 1)
    queue.add("slow", opts=JobOptions(attempts=1), timestamp_ms=now_ms() - 1000)
    queue.add("bad", opts=JobOptions(attempts=1))
    queue.add("flaky", opts=JobOptions(attempts=2))
    assert make_worker(queue, handler, metrics_minutes=metrics_minutes).run(burst=True) == 6
    assert queue.counts()["completed"] == 4 and queue.counts()["failed"] == 2


def test_metrics_minutes_zero_writes_no_metrics_key(redis_client, prefix, scripts):
    off = Queue("off", redis_client, prefix=prefix, scripts=scripts)
    on = Queue("on", redis_client, prefix=prefix, scripts=scripts)
    everything_that_counts(off, 0)
    everything_that_counts(on, 5)
    assert metrics_keys(off) == []
    assert totals(off) == ZERO_TOTALS
    assert on.keys.metrics_total in metrics_keys(on) and minute_keys(on), "the same run with metrics on counts"
    assert totals(on) == {"completed": 4, "failed": 2, "retried": 1, "recovered": 2}


def test_metrics_minutes_zero_from_the_django_settings(echomq_settings, queue):
    from echomq_django.queues import make_sweeper as make_django_sweeper
    from echomq_django.queues import make_worker as make_django_worker

    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "METRICS_MINUTES": 0}
    queue.add("ok")
    stall(queue, 1, metrics_minutes=0)
    sweeper = make_django_sweeper(["q"])
    sweeper.sweep(sweeper.targets[0], force=True)
    assert sweeper.sweep(sweeper.targets[0], force=True).recovered == 1
    queue.add("flaky", opts=JobOptions(attempts=2))
    assert make_django_worker("q", handler, block_timeout_s=0.2).run(burst=True) == 3  # attempts
    assert queue.counts()["completed"] == 2
    assert metrics_keys(queue) == []


def test_a_minute_expires_metrics_minutes_after_it_ends(queue):
    keep = 5
    queue.add("ok")
    make_worker(queue, handler, metrics_minutes=keep).run(burst=True)
    sweeper = make_sweeper(queue, metrics_minutes=keep)
    sweeper.sweep(sweeper.targets[0], force=True)  # a sample, perhaps in a minute of its own
    keys = minute_keys(queue)
    assert keys
    for key in keys:
        minute = int(key.rsplit(":", 1)[1])
        assert expires_within_a_minute_of(queue, key, (minute + 1 + keep) * 60)
        assert keep * 60 - 1 <= queue.client.ttl(key) <= (keep + 1) * 60
    assert queue.client.ttl(queue.keys.metrics_total) == -1, "the all-time counters never expire"
    assert totals(queue) == {**ZERO_TOTALS, "completed": 1}


def expires_within_a_minute_of(queue, key: str, minute_end_plus_keep_s: int) -> bool:
    """A minute's key lives keep + 1 minutes from its creation (Redis's clock): at most a minute past end + keep."""
    expires = queue.client.expiretime(key)
    return minute_end_plus_keep_s <= expires <= minute_end_plus_keep_s + 60


def test_a_later_write_in_the_minute_keeps_its_expiry(queue):
    queue.add("ok")
    make_worker(queue, handler, metrics_minutes=5).run(burst=True)
    [key] = [k for k in minute_keys(queue) if queue.client.hexists(k, "completed")]
    expires = queue.client.expiretime(key)
    minute = int(key.rsplit(":", 1)[1])
    assert expires_within_a_minute_of(queue, key, (minute + 1 + 5) * 60)
    # Another worker, configured to keep an hour, starts and finishes a job in the same minute.
    job_id = queue.add("ok")
    call = queue.scripts.fetch_call(queue.keys, "t2", 30_000, minute * MINUTE_MS + 1, 1, "w", 60)
    [reply] = queue.scripts.run_batch([call], raise_on_error=True)
    assert [i for i, _ in queue.scripts.fetched(reply)[2]] == [job_id]
    call = queue.scripts.finish_call(queue.keys, [Finish(job_id, "t2", True, "1")], minute * MINUTE_MS + 2,
                                     default_attempts=1, metrics_minutes=60)
    assert queue.scripts.run_batch([call], raise_on_error=True) == [[1]]
    assert queue.client.expiretime(key) == expires, "only the write that creates it sets it"
    assert recent_minutes(queue, 1, now=minute * MINUTE_MS)[0].completed == 2


# -- another client's writes -----------------------------------------------


def current_and_next_minute_keys(queue) -> list[str]:
    minute = now_ms() // MINUTE_MS
    return [queue.keys.metrics_minute(minute), queue.keys.metrics_minute(minute + 1)]


def test_a_minute_key_of_another_type_does_not_fail_finishes(queue):
    keys = current_and_next_minute_keys(queue)
    for key in keys:
        queue.client.set(key, "not a hash")
    started = now_ms()
    ids = queue.add_bulk([NewJob("ok"), NewJob("ok")])
    assert make_worker(queue, handler).run(burst=True) == 2
    assert [queue.get_state(job_id) for job_id in ids] == ["completed", "completed"]
    assert [queue.client.get(key) for key in keys] == ["not a hash", "not a hash"], "left alone"
    assert totals(queue) == {**ZERO_TOTALS, "completed": 2}, "the all-time counters still count"
    for minute in minutes_since(queue, started):  # read as empty, never an error
        assert counts_of(minute) == counts_of(Minute(0)) and minute.waiting is None


def test_an_unreadable_field_starts_again_from_zero(queue):
    keys = current_and_next_minute_keys(queue)
    for key in keys:
        queue.client.hset(key, mapping={"completed": "abc", "run_max": "abc", "run_count": "x1"})
    started = now_ms()
    job_id = queue.add("ok")
    assert make_worker(queue, handler).run(burst=True) == 1
    assert queue.get_state(job_id) == "completed"
    written = [key for key in keys if queue.client.hget(key, "wait_count") == "1"]
    assert len(written) == 1
    [key] = written
    [untouched] = [k for k in keys if k != key]
    assert queue.client.hmget(key, "completed", "run_count") == ["1", "1"]
    assert int(queue.client.hget(key, "run_max")) >= 0
    assert queue.client.hgetall(untouched) == {"completed": "abc", "run_max": "abc", "run_count": "x1"}
    got = summed(minutes_since(queue, started))
    assert (got["completed"], got["run_count"]) == (1, 1)
    minute = int(key.rsplit(":", 1)[1])
    assert expires_within_a_minute_of(queue, key, (minute + 1 + 1440) * 60)


def test_a_nan_field_starts_again_from_zero(queue):
    for key in current_and_next_minute_keys(queue):
        queue.client.hset(key, mapping={"completed": "nan", "run_count": "inf"})
    started = now_ms()
    queue.add("ok")
    assert make_worker(queue, handler).run(burst=True) == 1
    got = summed(minutes_since(queue, started))
    assert (got["completed"], got["run_count"]) == (1, 1)


def test_an_unreadable_total_starts_again_from_zero(queue):
    queue.client.hset(queue.keys.metrics_total, "completed", "abc")
    queue.add("ok")
    assert make_worker(queue, handler).run(burst=True) == 1
    assert totals(queue)["completed"] == 1


def test_an_unreadable_total_restarts_alone_and_does_not_fail_finishes(queue):
    queue.client.hset(queue.keys.metrics_total, mapping={"completed": "abc", "failed": "2"})
    ids = queue.add_bulk([NewJob("ok"), NewJob("bad", opts=JobOptions(attempts=1))])
    assert make_worker(queue, handler).run(burst=True) == 2
    assert [queue.get_state(job_id) for job_id in ids] == ["completed", "failed"]
    assert queue.client.hgetall(queue.keys.metrics_total) == {"completed": "1", "failed": "3"}
    assert totals(queue) == {**ZERO_TOTALS, "completed": 1, "failed": 3}


def test_a_totals_key_of_another_type_does_not_fail_finishes(queue):
    queue.client.set(queue.keys.metrics_total, "not a hash")
    job_id = queue.add("ok")
    assert make_worker(queue, handler).run(burst=True) == 1
    assert queue.get_state(job_id) == "completed"
    assert queue.client.get(queue.keys.metrics_total) == "not a hash"


def test_totals_of_a_key_of_another_type_raise_rather_than_read_as_a_reset(queue):
    queue.client.set(queue.keys.metrics_total, "not a hash")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        totals(queue)


# -- real concurrency -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)  # four processes started, then a wait of up to 60 s
def test_four_worker_processes_count_every_job_exactly_once(queue, redis_url):
    jobs_n, processes_n = 400, 4
    started = now_ms()
    processes = []
    try:
        for _ in range(processes_n):
            process = subprocess.Popen(
                [sys.executable, str(WORKER), redis_url, queue.keys.prefix, queue.name, "10000", "2"],
                stdout=subprocess.PIPE, text=True)
            processes.append(process)
            assert process.stdout.readline().strip() == "ready"
        queue.add_bulk([NewJob("jitter", {"ms": 6}) for _ in range(jobs_n)])
        assert wait_until(lambda: queue.counts()["completed"] == jobs_n, 60, 0.05), queue.counts()
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            process.wait(10)
    assert [process.returncode for process in processes] == [0] * processes_n
    pids = {job.returnvalue["pid"] for job in queue.get_jobs("completed", 0, jobs_n)}
    assert len(pids) > 1, "more than one process finished jobs"
    assert totals(queue) == {**ZERO_TOTALS, "completed": jobs_n}
    got = summed(minutes_since(queue, started))
    assert (got["completed"], got["run_count"], got["wait_count"]) == (jobs_n, jobs_n, jobs_n)
    assert (got["failed"], got["retried"], got["recovered"]) == (0, 0, 0)


def test_worker_threads_on_separate_clients_count_every_job_exactly_once(queue, redis_url):
    jobs_n = 400
    started = now_ms()
    queue.add_bulk([NewJob("ok") for _ in range(jobs_n)])
    clients = [connect(redis_url) for _ in range(4)]
    options = WorkerOptions(prefix=queue.keys.prefix, concurrency=2, block_timeout_s=0.2, keep_completed=Retention())
    workers = [Worker(queue.name, handler, client, options) for client in clients]
    barrier = threading.Barrier(len(workers))

    def run(worker):
        barrier.wait(5)
        worker.run(burst=True)

    threads = [threading.Thread(target=run, args=(worker,), daemon=True) for worker in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for client in clients:
        client.close()
    assert not any(thread.is_alive() for thread in threads)
    assert sum(worker.processed for worker in workers) == jobs_n
    assert queue.counts()["completed"] == jobs_n
    assert totals(queue) == {**ZERO_TOTALS, "completed": jobs_n}
    got = summed(minutes_since(queue, started))
    assert (got["completed"], got["run_count"], got["wait_count"]) == (jobs_n, jobs_n, jobs_n)


# -- the oldest waiting job ---------------------------------------------------


def test_oldest_waiting_age_is_none_when_nothing_waits(queue):
    assert oldest_waiting_age_ms(queue) is None
    queue.add("later", opts=JobOptions(delay_ms=60_000))
    job_id = queue.add("ok")
    take_jobs(queue, "t", 30_000, now_ms(), 1, "w")
    assert queue.get_state(job_id) == "active"
    assert oldest_waiting_age_ms(queue) is None, "delayed and active jobs are not waiting"


def test_oldest_waiting_age_counts_from_the_oldest_job(queue):
    now = now_ms()
    queue.add("ok", timestamp_ms=now - 10_000)
    queue.add("ok", timestamp_ms=now - 1000)
    assert oldest_waiting_age_ms(queue, now=now) == 10_000
    assert 10_000 <= oldest_waiting_age_ms(queue) < 10_000 + 5000
    assert oldest_waiting_age_ms(queue, now=now - 20_000) == 0, "never negative"


def test_oldest_waiting_age_looks_at_paused(queue):
    now = now_ms()
    queue.pause()
    queue.add("ok", timestamp_ms=now - 12_000)
    assert queue.counts()["paused"] == 1
    assert oldest_waiting_age_ms(queue, now=now) == 12_000


def test_oldest_waiting_age_looks_at_prioritized(queue):
    now = now_ms()
    queue.add("ok", timestamp_ms=now - 1000)
    queue.add("ok", opts=JobOptions(priority=5), timestamp_ms=now - 15_000)
    assert queue.counts()["prioritized"] == 1
    assert oldest_waiting_age_ms(queue, now=now) == 15_000


def test_oldest_waiting_age_of_a_delayed_job_counts_from_its_due_time(queue):
    now = now_ms()
    queue.add("ok", opts=JobOptions(delay_ms=4000), timestamp_ms=now - 10_000)
    assert queue.promote_delayed() == 1
    assert oldest_waiting_age_ms(queue, now=now) == 6000


def test_oldest_waiting_age_skips_ids_without_a_job(queue):
    queue.client.lpush(queue.keys.wait, "ghost")
    assert oldest_waiting_age_ms(queue) is None
    now = now_ms()
    queue.pause()  # ghost and all go to paused
    queue.add("ok", timestamp_ms=now - 3000)
    queue.client.rpush(queue.keys.paused, "ghost2")  # the oldest end of paused: no hash behind it
    queue.client.zadd(queue.keys.prioritized, {"ghost3": 0})
    assert oldest_waiting_age_ms(queue, now=now) is None, "only the oldest of each key is looked at"
    queue.client.rpop(queue.keys.paused)
    queue.client.lrem(queue.keys.paused, 0, "ghost")
    assert oldest_waiting_age_ms(queue, now=now) == 3000


def test_oldest_waiting_age_of_a_promoted_job_counts_from_its_promotion(queue):
    job_id = queue.add("ok", opts=JobOptions(delay_ms=3_600_000))
    assert queue.promote(job_id)
    promoted = now_ms()
    assert queue.get_state(job_id) == "wait"
    assert oldest_waiting_age_ms(queue, now=promoted + 5000) >= 5000
