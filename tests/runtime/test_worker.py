"""The worker: threads, the marker, retries, lock renewal, lost locks, shutdown."""

import logging
import threading
import time
from collections.abc import Callable

import pytest

from echomq_django.core import Backoff, Confirm, JobOptions, NewJob, Worker, WorkerOptions, connect
from tests.helpers import blocked_connections, kill_lock, redis_now_ms, sweep, wait_until


def start(worker: Worker, **run_options) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs=run_options, daemon=True)
    thread.start()
    return thread


def make_worker(queue, handler, client=None, **options) -> Worker:
    options.setdefault("block_timeout_s", 0.2)
    return Worker(queue.name, handler, client or queue.client, WorkerOptions(prefix=queue.keys.prefix, **options))


@pytest.fixture
def named_client(redis_url, prefix):
    """named_client(label) -> (client, name): a client whose connections Redis lists under a name of this test's."""
    clients = []

    def make(label: str):
        name = f"{prefix}-{label}"
        clients.append(connect(redis_url, client_name=name))
        return clients[-1], name

    yield make
    for client in clients:
        client.close()


def blocked(queue, name: str) -> int:
    """How many connections named `name` are blocked on `queue`'s marker right now."""
    return blocked_connections(queue.client, name, queue.keys.marker)


def test_burst_runs_every_ready_job_and_returns(queue):
    queue.add_bulk([NewJob("double", {"n": n}) for n in range(20)])
    worker = make_worker(queue, lambda job: job.data["n"] * 2, concurrency=3)
    assert worker.run(burst=True) == 20
    assert queue.counts()["completed"] == 20
    assert sorted(j.returnvalue for j in queue.get_jobs("completed", 0, 100)) == list(range(0, 40, 2))


def test_jobs_run_concurrently_on_threads(queue):
    queue.add_bulk([NewJob("sleep") for _ in range(4)])
    running, peak, guard = 0, 0, threading.Lock()
    all_four = threading.Barrier(4, timeout=30)  # passed only by four jobs running at once

    def handler(job):
        nonlocal running, peak
        with guard:
            running += 1
            peak = max(peak, running)
        all_four.wait()
        with guard:
            running -= 1

    make_worker(queue, handler, concurrency=4).run(burst=True)
    assert peak == 4


def test_an_idle_worker_wakes_on_the_marker_not_on_its_timeout(queue, named_client):
    client, name = named_client("worker")
    worker = make_worker(queue, lambda job: "done", client, block_timeout_s=60)
    thread = start(worker)
    assert wait_until(lambda: blocked(queue, name) == 1, 30), "the idle worker blocks on the marker"
    added = time.monotonic()
    job_id = queue.add("work")
    assert wait_until(lambda: queue.get_state(job_id) == "completed", 30)
    assert time.monotonic() - added < 30, "woken by the marker, not the 60 s timeout"
    worker.stop()
    thread.join(5)
    assert not thread.is_alive()


def test_delayed_job_runs_after_its_delay(queue):
    worker = make_worker(queue, lambda job: "done", block_timeout_s=60)
    thread = start(worker)
    added = time.monotonic()
    job_id = queue.add("later", opts=JobOptions(delay_ms=500))
    assert wait_until(lambda: queue.get_state(job_id) == "completed", 30)
    assert 0.45 <= time.monotonic() - added < 30, "woken at its due time, not at the 60 s timeout"
    worker.stop()
    thread.join(6)


def test_failures_are_retried_then_failed_with_reason_and_trace(queue):
    job_id = queue.add("flaky", opts=JobOptions(attempts=3, backoff=Backoff("fixed", 50)))
    calls = []

    def handler(job):
        calls.append(job.attempts_made)
        raise ValueError(f"attempt {job.attempts_made + 1} failed")

    worker = make_worker(queue, handler)
    thread = start(worker)
    assert wait_until(lambda: queue.get_state(job_id) == "failed", 30)
    worker.stop()
    thread.join(5)
    job = queue.get_job(job_id)
    assert calls == [0, 1, 2]
    assert job.attempts_made == 3
    assert job.failed_reason == "ValueError: attempt 3 failed"
    assert len(job.stacktrace) == 3 and "ValueError" in job.stacktrace[-1]


