"""The pools, with real child processes and a real Redis: time limits, dead children, recycling, cancel.

Each worker runs on a thread of the test process; with pool="processes" its
children are real spawned processes running tests/pool_jobs.py's handlers,
which record each run in a Redis list of the test's own ("<job id>:<pid>",
":done" appended at the end of the run; a file instead while Redis restarts). A child is only ever looked at, or
killed, by a pid one of those runs recorded, once /proc says it is a
multiprocessing child of this very process.
"""

import functools
import logging
import os
import random
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from echomq_django.core import (
    POOLS,
    Cancel,
    JobOptions,
    NewJob,
    Queue,
    Retention,
    Sweeper,
    Worker,
    WorkerOptions,
    connect,
    now_ms,
)
from tests import pool_jobs
from tests.helpers import Running, kill_lock, running, sweep, wait_until
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.timeout(300)  # up to 6 s each here; the waits are deadlines for a machine ten times slower
LOCK_MS = 2000  # renewals (and so cancels) every second
RENEW_S = LOCK_MS / 2 / 1000
SIGKILL_REASON = "the child process running the job died: killed by SIGKILL (out of memory, or kill -9)"


# -- a worker for these tests -------------------------------------------------------

def make_worker(queue: Queue, pool: str, handler=pool_jobs.by_name, client=None, **options) -> Worker:
    options.setdefault("block_timeout_s", 0.2)
    options.setdefault("lock_duration_ms", LOCK_MS)
    options.setdefault("keep_completed", Retention())
    return Worker(queue.name, handler, client or queue.client, WorkerOptions(prefix=queue.keys.prefix, pool=pool,
                                                                             **options))


# -- what the jobs recorded ---------------------------------------------------------

def runs_key(queue: Queue) -> str:
    return f"{queue.keys.prefix}:runs"


def recording(queue: Queue, redis_url: str, **data) -> dict:
    """Job data that has pool_jobs record the job's runs in the test's list."""
    return {"url": redis_url, "key": runs_key(queue), **data}


def runs(queue: Queue) -> list[tuple[str, int, str]]:
    """(job id, pid, rest) of each entry, in the order they were written; rest is "" for a start."""
    out = []
    for entry in queue.client.lrange(runs_key(queue), 0, -1):
        job_id, pid, *rest = entry.split(":")
        out.append((job_id, int(pid), ":".join(rest)))
    return out


def starts_of(queue: Queue, job_id: str) -> list[int]:
    """The pids that started runs of `job_id`, in order."""
    return [pid for jid, pid, rest in runs(queue) if jid == job_id and rest == ""]


def done_of(queue: Queue, job_id: str) -> list[int]:
    return [pid for jid, pid, rest in runs(queue) if jid == job_id and rest == "done"]


def progress_pid(queue: Queue, job_id: str) -> int | None:
    """The pid the running job reported as its progress (pool_jobs.sleep does, as it starts)."""
    job = queue.get_job(job_id)
    return job.progress["pid"] if job and isinstance(job.progress, dict) else None


def reasons(queue: Queue, event: str, job_id: str) -> list[str]:
    """The `reason` of each `event` (retried, cancelling...) the job emitted, oldest first."""
    return [fields.get("reason", "") for _id, fields in queue.client.xrange(queue.keys.events)
            if fields["event"] == event and fields["jobId"] == job_id]


def state(queue: Queue, job_id: str, expected: str):
    return lambda: queue.get_state(job_id) == expected


# -- processes, by pid --------------------------------------------------------------

