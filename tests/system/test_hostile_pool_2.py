"""A second hostile pass over the processes pool (process_slot.py, child_side.py, worker.py), after the first's fixes.

Real child processes and a real Redis; handlers in tests/hostile_pool_jobs_2.py and
tests/hostile_pool_jobs.py; helpers from tests/system/test_hostile_pool.py. The comment above a test
says the defect it found, fixed since; the others checked something that held.
"""


import pytest
import redis

from echomq_django.core import JobOptions, Queue, Worker, WorkerOptions
from tests import hostile_pool_jobs as jobs
from tests.helpers import Running, wait_until
from tests.system import hostile_pool_jobs_2 as jobs2
from tests.system.test_hostile_pool import data, gone, make, pid_of, records, running

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def init_pids(queue: Queue, init_key: str) -> list[int]:
    return [pid_of(entry) for entry in queue.client.lrange(init_key, 0, -1) if entry.startswith("init:")]


def replacement_starting(queue: Queue, redis_url: str, worker_options: dict, monkeypatch) -> tuple[Running, str, int]:
    """A worker (slow child set-up, gated by the test) whose first job's child was killed at its hard limit,
    and a second job whose replacement child is now in its set-up: (the run, the second job, that child's pid)."""
    init_key = f"{queue.keys.prefix}:init"
    monkeypatch.setenv("HOSTILE_URL", redis_url)
    monkeypatch.setenv("HOSTILE_INIT_KEY", init_key)
    first = queue.add("sleeper", data(queue, redis_url, seconds=30), opts=JobOptions(attempts=1, time_limit_ms=200))
    run = Running(make(queue, jobs2.by_name, child_init=jobs.slow_child_init, **worker_options)).start()
    assert wait_until(lambda: queue.client.llen(init_key) == 1, 15)
    queue.client.rpush(init_key + ":go", "go")  # the first child's set-up ends
    assert wait_until(lambda: queue.get_state(first) == "failed", 15)
    second = queue.add("noop", data(queue, redis_url), opts=JobOptions(attempts=3))
    assert wait_until(lambda: len(init_pids(queue, init_key)) == 2, 15), "no child was started for the second job"
    return run, second, init_pids(queue, init_key)[1]


# -- defects ------------------------------------------------------------------------

# process_slot.py ProcessSlot.run (the `except ChildStartError` after wait_ready): a renewal that finds the job's lock
# lost while its replacement child is still in its set-up kills that child (stop), as it should; wait_ready then sees a
# child that died while it started, run() re-raises it (only a cancel is excused there), and the worker takes it for
# "cannot start children": it stops with RuntimeError and, as after a second stop, kills every other running job
def test_a_lock_lost_while_the_jobs_child_starts_does_not_stop_the_worker(queue, redis_url, monkeypatch):
    run, second, starting = replacement_starting(queue, redis_url, {"lock_duration_ms": 1000}, monkeypatch)
    try:
        # As if the worker had paused past the lock and the sweeper had handed the job on.
        queue.client.hset(queue.keys.job(second), "tok", "another-worker")
        assert wait_until(lambda: gone(starting), 15), "the renewal killed the child starting for the lost attempt"
        third = queue.add("noop", data(queue, redis_url), opts=JobOptions(attempts=1))
        queue.client.rpush(f"{queue.keys.prefix}:init:go", "go")  # for the next child's set-up
        assert wait_until(lambda: queue.get_state(third) == "completed" or not run.thread.is_alive(), 15)
        assert run.error is None and run.thread.is_alive(), f"the worker stopped: {run.error!r}"
        assert queue.get_state(third) == "completed"
    finally:
        queue.client.rpush(f"{queue.keys.prefix}:init:go", "go", "go")
        run.stop(15)