def test_a_non_json_return_value_fails_the_job(queue):
    job_id = queue.add("bad", opts=JobOptions(attempts=1))
    make_worker(queue, lambda job: object()).run(burst=True)
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "failed"
    assert "must be JSON-serializable" in job.failed_reason


def lock_lapses_at(queue, job_id: str) -> int:
    """When the job's lock lapses as it stands, ms on Redis's clock (each renewal sets it a lock duration on)."""
    return queue.client.pexpiretime(queue.keys.lock(job_id))


def renewed_after(queue, job_id: str, lock_ms: int) -> Callable[[], bool]:
    """A predicate: the job's lock was renewed after this call (a lapse time a whole lock on from Redis's now)."""
    since = redis_now_ms(queue)
    return lambda: lock_lapses_at(queue, job_id) >= since + lock_ms


def test_locks_are_renewed_so_a_long_job_is_never_marked(queue):
    # Renewed thirty times a lock: a renewal would have to stall for nearly 3 s for the lock to lapse.
    job_id = queue.add("long")
    release = threading.Event()
    worker = make_worker(queue, lambda job: release.wait(60), lock_duration_ms=3000, renew_interval_ms=100)
    thread = start(worker)
    assert wait_until(lambda: queue.get_state(job_id) == "active", 30)
    lapse = lock_lapses_at(queue, job_id)
    assert lapse > 0, "the running job holds a lock with an expiry"
    marked = 0

    def swept_past_the_lapse() -> bool:
        nonlocal marked
        marked += sweep(queue).marked
        return redis_now_ms(queue) > lapse

    # Sweeps until Redis's clock is past the time the lock (as it stood) lapses: only renewals keep it.
    assert wait_until(swept_past_the_lapse, 30, 0.1)
    assert queue.client.exists(queue.keys.lock(job_id)), "the lock lapsed: it was not renewed"
    assert lock_lapses_at(queue, job_id) > lapse, "renewed past that time"
    release.set()
    assert wait_until(lambda: queue.get_state(job_id) == "completed", 30)
    worker.stop()
    thread.join(5)
    assert marked == 0
    assert queue.get_job(job_id).attempts_made == 1


def test_a_worker_that_lost_its_lock_overwrites_nothing(queue, caplog):
    job_id = queue.add("work")
    release = threading.Event()

    def slow(job):
        release.wait(10)
        return "late result"

    worker_a = make_worker(queue, slow, lock_duration_ms=10_000)
    thread = start(worker_a)
    assert wait_until(lambda: queue.get_state(job_id) == "active", 30)

    # Worker A's lock lapses and two sweeps recover the job before it renews.
    kill_lock(queue, job_id)
    sweep(queue)
    assert sweep(queue).recovered == 1
    make_worker(queue, lambda job: "winner").run(burst=True)
    assert queue.get_job(job_id).returnvalue == "winner"

    with caplog.at_level(logging.WARNING, logger="echomq.worker"):
        release.set()
        worker_a.stop()
        thread.join(5)
    job = queue.get_job(job_id)
    assert job.returnvalue == "winner" and job.attempts_made == 2
    assert any("no longer owned" in message for message in caplog.messages)
    assert worker_a.processed == 0


def test_first_stop_lets_the_running_job_finish(queue):
    job_id = queue.add("work")
    queue.add("next")
    release = threading.Event()
    worker = make_worker(queue, lambda job: release.wait(10) and "done")
    thread = start(worker)
    assert wait_until(lambda: queue.get_state(job_id) == "active", 30)
    worker.stop()
    thread.join(0.3)
    assert thread.is_alive(), "the first stop waits for the running job"
    release.set()
    thread.join(5)
    assert not thread.is_alive()
    assert queue.get_state(job_id) == "completed"
    assert queue.counts()["wait"] == 1, "no new job is fetched after a stop"