def our_child(pid: int) -> bool:
    """Whether `pid` is alive, not a zombie, a multiprocessing child of this process (a pool's child)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()  # the command name, in parentheses, may hold spaces
    return fields[0] != "Z" and int(fields[1]) == os.getpid() and b"--multiprocessing-fork" in cmdline


def gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()


def pool_children() -> set[int]:
    """The pids of every live pool child of this process (snapshots before and after a test)."""
    return {int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit() and our_child(int(entry.name))}


def kill(pid: int) -> None:
    assert our_child(pid), f"pid {pid} is not a pool child of this process"
    os.kill(pid, signal.SIGKILL)


# -- 1. hard time limit ---------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("pool", POOLS)
def test_a_job_past_its_hard_limit_fails_in_time_each_attempt_and_the_worker_goes_on(queue, redis_url, pool):
    # On threads the job checks as it sleeps, so the abandoned thread ends at its next check
    # instead of sleeping on for 30 s after the test.
    slow = queue.add("sleep", recording(queue, redis_url, seconds=30, check=pool == "threads"),
                     opts=JobOptions(attempts=2, time_limit_ms=2000))
    durations = []
    with running(make_worker(queue, pool)):
        for attempt in (1, 2):
            assert wait_until(lambda n=attempt: len(starts_of(queue, slow)) == n, 30), f"attempt {attempt} started"
            started = time.monotonic()
            assert wait_until(lambda n=attempt: queue.get_job(slow).attempts_made == n, 30), f"attempt {attempt} ended"
            durations.append(time.monotonic() - started)
        after = queue.add("noop", recording(queue, redis_url))
        assert wait_until(state(queue, after, "completed"), 30), "the worker went on to the next job"
    assert all(1.5 < seconds < 20 for seconds in durations), durations  # the limit is 2 s, the job 30 s
    job = queue.get_job(slow)
    assert queue.get_state(slow) == "failed"
    assert job.failed_reason == "time limit of 2 s exceeded"
    assert job.attempts_made == 2
    assert job.error_classes == ["echomq_django.core.errors.TimeLimitExceeded"] * 2
    assert reasons(queue, "retried", slow) == ["time limit of 2 s exceeded"]
    assert done_of(queue, slow) == [], "neither attempt ran to its end"
    first, second = starts_of(queue, slow)
    next_pid = queue.get_job(after).returnvalue["pid"]
    if pool == "threads":
        assert first == second == next_pid == os.getpid()
    else:
        assert len({first, second, next_pid}) == 3, "each killed child was replaced by a new one"
        assert gone(first) and gone(second)


# -- 2. soft time limit ----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("pool", POOLS)
def test_a_soft_limit_is_raised_in_the_job_which_cleans_up_and_completes(queue, redis_url, pool):
    # Processes: a signal interrupts the plain sleep; threads: the job's own job.check() raises it.
    per_job = queue.add("soft", recording(queue, redis_url, seconds=30, check=pool == "threads"),
                        opts=JobOptions(soft_time_limit_ms=500, time_limit_ms=10_000))
    worker_wide = queue.add("soft", recording(queue, redis_url, seconds=30, check=pool == "threads"))
    with running(make_worker(queue, pool, soft_time_limit_ms=700)):
        for job_id in (per_job, worker_wide):
            assert wait_until(state(queue, job_id, "completed"), 30), queue.get_job(job_id)
    for job_id, soft_ms in ((per_job, 500), (worker_wide, 700)):
        job = queue.get_job(job_id)
        assert job.returnvalue == "cleaned up"
        assert job.attempts_made == 1
        # One text on both pools, with the limit.
        assert job.logs == [f"cleaning up after: soft time limit of {soft_ms / 1000:g} s exceeded"]
        assert soft_ms <= job.finished_on - job.processed_on < soft_ms + 2500


@pytest.mark.slow
def test_a_soft_limit_that_lands_as_a_job_returns_never_kills_its_child(queue):
    # Each job sleeps as long as its soft limit: the signal lands about when the job returns. Before
    # the return it is raised in the job (which ran past its soft limit, and fails); after, it is
    # ignored; it must never land in the child's own code around the job and kill the child.
    jobs = 300
    opts = JobOptions(attempts=1, soft_time_limit_ms=20, time_limit_ms=10_000)
    queue.add_bulk([NewJob("storm", {"ms": 20}, opts) for _ in range(jobs)])
    with running(make_worker(queue, "processes", concurrency=2, keep_failed=Retention())):
        assert wait_until(lambda: queue.counts()["completed"] + queue.counts()["failed"] == jobs, 60)
    failures = Counter(job.failed_reason for job in queue.get_jobs("failed", 0, jobs))
    assert set(failures) <= {"SoftTimeLimitExceeded: soft time limit of 0.02 s exceeded"}, failures
    pids = {job.returnvalue["pid"] for job in queue.get_jobs("completed", 0, jobs)}
    assert len(pids) <= 2, "no child was replaced"


# -- 3. a child killed mid-job ---------------------------------------------------------

@pytest.mark.slow
def test_a_child_killed_mid_job_fails_the_attempt_at_once_and_a_new_child_retries_it(queue, redis_url):
    job_id = queue.add("sleep", recording(queue, redis_url, seconds=30, first_only=True),
                       opts=JobOptions(attempts=2))
    with running(make_worker(queue, "processes", lock_duration_ms=60_000)):
        assert wait_until(lambda: progress_pid(queue, job_id), 30), "the job started"
        victim = progress_pid(queue, job_id)
        kill(victim)
        killed = time.monotonic()
        assert wait_until(lambda: queue.get_job(job_id).attempts_made >= 1, 30)
        failed_after = time.monotonic() - killed
        assert wait_until(state(queue, job_id, "completed"), 30)
    assert failed_after < 20, "failed at once, not after the lock (60 s) lapsed"
    assert reasons(queue, "retried", job_id) == [SIGKILL_REASON]
    job = queue.get_job(job_id)
    assert job.attempts_made == 2
    rescuer = job.returnvalue["pid"]
    assert starts_of(queue, job_id) == [victim, rescuer] and rescuer != victim
    assert done_of(queue, job_id) == [rescuer]
    assert gone(victim)


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["threads", "processes"])
def test_an_attempt_whose_lock_was_lost_is_stopped_at_the_next_renewal(queue, redis_url, pool):
    # As if the worker had paused past its lock and the sweeper had handed the job to another worker.
    job_id = queue.add("sleep", recording(queue, redis_url, seconds=30, check=pool == "threads"),
                       opts=JobOptions(attempts=3))
    with running(make_worker(queue, pool)):
        assert wait_until(lambda: progress_pid(queue, job_id), 30), "the job started"
        runner = progress_pid(queue, job_id)
        queue.client.hset(queue.keys.job(job_id), "tok", "another-worker")
        taken = time.monotonic()
        if pool == "processes":
            assert wait_until(lambda: gone(runner), 15), "the child running the lost attempt was killed"
        else:
            assert wait_until(lambda: (job_id, runner, "LockLostError") in runs(queue), 15), "its check raised"
        stopped_after = time.monotonic() - taken
    assert stopped_after < RENEW_S + 10, "within a renewal and a slow machine's delay, not the job's 30 s"
    job, job_state = queue.get_job_with_state(job_id)
    assert (job_state, job.token, job.attempts_made) == ("active", "another-worker", 0), "the new owner's"
    assert done_of(queue, job_id) == [], "the lost attempt never finished"


def test_a_child_that_exits_mid_job_fails_the_attempt_with_its_exit_code(queue, redis_url):
    job_id = queue.add("die", recording(queue, redis_url, code=3), opts=JobOptions(attempts=2))
    with running(make_worker(queue, "processes")):
        assert wait_until(state(queue, job_id, "completed"), 30)
    assert reasons(queue, "retried", job_id) == ["the child process running the job died: exited with code 3"]
    first, second = starts_of(queue, job_id)
    assert first != second == queue.get_job(job_id).returnvalue["pid"]


@pytest.mark.slow
def test_a_worker_that_cannot_replace_a_child_stops_and_leaves_its_job_to_the_sweeper(queue, redis_url):
    # The first child starts; every later one fails in its child_init. Failing the job in hand
    # instead would fail every job the worker then took, each without a run (a bad deploy, no memory).
    starts_key = f"{queue.keys.prefix}:child-starts"
    worker = make_worker(queue, "processes", concurrency=1,
                         child_init=functools.partial(pool_jobs.start_once, redis_url, starts_key))
    hung = queue.add("sleep", recording(queue, redis_url, seconds=30), opts=JobOptions(attempts=3, time_limit_ms=1000))
    later = queue.add("noop", recording(queue, redis_url), opts=JobOptions(attempts=1))
    run = Running(worker).start()
    run.thread.join(15)
    assert not run.thread.is_alive(), "the worker stopped by itself"
    assert isinstance(run.error, RuntimeError) and "the child process died while it started (exited with code 1)" \
        in str(run.error), run.error
    # The job taken next (the retry of the hung one, or the later one) is left active for the sweeper.
    assert sorted(queue.get_state(job_id) for job_id in (hung, later)) == ["active", "wait"]
    assert queue.counts()["failed"] == 0, "no job was failed for want of a child"
    assert queue.get_job(hung).attempts_made == 1 and reasons(queue, "retried", hung) == ["time limit of 1 s exceeded"]
    assert len(starts_of(queue, hung)) == 1 and starts_of(queue, later) == []


# -- 4. recycling children ---------------------------------------------------------------

@pytest.mark.slow
def test_a_child_that_grew_past_max_memory_is_replaced_after_its_job(queue, redis_url):
    # A child's own size at rest.
    probe = queue.add("grow", {"mb": 0})
    with running(make_worker(queue, "processes")):
        assert wait_until(state(queue, probe, "completed"), 30)
    at_rest_kb = queue.get_job(probe).returnvalue["rss_kb"]

    # Each job keeps 30 MB more: a child passes the limit on its second job, never on its first.
    limit_kb = at_rest_kb + 45 * 1024
    # A worker process bigger than the limit (a loaded Django project, say): what counts is each
    # child's own size, not the size of the process it was started from.
    ballast = bytearray(b"\x01") * ((limit_kb + 100 * 1024) * 1024)
    ids = queue.add_bulk([NewJob("grow", recording(queue, redis_url, mb=30)) for _ in range(6)])
    try:
        with running(make_worker(queue, "processes", max_memory_per_child_kb=limit_kb)):
            assert wait_until(lambda: queue.counts()["completed"] == 7, 60), queue.counts()
    finally:
        del ballast
    order = [job_id for job_id, _pid, _rest in runs(queue)]
    assert sorted(order) == sorted(ids)
    ran = [queue.get_job(job_id).returnvalue for job_id in order]
    for before, after in zip(ran, ran[1:]):
        grown = before["rss_kb"] > limit_kb
        assert (after["pid"] != before["pid"]) == grown, (limit_kb, ran)
    pids = [r["pid"] for r in ran]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] == pids[5], (limit_kb, ran)
    assert gone(pids[0]) and gone(pids[2]), "a retired child leaves"


@pytest.mark.slow
def test_max_jobs_per_child_replaces_the_child_every_n_jobs(queue, redis_url):
    ids = queue.add_bulk([NewJob("noop", recording(queue, redis_url)) for _ in range(6)])
    with running(make_worker(queue, "processes", max_jobs_per_child=2)):
        assert wait_until(lambda: queue.counts()["completed"] == 6, 60), queue.counts()
    assert sorted(job_id for job_id, _pid, _rest in runs(queue)) == sorted(ids)
    pids = [pid for _job_id, pid, _rest in runs(queue)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4] == pids[5], pids
    assert len(set(pids)) == 3
    assert gone(pids[0]) and gone(pids[2]), "a retired child leaves"


# -- 5. cancel -----------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("pool", POOLS)
def test_cancel_of_jobs_not_started_finished_or_unknown(queue, redis_url, pool):
    waiting = queue.add("noop", recording(queue, redis_url))
    delayed = queue.add("noop", recording(queue, redis_url), opts=JobOptions(delay_ms=1000, attempts=5))
    due = queue.get_job(delayed).timestamp + 1000
    assert queue.cancel(waiting, "not wanted") is Cancel.CANCELLED
    assert queue.cancel(delayed) is Cancel.CANCELLED
    assert queue.client.zscore(queue.keys.delayed, delayed) is None
    for job_id, reason in ((waiting, "cancelled: not wanted"), (delayed, "cancelled")):
        job = queue.get_job(job_id)
        assert queue.get_state(job_id) == "failed"
        assert (job.failed_reason, job.cancel_reason, job.attempts_made) == (reason, reason, 0)
    assert queue.cancel(waiting, "again") is Cancel.FINISHED, "a second cancel changes nothing"
    assert queue.get_job(waiting).failed_reason == "cancelled: not wanted"

    finished = queue.add("noop", recording(queue, redis_url))
    with running(make_worker(queue, pool)):
        assert wait_until(state(queue, finished, "completed"), 30)
        before = queue.client.hgetall(queue.keys.job(finished))
        assert queue.cancel(finished, "too late") is Cancel.FINISHED
        assert queue.client.hgetall(queue.keys.job(finished)) == before
        assert queue.get_state(finished) == "completed"
        assert queue.cancel("nosuchjob") is Cancel.NOT_FOUND
        assert not queue.client.exists(queue.keys.job("nosuchjob"))
        # Once the delayed job would have been due, a later job's run shows the worker looked for work.
        assert wait_until(lambda: now_ms() > due + 100, 15)
        later = queue.add("noop", recording(queue, redis_url))
        assert wait_until(state(queue, later, "completed"), 30)
    assert [job_id for job_id, _pid, _rest in runs(queue)] == [finished, later], "no cancelled job ran"
    counts = queue.counts()
    assert (counts["failed"], counts["completed"], sum(counts.values())) == (2, 2, 4), counts


@pytest.mark.slow
@pytest.mark.parametrize("pool", POOLS)
def test_cancel_of_a_running_job_stops_it_within_a_renewal_and_it_is_never_retried(queue, redis_url, pool):
    # Threads: the job checks as it sleeps (a thread is cancelled cooperatively); processes: it just sleeps.
    job_id = queue.add("sleep", recording(queue, redis_url, seconds=30, check=pool == "threads"),
                       opts=JobOptions(attempts=5))
    after = queue.add("noop", recording(queue, redis_url))
    with running(make_worker(queue, pool)):
        assert wait_until(lambda: progress_pid(queue, job_id), 30), "the job started"
        pid = progress_pid(queue, job_id)
        assert queue.cancel(job_id, "operator said so") is Cancel.STOPPING
        asked = time.monotonic()
        assert queue.cancel(job_id, "twice") is Cancel.STOPPING, "flagged already: the first reason stands"
        assert wait_until(state(queue, job_id, "failed"), 15)
        stopped_after = time.monotonic() - asked
        assert wait_until(state(queue, after, "completed"), 30), "the worker went on"
    assert stopped_after < RENEW_S + 10, stopped_after  # a renewal, and a slow machine's delay; not 30 s
    job = queue.get_job(job_id)
    assert job.failed_reason == job.cancel_reason == "cancelled: operator said so"
    assert job.attempts_made == 1
    assert reasons(queue, "retried", job_id) == []
    assert reasons(queue, "cancelling", job_id) == ["cancelled: operator said so"]
    assert starts_of(queue, job_id) == [pid] and done_of(queue, job_id) == [], "stopped, not run again"
    assert queue.cancel(job_id) is Cancel.FINISHED
    if pool == "processes":
        assert gone(pid), "its child was killed"
        assert queue.get_job(after).returnvalue["pid"] != pid


# -- 6. a storm of kill -9s ---------------------------------------------------------------

@pytest.mark.slow
def test_no_job_is_lost_or_run_twice_while_children_are_killed_at_random(queue, redis_url):
    jobs, kills = 200, 12
    pids_key = f"{queue.keys.prefix}:pids"
    ids = queue.add_bulk([NewJob("storm", recording(queue, redis_url, pids=pids_key, ms=25), JobOptions(attempts=50))
                          for _ in range(jobs)])
    killed: set[int] = set()

    def completed() -> int:
        return queue.counts()["completed"]

    def victims() -> list[int]:
        return [pid for pid in map(int, queue.client.smembers(pids_key)) if pid not in killed and our_child(pid)]

    with running(make_worker(queue, "processes", concurrency=2)):
        while len(killed) < kills and completed() < jobs:
            # A kill after every few completions, so the storm and the work go on together.
            enough = min(completed() + jobs // (kills + 2), jobs)
            wait_until(lambda n=enough: completed() >= n and victims(), 60)
            if candidates := victims():
                victim = random.choice(candidates)
                kill(victim)
                killed.add(victim)
        assert wait_until(lambda: completed() == jobs, 60), queue.counts()
    counts = queue.counts()
    assert counts["completed"] == jobs and sum(counts.values()) == jobs, counts
    assert len(killed) >= kills // 2, "the children kept dying"

    completions = Counter(fields["jobId"] for _id, fields in queue.client.xrange(queue.keys.events)
                          if fields["event"] == "completed")
    assert set(completions) == set(ids) and set(completions.values()) == {1}, "each job completed once"
    started, finished = defaultdict(list), defaultdict(list)
    for job_id, pid, rest in runs(queue):
        (finished if rest == "done" else started)[job_id].append(pid)
    interrupted = 0
    for job_id in ids:
        *earlier, last = started[job_id]
        assert set(earlier) <= killed, f"job {job_id} ran again though no kill ended its run: {started[job_id]}"
        interrupted += bool(earlier)
        *finished_earlier, finished_last = finished[job_id]
        assert finished_last == last == queue.get_job(job_id).returnvalue["pid"]
        assert set(finished_earlier) <= killed, f"job {job_id} finished twice: {finished[job_id]}"
    assert interrupted >= 1, "some kill landed mid-job, and that job was run again"
    assert not any(map(our_child, killed))


# -- 7. a Redis restart -----------------------------------------------------------------------

@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A private redis-server that keeps every write (an AOF synced at each), to be stopped and started again."""
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    server.start()
    yield server
    server.stop()
    server.workdir.cleanup()