# process_slot.py ProcessSlot._run (the report branch): nothing kills the child when an exception leaves _run while the
# child runs the job. The report is written by the worker's _Reporter, which catches only UNREACHABLE and ResponseError;
# anything else (here UnicodeEncodeError: a log line holding a lone surrogate, as os.listdir decodes a non-UTF-8 file
# name, written with a client that encodes strictly, redis-py's default) leaves run(); the job thread drops the attempt
# ("the sweeper will recover it") and releases its lock, while the child, alive, still waits for the answer to its
# report. The next job is sent to that child: it is read as the *answer*, the first job runs on (beside its recovery by
# the sweeper: two runs), the second never runs, and the first one's result is returned as the second's.
def test_a_report_the_worker_cannot_write_never_leaves_the_child_running_its_job(queue, redis_url):
    # Now: a log line with a lone surrogate is written with the surrogate escaped (Job.log), on
    # either pool; and any other exception out of _run ends the child before it is raised. A client
    # that encodes strictly is refused at once (require_text_replies); the escape is checked on one that
    # replaces, which without it would write "?" for the surrogate.
    go = f"{queue.keys.prefix}:go"
    with pytest.raises(ValueError, match="encoding_errors"):
        Worker(queue.name, jobs2.by_name, redis.Redis.from_url(redis_url, decode_responses=True))
    client = redis.Redis.from_url(redis_url, decode_responses=True, encoding_errors="replace")
    first = queue.add("surrogate_log", data(queue, redis_url, go=go, seconds=10), opts=JobOptions(attempts=1))
    worker = Worker(queue.name, jobs2.by_name, client, WorkerOptions(prefix=queue.keys.prefix, pool="processes",
                                                                     concurrency=1, lock_duration_ms=2000,
                                                                     block_timeout_s=0.2))
    run = Running(worker).start()
    try:
        assert wait_until(lambda: records(queue, "start"), 15)
        second = queue.add("noop", data(queue, redis_url), opts=JobOptions(attempts=1))
        queue.client.rpush(go, "go")
        assert wait_until(lambda: {queue.get_state(first), queue.get_state(second)} == {"completed"}, 15), \
            records(queue)
        [line] = queue.get_job(first).logs
        assert "\\udc" in line, line
        starts = [entry.split(":")[1] for entry in records(queue, "start")]
        assert starts == [first, second], "each ran once, the second after the first"
    finally:
        queue.client.rpush(go, "go")
        run.stop(15)
        client.close()


# child_side.py _Child._ask: a child's pipe is shared by every thread of the job, without a lock: two threads' reports
# (job.log, update_progress from a job that fans its work out to threads) read each other's answers, and a reader
# that takes the tail of one answer as the length of the next desynchronises the pipe (Connection.recv is not
# thread-safe). On the threads pool the same job logs all its lines.
def test_a_job_that_reports_from_several_threads_completes_with_all_its_lines(queue, redis_url):
    ids = [queue.add("threaded_logs", data(queue, redis_url, threads=8, lines=100), opts=JobOptions(attempts=1))
           for _ in range(4)]
    with running(make(queue, jobs2.by_name, max_log_lines=1000, concurrency=2)):
        assert wait_until(lambda: all(queue.get_state(job_id) in ("completed", "failed") for job_id in ids), 40)
    failures = {job_id: queue.get_job(job_id).failed_reason for job_id in ids
                if queue.get_state(job_id) != "completed"}
    assert failures == {}
    assert [queue.get_job(job_id).log_count for job_id in ids] == [800] * 4


# The same pipe, after the job: a thread the job left (a flusher, a callback) that reports later sends its question
# while the child waits for its next job; the worker reads it as the *next* job's report (the line is written to the
# wrong job) and its answer goes to whichever of the child's two readers takes it: read as the next job, the child
# dies (`True.attach`), and the next job fails an attempt it never ran. Nothing like `tainted` covers this case.
def test_a_report_from_a_thread_a_finished_job_left_never_reaches_the_next_job(queue, redis_url):
    go = f"{queue.keys.prefix}:go"
    first = queue.add("late_logger", data(queue, redis_url, go=go, seconds=10), opts=JobOptions(attempts=1))
    with running(make(queue, jobs2.by_name)):
        assert wait_until(lambda: queue.get_state(first) == "completed", 15)
        queue.client.rpush(go, "go")  # the leftover thread reports now: its question waits in the pipe
        later = [queue.add("noop", data(queue, redis_url), opts=JobOptions(attempts=1)) for _ in range(3)]
        assert wait_until(lambda: all(queue.get_state(job_id) in ("completed", "failed") for job_id in later), 15)
    wrong = {job_id: queue.get_job(job_id).logs for job_id in later if queue.get_job(job_id).logs}
    failed = {job_id: queue.get_job(job_id).failed_reason for job_id in later
              if queue.get_state(job_id) != "completed"}
    assert (wrong, failed) == ({}, {}), f"records: {records(queue)}"