def stop_twice_while_it_runs(worker: Worker, queue, job_id: str) -> None:
    """Start `worker`, stop it twice once `job_id` runs, and check that run() returned at once."""
    thread = start(worker)
    assert wait_until(lambda: queue.get_state(job_id) == "active", 30)
    worker.stop()
    worker.stop()
    thread.join(8)  # the job waits 10 s
    assert not thread.is_alive(), "the second stop does not wait for the running job"


# Concurrency 1 runs the job on one job thread, 3 on three: a second stop leaves either at once.
@pytest.mark.parametrize("concurrency", [1, 3])
def test_second_stop_returns_at_once_and_the_sweeper_recovers_the_job(queue, concurrency):
    job_id = queue.add("work")
    release = threading.Event()
    stop_twice_while_it_runs(make_worker(queue, lambda job: release.wait(10), lock_duration_ms=300,
                                         concurrency=concurrency), queue, job_id)
    assert queue.get_state(job_id) == "active"
    # Within 8 s of the job's 10: renewed, the 300 ms lock would stay as long as the job runs.
    assert wait_until(lambda: not queue.client.exists(queue.keys.lock(job_id)), 8), "nobody renews the lock"
    sweep(queue)
    assert sweep(queue).recovered == 1
    release.set()


def new_threads(since: set[threading.Thread], name: str) -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread not in since and thread.name == name]


def test_a_job_that_ends_after_a_second_stop_writes_nothing(queue):
    """The job outlives run() (on its job thread); its result is not written, as run() left."""
    job_id = queue.add("work")
    release, ended = threading.Event(), threading.Event()

    def handler(job):
        release.wait(10)
        ended.set()
        return "late"

    existing = set(threading.enumerate())
    stop_twice_while_it_runs(make_worker(queue, handler), queue, job_id)
    [job_thread] = new_threads(existing, "echomq-job-0")
    release.set()
    assert ended.wait(5)
    job_thread.join(5)
    assert not job_thread.is_alive(), "the job thread ends once its job does"
    assert queue.get_state(job_id) == "active", "left to the sweeper, not completed behind run()'s back"
    assert queue.get_job(job_id).returnvalue is None


def test_ctrl_c_while_run_waits_on_its_loop_leaves_the_job_to_the_sweeper(queue):
    """run() on the main thread (a script's own worker): Ctrl-C raises there, as a second stop it stops all."""
    import _thread

    job_id = queue.add("work")
    release = threading.Event()
    worker = make_worker(queue, lambda job: release.wait(60), lock_duration_ms=300)

    def interrupt() -> None:
        if wait_until(lambda: queue.get_state(job_id) == "active", 30):
            _thread.interrupt_main()

    threading.Thread(target=interrupt, daemon=True).start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            worker.run()
        assert time.monotonic() - started < 30, "run() waited for the job"
        assert wait_until(lambda: not queue.client.exists(queue.keys.lock(job_id)), 20), "nobody renews the lock"
        assert sweep(queue).recovered == 0 and sweep(queue).recovered == 1
    finally:
        release.set()


def test_max_jobs_stops_after_that_many(queue):
    queue.add_bulk([NewJob("work") for _ in range(5)])
    worker = make_worker(queue, lambda job: None, concurrency=2)
    assert worker.run(max_jobs=3) == 3
    assert queue.counts()["wait"] == 2


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="shorter than the lock"):
        Worker("q", print, None, WorkerOptions(lock_duration_ms=1000, renew_interval_ms=1000))
    with pytest.raises(ValueError, match="concurrency"):
        Worker("q", print, None, WorkerOptions(concurrency=0))