@pytest.mark.slow
@pytest.mark.parametrize("retries", ["client retries", "worker retries"])
def test_a_redis_restart_mid_run_loses_no_job_and_runs_none_twice(own_redis, tmp_path, caplog, retries):
    client = connect(own_redis.url)
    # "worker retries": a client that does not retry, so the worker's own loop meets the outage.
    worker_client = connect(own_redis.url, retry=None, retry_on_error=[], socket_connect_timeout=0.5) \
        if retries == "worker retries" else client
    queue = Queue("q", client, prefix="restart")
    jobs, runs_file = 150, tmp_path / "runs"
    # The jobs record their runs in a file: they go on ending while Redis is down.
    ids = queue.add_bulk([NewJob("storm", {"file": str(runs_file), "ms": 10, "tag": True}, JobOptions(attempts=10))
                          for _ in range(jobs)])
    sweeper = Sweeper(connect(own_redis.url), [queue.name], prefix=queue.keys.prefix, interval_ms=300,
                      max_stalled_count=10, lock_duration_ms=LOCK_MS)
    sweeping = threading.Thread(target=sweeper.run, args=(lambda report: None,), daemon=True)
    sweeping.start()
    try:
        with caplog.at_level(logging.ERROR, logger="echomq.worker"), \
                running(make_worker(queue, "processes", concurrency=2, client=worker_client)):
            assert wait_until(lambda: queue.counts()["completed"] > 40, 60)
            own_redis.stop()  # SIGKILL, mid-run
            time.sleep(1.0)  # the outage itself (nothing is waited for)
            own_redis.start()  # same port, same directory: the AOF is replayed
            assert wait_until(lambda: queue.counts()["completed"] == jobs, 60), queue.counts()
    finally:
        sweeper.stop()
        sweeping.join(10)
        client.close()
        worker_client.close()
    if retries == "worker retries":
        assert any("Redis unreachable" in record.getMessage() for record in caplog.records), "it met the outage"
    counts = queue.counts()
    assert counts["completed"] == jobs and sum(counts.values()) == jobs, counts
    entries = runs_file.read_text().split()
    started = Counter(entry.split(":")[0] for entry in entries if not entry.endswith(":done"))
    finished = Counter(entry.split(":")[0] for entry in entries if entry.endswith(":done"))
    assert set(started) == set(finished) == set(ids)
    assert [job_id for job_id, n in started.items() if n > 1] == [], "no child died: nothing may run twice"
    assert [job_id for job_id, n in finished.items() if n > 1] == []
    completions = Counter(fields["jobId"] for _id, fields in client.xrange(queue.keys.events)
                          if fields["event"] == "completed")
    assert set(completions.values()) == {1}, "each job completed once"