# child_side.py child_main: a child ignores SIGINT and SIGTERM (SIG_IGN), and an ignored disposition survives fork and
# exec: every process a job starts ignores them too, so a job that stops its helper with terminate() (SIGTERM), as
# subprocess, multiprocessing and most libraries do, waits for ever (or until its time limit). A Python helper
# started with SIGINT ignored never raises KeyboardInterrupt either. Since the child is in a process group of its
# own (setpgid), the terminal's Ctrl-C no longer reaches it: SIG_IGN is not needed past the start-up mask.
def test_a_job_can_stop_a_helper_process_with_sigterm(queue, redis_url):
    job_id = queue.add("stops_a_helper", data(queue, redis_url), opts=JobOptions(attempts=1))
    with running(make(queue, jobs2.by_name)):
        assert wait_until(lambda: queue.get_state(job_id) == "completed", 20)
    helpers = [pid_of(entry) for entry in records(queue, "helper")]
    assert all(gone(pid) for pid in helpers)
    assert records(queue, "helper-ignored-SIGTERM") == [], queue.get_job(job_id).returnvalue
    assert queue.get_job(job_id).returnvalue == "helper exited -15 (SIGTERM)"


# -- what held up ---------------------------------------------------------------------

def test_the_threads_pool_runs_the_same_jobs_as_a_baseline(queue, redis_url):
    """The jobs above are sound: on the threads pool they complete, all lines logged, the helper stopped."""
    logs = queue.add("threaded_logs", data(queue, redis_url, threads=4, lines=150), opts=JobOptions(attempts=1))
    helper = queue.add("stops_a_helper", data(queue, redis_url), opts=JobOptions(attempts=1))
    with running(make(queue, jobs2.by_name, pool="threads", concurrency=2, max_log_lines=1000)):
        assert wait_until(lambda: all(queue.get_state(j) == "completed" for j in (logs, helper)), 20)
    assert queue.get_job(logs).log_count == 600
    assert queue.get_job(helper).returnvalue == "helper exited -15 (SIGTERM)"


def test_a_cancel_while_the_jobs_child_starts_ends_the_attempt_and_the_worker_goes_on(queue, redis_url, monkeypatch):
    """The cancel's twin of the first defect: a cancel is excused in run(), so the worker goes on."""
    run, second, starting = replacement_starting(queue, redis_url, {"lock_duration_ms": 1000}, monkeypatch)
    try:
        queue.cancel(second, "stop it")
        assert wait_until(lambda: gone(starting), 15)
        assert wait_until(lambda: queue.get_state(second) == "failed", 15)
        third = queue.add("noop", data(queue, redis_url), opts=JobOptions(attempts=1))
        queue.client.rpush(f"{queue.keys.prefix}:init:go", "go")
        assert wait_until(lambda: queue.get_state(third) == "completed", 15)
        assert run.error is None and run.thread.is_alive()
    finally:
        queue.client.rpush(f"{queue.keys.prefix}:init:go", "go", "go")
        run.stop(15)


def test_a_second_stop_while_a_child_starts_leaves_no_child(queue, redis_url, monkeypatch):
    """close(kill=True) while a job thread is in wait_ready: the starting child is killed, nothing lingers."""
    run, _second, starting = replacement_starting(queue, redis_url, {}, monkeypatch)
    run.worker.stop()
    run.worker.stop()
    run.thread.join(10)
    assert not run.thread.is_alive() and run.error is None
    assert wait_until(lambda: gone(starting), 15)