def test_a_job_refetched_while_its_lost_attempt_still_runs_keeps_its_new_lock(queue, caplog):
    """The same worker runs a recovered job again while its first, lost attempt is still running:
    when the lost attempt ends, the new attempt's lock must still be renewed."""
    job_id = queue.add("work", opts=JobOptions(attempts=5))
    first_may_end, second_may_end = threading.Event(), threading.Event()
    attempts_seen = []

    def handler(job):
        attempts_seen.append(job.attempts_started)
        (first_may_end if job.attempts_started == 1 else second_may_end).wait(60)
        return job.attempts_started

    worker = make_worker(queue, handler, concurrency=2, lock_duration_ms=3000, renew_interval_ms=100)
    thread = start(worker)
    assert wait_until(lambda: attempts_seen == [1], 30)
    kill_lock(queue, job_id)  # the first attempt's lock is gone; two sweeps recover the job at once
    sweep(queue)
    assert sweep(queue).recovered == 1
    assert wait_until(lambda: attempts_seen == [1, 2], 30), "fetched again by the same worker"
    with caplog.at_level(logging.WARNING, logger="echomq.worker"):
        first_may_end.set()  # the lost attempt ends: its result is refused, after its hold was released
        assert wait_until(lambda: "no longer owned" in caplog.text, 30), "the lost attempt ended"
    # Its end let go of the first attempt only: the second's lock is renewed after it.
    assert wait_until(renewed_after(queue, job_id, 3000), 30), "the second attempt's lock is no longer renewed"
    second_may_end.set()
    assert wait_until(lambda: queue.get_state(job_id) == "completed", 30)
    worker.stop()
    thread.join(5)
    assert queue.get_job(job_id).returnvalue == 2


def test_a_job_thread_survives_a_finish_that_fails(queue, caplog):
    first = queue.add("breaks-its-own-hash")
    second = queue.add("work")

    def handler(job):
        if job.id == first:  # the finish script will meet a string where the hash was
            queue.client.delete(queue.keys.job(first))
            queue.client.set(queue.keys.job(first), "not a hash")
        return "ok"

    with caplog.at_level(logging.ERROR, logger="echomq.worker"):
        make_worker(queue, handler, concurrency=1).run(burst=True)
    assert queue.get_state(second) == "completed", "the one job thread lived on"
    assert any("could not finish job" in message for message in caplog.messages)


def test_a_handler_that_raises_system_exit_fails_its_job_and_the_worker_goes_on(queue):
    job_id = queue.add("exits", opts=JobOptions(attempts=1))
    later = queue.add("work")

    def handler(job):
        if job.id == job_id:
            raise SystemExit(3)
        return "ok"

    worker = make_worker(queue, handler, concurrency=1)
    thread = start(worker, burst=True)
    thread.join(5)
    assert not thread.is_alive(), "burst returned: the slot was freed"
    assert queue.get_state(later) == "completed", "the one job thread lived on"
    job = queue.get_job(job_id)
    assert (queue.get_state(job_id), job.failed_reason) == ("failed", "SystemExit: 3")
    assert not queue.client.exists(queue.keys.lock(job_id))


def test_a_worker_that_stops_hands_the_marker_on_to_an_idle_one(queue, named_client):
    release = threading.Event()
    (a_client, a_name), (b_client, b_name) = named_client("worker-a"), named_client("worker-b")
    a = make_worker(queue, lambda job: release.wait(10), a_client, concurrency=2, block_timeout_s=4)
    queue.add("long")
    a_thread = start(a)
    assert wait_until(lambda: queue.counts()["active"] == 1, 3)
    assert wait_until(lambda: blocked(queue, a_name) == 1, 3), "A's free slot has it blocked on the marker"
    a.stop()  # A takes no more jobs, but its marker thread is still blocked
    started = {}
    b = make_worker(queue, lambda job: started.setdefault(job.id, time.monotonic()), b_client,
                    block_timeout_s=60)
    b_thread = start(b)
    assert wait_until(lambda: blocked(queue, b_name) == 1, 3), "B blocks on the marker after A"
    assert blocked(queue, a_name) == 1, "A is still first in line for the marker"
    added_at = time.monotonic()
    job_id = queue.add("quick")
    assert wait_until(lambda: job_id in started, 30)
    assert started[job_id] - added_at < 30, "B woke on the marker, not on its 60 s timeout"
    release.set()
    b.stop()
    for thread in (a_thread, b_thread):
        thread.join(6)