@pytest.mark.slow
@pytest.mark.parametrize("report", ["progress", "log"])
def test_a_hard_limit_holds_while_the_jobs_report_waits_for_a_frozen_redis(tmp_path, report):
    server = RedisServer()
    server.start()
    # The worker's client as connect() makes it: against a frozen server each try waits out its
    # socket timeout, and it tries again for minutes. The job is killed at its limit all the same.
    client = connect(server.url)
    queue = Queue("q", client, prefix="frozen")
    runs_file, go = tmp_path / "runs", tmp_path / "go"
    job_id = queue.add("report_when_told", {"file": str(runs_file), "go": str(go), "report": report},
                       opts=JobOptions(attempts=1, time_limit_ms=5000))
    entries = lambda: runs_file.read_text().split() if runs_file.exists() else []  # noqa: E731
    try:
        with running(make_worker(queue, "processes")):
            assert wait_until(entries, 15), "the job started"
            [started] = entries()
            child = int(started.split(":")[1])
            server.process.send_signal(signal.SIGSTOP)
            try:
                go.touch()
                assert wait_until(lambda: f"{job_id}:{child}:reporting" in entries(), 15), entries()
                assert wait_until(lambda: gone(child), 60), "the child outlived its limit while its report waited"
            finally:
                server.process.send_signal(signal.SIGCONT)
            assert wait_until(state(queue, job_id, "failed"), 30)
        assert queue.get_job(job_id).failed_reason == "time limit of 5 s exceeded"
        assert f"{job_id}:{child}:reported" not in entries()
    finally:
        client.close()
        server.stop()
        server.workdir.cleanup()