def test_renewal_goes_on_when_another_clients_write_breaks_one_job(queue):
    broken, healthy = queue.add("work"), queue.add("work")
    release = threading.Event()
    worker = make_worker(queue, lambda job: release.wait(60), concurrency=2, lock_duration_ms=3000,
                         renew_interval_ms=100)
    thread = start(worker)
    assert wait_until(lambda: queue.counts()["active"] == 2, 30)
    queue.client.delete(queue.keys.job(broken))
    queue.client.set(queue.keys.job(broken), "overwritten")
    # Renewals that meet the broken job go on: the healthy job's lock is renewed after the write.
    assert wait_until(renewed_after(queue, healthy, 3000), 30), "the renewals stopped at the broken job"
    release.set()
    assert wait_until(lambda: queue.get_state(healthy) == "completed", 30)
    worker.stop()
    thread.join(5)


def test_a_worker_whose_results_no_replica_confirms_says_so_and_goes_on(queue, caplog):
    queue.add_bulk([NewJob("x") for _ in range(3)])
    worker = make_worker(queue, lambda job: None, confirm=Confirm(replicas=1, timeout_ms=20))
    assert worker.run(burst=True) == 3
    assert queue.counts()["completed"] == 3
    assert "0 of 1 replicas confirmed the results" in caplog.text


def deeply_nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_a_poison_job_fails_alone_and_its_batch_mates_run_once(queue, caplog):
    ids = queue.add_bulk([NewJob("work", {"n": n}) for n in range(5)])
    poison = {ids[1]: {"opts": '{"attempts":1e999}'}, ids[2]: {"opts": '{"priority":1e999,"attempts":2}'},
              ids[3]: {"data": deeply_nested(10_001)}}
    for job_id, fields in poison.items():
        queue.client.hset(queue.keys.job(job_id), mapping=fields)
    ran = []
    worker = make_worker(queue, lambda job: ran.append(job.id), concurrency=5)
    assert worker.run(burst=True) == 5
    assert sorted(ran) == sorted([ids[0], ids[4]]), "the good jobs ran, each once"
    assert all(queue.get_state(job_id) == "failed" for job_id in poison)
    # The script's own check of opts names the field when it sees the bad attempts first.
    assert "attempts" in queue.get_job(ids[1]).failed_reason and "1 to 1000000" in queue.get_job(ids[1]).failed_reason
    assert queue.get_job(ids[2]).failed_reason.startswith("cannot run the job: priority must be")
    assert "nested too deeply" in queue.get_job(ids[3]).failed_reason
    assert queue.counts()["completed"] == 2


def test_an_exponential_backoff_after_a_huge_attempt_count_is_bounded(queue):
    job_id = queue.add("work", opts=JobOptions(attempts=1_000_000, backoff=Backoff("exponential", 1000)))
    queue.client.hset(queue.keys.job(job_id), "atm", "999999999999999")
    worker = make_worker(queue, lambda job: 1 / 0)
    thread = start(worker, burst=True)
    thread.join(10)
    assert not thread.is_alive(), "2 ** 999999999999999 would hold the interpreter for ever"
    assert queue.get_state(job_id) == "failed"  # its attempt count is past every ceiling


def test_a_backoff_is_at_most_ten_years():
    assert Backoff("exponential", 1000).delay_before(10**15) == 10 * 365 * 86_400_000
    assert Backoff("exponential", 1000).delay_before(3) == 4000