# -- 8. what the processes pool refuses -------------------------------------------------------

def test_the_processes_pool_refuses_a_handler_it_cannot_send_to_a_child(queue):
    with pytest.raises(ValueError, match="module-level function"):
        make_worker(queue, "processes", handler=lambda job: None)
    make_worker(queue, "threads", handler=lambda job: None)  # threads take any callable


@pytest.mark.slow
def test_a_child_init_that_raises_makes_run_raise_and_leaves_no_child(queue, redis_url):
    before = pool_children()
    pids_key = f"{queue.keys.prefix}:init-pids"
    job_id = queue.add("noop", recording(queue, redis_url))
    worker = make_worker(queue, "processes", concurrency=2,
                         child_init=functools.partial(pool_jobs.fail_to_start, redis_url, pids_key))
    with pytest.raises(RuntimeError, match=r"the child process died while it started \(exited with code 1\)"):
        worker.run()
    started = [int(pid) for pid in queue.client.lrange(pids_key, 0, -1)]
    assert started, "a child ran its child_init"
    assert all(gone(pid) for pid in started)
    assert pool_children() - before == set(), "no child left running"
    assert queue.get_state(job_id) == "wait", "no job taken"


# -- 9. a second stop -----------------------------------------------------------------------------

@pytest.mark.slow
def test_a_second_stop_kills_the_child_of_a_running_job_so_only_the_recovered_copy_runs(queue, redis_url):
    job_id = queue.add("sleep", recording(queue, redis_url, seconds=30, first_only=True),
                       opts=JobOptions(attempts=3))
    run = Running(make_worker(queue, "processes")).start()
    assert wait_until(lambda: progress_pid(queue, job_id), 30), "the job started"
    pid = progress_pid(queue, job_id)
    run.worker.stop()
    run.thread.join(0.5)
    assert run.thread.is_alive() and our_child(pid), "a first stop lets the job run on"
    run.worker.stop()
    run.thread.join(5)
    assert not run.thread.is_alive() and run.error is None
    assert wait_until(lambda: gone(pid), 15), "the child running the job was killed"
    assert queue.get_state(job_id) == "active", "left to the sweeper"

    kill_lock(queue, job_id)  # as if its lock had lapsed
    sweep(queue)
    assert sweep(queue).recovered == 1
    with running(make_worker(queue, "processes")):
        assert wait_until(state(queue, job_id, "completed"), 30)
    rescuer = queue.get_job(job_id).returnvalue["pid"]
    assert starts_of(queue, job_id) == [pid, rescuer] and done_of(queue, job_id) == [rescuer]