def test_no_lost_lock_warning_when_renewals_race_normal_finishes(queue, caplog):
    queue.add_bulk([NewJob("work") for _ in range(300)])
    # Renewals every 2 ms: many of them meet jobs that just finished.
    worker = make_worker(queue, lambda job: time.sleep(0.002), concurrency=4, lock_duration_ms=1000,
                         renew_interval_ms=2)
    with caplog.at_level(logging.WARNING, logger="echomq.worker"):
        assert worker.run(burst=True) == 300
    assert [r.getMessage() for r in caplog.records if "lost the lock" in r.getMessage()] == []


def test_a_stop_ends_an_idle_workers_wait_at_once(queue, named_client):
    # An idle worker's wait carries its fetch; the stop ends the wait, and the worker asks once
    # whether Redis ran the fetch (it did not) before it leaves.
    client, name = named_client("cut")
    worker = make_worker(queue, lambda job: None, client, block_timeout_s=60)
    thread = start(worker)
    assert wait_until(lambda: blocked(queue, name) == 1, 30)
    stopped_at = time.monotonic()
    worker.stop()
    thread.join(30)
    assert not thread.is_alive() and time.monotonic() - stopped_at < 30, "the 60 s wait was not ended"


def test_an_idle_worker_stopped_takes_nothing_added_after(queue, named_client):
    client, name = named_client("stop")
    worker = make_worker(queue, lambda job: None, client, block_timeout_s=5)
    thread = start(worker)
    assert wait_until(lambda: blocked(queue, name) == 1, 5)
    worker.stop()
    job_id = queue.add("late")
    thread.join(5)
    assert not thread.is_alive()
    assert queue.get_state(job_id) == "wait"


def test_a_failure_whose_message_holds_a_lone_surrogate_is_written_with_the_others(queue):
    # os.fsdecode keeps an undecodable byte of a file name as a lone surrogate, which UTF-8 cannot carry:
    # the finish call holding it failed, and with it the results written in the same round trip.
    import os

    def handler(job):
        if job.name == "bad":
            raise ValueError("cannot parse " + os.fsdecode(b"report-\xff.csv"))
        return "ok"

    bad = queue.add("bad", opts=JobOptions(attempts=1))
    good = queue.add("good")
    assert make_worker(queue, handler, concurrency=2).run(burst=True) == 2
    assert queue.get_state(good) == "completed"
    failed = queue.get_job(bad)
    assert queue.get_state(bad) == "failed" and failed.failed_reason == "ValueError: cannot parse report-\\udcff.csv"


@pytest.mark.parametrize("concurrency", [1, 8])
def test_an_idle_worker_fetches_once_per_job_at_light_load(queue, concurrency):
    """A fetch that leaves nothing ready says so, and the worker then writes its results without a fetch and
    waits for the marker: one moveToActive per job, not the empty fetches of every slot that frees."""
    from redis.cluster import RedisCluster

    from tests.helpers import running

    if isinstance(queue.client, RedisCluster):
        pytest.skip("MONITOR reaches one node")
    fetches: list[str] = []
    fetch_key = queue.keys.fetch_record("")  # KEYS[9] of every moveToActive call of this queue, and of no other
    monitor = queue.client.monitor()
    monitor.__enter__()

    def watch() -> None:
        try:
            for command in monitor.listen():
                if command["command"].startswith("EVALSHA") and fetch_key in command["command"]:
                    fetches.append(command["command"])
        except Exception:  # the connection closed at the end of the test
            pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    done: list[str] = []
    worker = Worker(queue.name, lambda job: done.append(job.id), queue.client,
                    WorkerOptions(prefix=queue.keys.prefix, concurrency=concurrency, block_timeout_s=30))
    try:
        with running(worker):
            assert wait_until(lambda: fetches, 10), "the worker's first fetch"
            before = len(fetches)
            for n in range(10):
                job_id = queue.add("x", {"n": n})
                assert wait_until(lambda added=job_id: added in done, 30)
            assert wait_until(lambda: queue.get_state(job_id) == "completed", 30)
            during = len(fetches) - before
    finally:
        monitor.connection.disconnect()
        watcher.join(10)
    assert during <= 10 + 2, f"{during} fetches for 10 jobs added one at a time"
