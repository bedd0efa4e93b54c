"""Where a worker's jobs run: on the worker's own threads, or in child processes it keeps.

The worker (worker.py) does all the Redis work and hands each job to a slot,
one job at a time per slot. A slot returns the end of the attempt (a Finish)
and never raises for the job's sake:

- ThreadSlot runs the handler on the slot's thread. A job with a time limit
  runs on a thread of its own, which the slot watches: past the soft limit the
  job is asked to raise SoftTimeLimitExceeded at its next check (Job.check);
  past the hard limit the attempt fails, and the thread, which cannot be
  killed, runs on: it counts among the AbandonedThreads, and keeps a slot of
  the worker taken until it ends.
- ProcessSlot keeps one child process, started once and reused, and sends it
  one job at a time over a pipe. The child only runs the handler; its progress
  and log reports come back through the pipe, and a thread of the slot writes
  them, so that a write waiting for Redis never holds off a time limit. A
  soft limit is a SIGUSR1 that raises SoftTimeLimitExceeded wherever the job
  is; a hard limit, a cancel or a child that dies ends the attempt at once,
  and the next job gets a new child.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import pickle
import queue as threadqueue
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from ..errors import (
    JobCancelled,
    LockLostError,
    PayloadError,
    RateLimited,
    Retry,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
    is_final,
)
from ..producing.tracing import run_traced
from ..protocol.codec import encode_json
from ..protocol.job import Job, Reporter
from ..protocol.scripts import Finish
from ..protocol.times import seconds_text
from .signals import SOFT_LIMIT_SIGNAL, leave_stop_signals_to_the_parent, on_soft_limit_signal

logger = logging.getLogger("echomq.worker")

Handler = Callable[[Job], Any]
POOLS = ("threads", "processes")
_CHILD_STOP_S = 5.0  # how long a child asked to leave may take before it is killed


def class_path(error: BaseException) -> str:
    """The dotted path of an exception's class, as the job hash records it (`errc`)."""
    return f"{type(error).__module__}.{type(error).__qualname__}"


def run_handler(handler: Handler, job: Job) -> Finish:
    """Run the handler; returns the end of the attempt (the job's own errors become a failed Finish)."""
    token = job.token or ""
    try:
        result = run_traced(job, handler)
        value = encode_json(result, f"return value of job {job.id}")
    except RateLimited as limited:  # not a failure: the job waits its turn again
        return Finish(job.id, token, completed=False, value=str(limited), rate_limited=True,
                      backoff_ms=math.ceil(limited.retry_after * 1000))
    except Retry as retry:  # a failed attempt the job asked for, after its own countdown
        backoff_ms = (job.opts.backoff.delay_before(job.attempts_made + 1) if retry.countdown is None
                      else math.ceil(retry.countdown * 1000))
        return Finish(job.id, token, completed=False, value=f"Retry: {retry}", backoff_ms=backoff_ms,
                      error_class=class_path(retry))
    except BaseException as error:  # the job's own failure (SystemExit too): recorded on the job, not raised
        return Finish(
            job.id, token, completed=False, value=f"{type(error).__name__}: {error}",
            stacktrace="" if isinstance(error, PayloadError) else "".join(traceback.format_exception(error)),
            backoff_ms=job.opts.backoff.delay_before(job.attempts_made + 1),
            final=is_final(error),
            error_class=class_path(error),
        )
    return Finish(job.id, token, completed=True, value=value)


def ended(job: Job, reason: str, error: type[BaseException] | None = None, *, final: bool = False) -> Finish:
    """A failed attempt that the pool ended (time limit, cancel, a dead child), retried per the job's options.

    There is no traceback from inside the job: the stack trace entry says what ended it.
    """
    return Finish(job.id, job.token or "", completed=False, value=reason, final=final,
                  backoff_ms=0 if final else job.opts.backoff.delay_before(job.attempts_made + 1),
                  stacktrace=f"{error.__qualname__ if error else 'Ended by the worker'}: {reason}\n",
                  error_class=f"{error.__module__}.{error.__qualname__}" if error else "")


def cancelled(job: Job) -> Finish:
    """The end of a cancelled attempt (moveToFinished records the cancel's own reason)."""
    return ended(job, "cancelled", JobCancelled, final=True)


def soft_limit_exceeded(soft_ms: int) -> SoftTimeLimitExceeded:
    """What a job past its soft limit gets, the same on both pools."""
    return SoftTimeLimitExceeded(f"soft time limit of {seconds_text(soft_ms)} s exceeded")


def over_limit(job: Job, hard_ms: int) -> Finish:
    return ended(job, f"time limit of {seconds_text(hard_ms)} s exceeded", TimeLimitExceeded)


def stopped(job: Job) -> Finish | None:
    """The end of an attempt the worker stopped (a cancel, a lost lock), or None when it was not stopped."""
    if isinstance(job._interrupt, JobCancelled):
        return cancelled(job)
    if isinstance(job._interrupt, LockLostError):  # the sweeper recovered it: its result is refused anyway
        return ended(job, "stopped: this attempt lost its lock", LockLostError)
    return None


class AbandonedThreads:
    """The job threads of a worker that a hard limit gave up on and that still run (threads pool).

    A thread cannot be killed, so each keeps its slot taken until it ends: the
    worker takes that many jobs fewer (see Worker._loop), and never runs more
    job functions at once than its concurrency. `on_change` is called when one
    is added or ends.
    """

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._on_change = on_change
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], float] = {}  # (job id, token) -> when it was abandoned

    @property
    def count(self) -> int:
        return len(self._running)

    def jobs(self) -> list[tuple[str, str]]:
        """(job id, token) of the attempt each one runs."""
        with self._lock:
            return list(self._running)

    def abandon(self, job: Job, done: threading.Event) -> bool:
        """Count the thread running `job` as abandoned, unless it is done (False) by now."""
        with self._lock:
            if done.is_set():
                return False
            self._running[(job.id, job.token or "")] = time.monotonic()
        self._on_change()
        return True

    def finished(self, job: Job, done: threading.Event) -> None:
        """The thread running `job` ends: set `done`, and give its slot back if it was abandoned."""
        with self._lock:
            done.set()
            since = self._running.pop((job.id, job.token or ""), None)
        if since is not None:
            logger.warning("job %s of queue %s: the thread that ran past its time limit ended %.1f s later; "
                           "its slot takes jobs again", job.id, job.queue, time.monotonic() - since)
            self._on_change()


class ThreadSlot:
    """Runs jobs on the calling thread; a job with a time limit on a watched thread of its own."""

    def __init__(self, handler: Handler, abandoned: AbandonedThreads | None = None) -> None:
        self.handler = handler
        self.abandoned = abandoned if abandoned is not None else AbandonedThreads()

    def run(self, job: Job, soft_ms: int, hard_ms: int) -> Finish:
        if end := stopped(job):  # stopped between its fetch and now
            return end
        if not soft_ms and not hard_ms:
            return run_handler(self.handler, job)
        outcome: list[Finish] = []
        done = threading.Event()

        def target() -> None:
            try:
                outcome.append(run_handler(self.handler, job))
            finally:
                self.abandoned.finished(job, done)

        threading.Thread(target=target, name=f"echomq-job-{job.id}", daemon=True).start()
        started = time.monotonic()
        if soft_ms and not done.wait(soft_ms / 1000):
            job.interrupt(soft_limit_exceeded(soft_ms))
        if not done.wait(max(hard_ms / 1000 - (time.monotonic() - started), 0) if hard_ms else None):
            job.interrupt(TimeLimitExceeded(f"time limit of {seconds_text(hard_ms)} s exceeded"))
            if self.abandoned.abandon(job, done):
                logger.error("job %s of queue %s ran past its time limit of %s s: its attempt failed; the thread "
                             "running it cannot be killed and runs on, its slot taken until it ends", job.id,
                             job.queue, seconds_text(hard_ms))
                return over_limit(job, hard_ms)
        return outcome[0]

    def stop(self, job: Job) -> None:
        """A thread is stopped only by the job's own checks (job.interrupt, set by the worker)."""

    def close(self, *, kill: bool = False) -> None:
        pass


class ChildStartError(RuntimeError):
    """No child process could be started: it died while it set up, or the worker stopped meanwhile."""

    def __init__(self, message: str, *, stopped: bool = False) -> None:
        super().__init__(message)
        self.stopped = stopped


class ProcessSlot:
    """One child process, started when first needed and reused, that runs this slot's jobs.

    The job thread that calls run() owns the child while a job runs: it alone
    reaps a child that dies or is killed. stop() (a cancel, a lost lock) and
    close() (the worker's end) from other threads only kill it then.
    """

    def __init__(self, handler: Handler, reporter: Reporter, *, child_init: Callable[[], None] | None = None,
                 max_jobs: int = 0, max_memory_kb: int = 0, name: str = "echomq-child",
                 aborted: threading.Event | None = None) -> None:
        self._handler = pickle.dumps(handler)  # unpickled in the child after child_init (Django set up)
        self._reporter = reporter
        self._child_init = child_init
        self.max_jobs, self.max_memory_kb, self.name = max_jobs, max_memory_kb, name
        self._aborted = aborted or threading.Event()  # the worker's second stop: give up a child's start
        self._process: Any = None  # multiprocessing's SpawnProcess
        self._conn: Connection | None = None
        self._jobs = 0  # jobs the current child has run
        self._retired: list[tuple[Any, Connection, float]] = []  # asked to leave, not yet reaped
        self._current: Job | None = None
        self._closed = False
        self._lock = threading.Lock()  # guards _process, _conn, _current and _closed across threads
        # The reports of the slot's jobs go to a writer thread of their own (see _ask).
        self._reports: threadqueue.SimpleQueue[tuple[int, Job, str, str] | None] = threadqueue.SimpleQueue()
        self._answers: Connection | None = None  # where the writer's answers come back
        self._asks = 0  # reports asked for so far, each one's number
        self._asked = 0  # the number of the report the running job waits for; 0: none

    # -- the child's life --------------------------------------------------

    def launch(self) -> None:
        """Start a child; wait_ready() waits until it can take jobs."""
        context = multiprocessing.get_context("spawn")  # no fork of a process that has threads
        parent, child = context.Pipe()
        process = context.Process(target=_child_main, args=(child, self._handler, self._child_init, os.getpid()),
                                  name=self.name, daemon=False)
        # The child inherits this mask: a Ctrl-C or a SIGTERM to the whole group in its first
        # moments, before it ignores them, waits instead of killing it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            process.start()
            child.close()
            with self._lock:  # before the mask goes: a Ctrl-C held back by it raises there, and close() must
                self._process, self._conn, self._jobs = process, parent, 0  # know the child to kill it
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def wait_ready(self, give_up: threading.Event) -> None:
        """Wait for the launched child to be set up; ChildStartError (and no child) when it died first.

        Also gives up when `give_up` is set (the worker stops), however long the set-up takes.
        """
        process, conn = self._process, self._conn
        assert process is not None and conn is not None
        while not give_up.is_set():
            ready: list[Any] = []
            try:
                ready = wait([conn, process.sentinel], 0.1)
                if conn in ready and conn.recv() == "ready":
                    return
            except (EOFError, OSError):
                pass  # it died: the sentinel says so
            if ready:
                process.join(_CHILD_STOP_S)  # its pipe closes a moment before it exits
                break
        self._take()
        code = _end(process, conn, kill=process.is_alive())  # the code it died with, when it died
        if give_up.is_set():
            raise ChildStartError(f"{self.name}: the worker stopped while its child process started", stopped=True)
        raise ChildStartError(f"{self.name}: the child process died while it started ({_how(code)}); "
                              "its error is on the worker's standard error")

    def close(self, *, kill: bool = False) -> None:
        """The worker's end: ask the children to leave (`kill`: kill them) and wait for them.

        A child that runs a job (a second stop) is killed, and reaped by the thread that watches it.
        """
        self._reports.put(None)  # the report writer's last
        with self._lock:
            self._closed = True
            process, conn = self._process, self._conn
            if self._current is not None:  # a job thread watches this child: it reaps it
                if process is not None:
                    _kill(process)
                process = conn = None
            else:
                self._process = self._conn = None
            retired, self._retired = self._retired, []
        if process is not None and conn is not None:
            _end(process, conn, kill=kill)
        for old, old_conn, _at in retired:
            _end(old, old_conn, kill=kill, asked=True)

    def _take(self) -> tuple[Any, Connection | None]:
        """The current child and its pipe, which the slot no longer holds (None, None: there was none)."""
        with self._lock:
            process, conn = self._process, self._conn
            self._process = self._conn = None
        return process, conn

    def _retire(self) -> None:
        """Ask the child to leave, without waiting: it is reaped later (or killed if it lingers)."""
        process, conn = self._take()
        if process is not None and conn is not None:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
            with self._lock:
                self._retired.append((process, conn, time.monotonic()))

    def _reap_retired(self) -> None:
        lingering = time.monotonic() - _CHILD_STOP_S
        with self._lock:
            done = [entry for entry in self._retired if not entry[0].is_alive() or entry[2] < lingering]
            self._retired = [entry for entry in self._retired if entry not in done]
        for process, conn, _at in done:
            _end(process, conn, kill=True)

    def _discard(self) -> int | None:
        """Kill the current child (if any is left) and reap it; its exit code."""
        process, conn = self._take()
        return _end(process, conn, kill=True) if process is not None and conn is not None else None

    # -- jobs --------------------------------------------------------------

    def run(self, job: Job, soft_ms: int, hard_ms: int) -> Finish:
        """Run `job` in the child (started first when there is none); ChildStartError when none can start."""
        with self._lock:  # from here on a cancel kills the child that runs or starts for this job (stop)
            if self._closed:
                return ended(job, "the worker stopped before the job started")  # not written: the loop is gone
            if end := stopped(job):
                return end
            self._current = job
        try:
            self._reap_retired()
            if self._process is None or not self._process.is_alive():
                self._discard()
                try:
                    self.launch()
                except OSError as error:  # no fork (memory, process limits)
                    raise ChildStartError(f"{self.name}: could not start a child process: {error}") from None
                try:
                    self.wait_ready(self._aborted)
                except ChildStartError:
                    if end := stopped(job):  # killed for a cancel or a lost lock while it started
                        return end
                    raise
            if end := stopped(job):  # stopped before its child could be killed for it
                return end
            return self._run(job, soft_ms, hard_ms)
        except BaseException:  # the child may still run the job (or wait for an answer): it must not
            self._discard()
            raise
        finally:
            with self._lock:
                self._current = None

    def stop(self, job: Job) -> None:
        """Kill the child if it runs or starts for `job` (a cancel, a lost lock); run() then ends the attempt."""
        with self._lock:
            if self._current is job and self._process is not None:
                _kill(self._process)

    def _run(self, job: Job, soft_ms: int, hard_ms: int) -> Finish:
        process, conn = self._process, self._conn
        assert process is not None and conn is not None
        started = time.monotonic()
        try:
            conn.send((replace(job), soft_ms))  # the copy has no reporter: the child attaches its own
        except (OSError, ValueError):
            pass  # it died meanwhile: the wait below sees it
        soft_at = started + soft_ms / 1000 if soft_ms else None
        hard_at = started + hard_ms / 1000 if hard_ms else None
        try:
            while True:
                deadline = min((t for t in (soft_at, hard_at) if t is not None), default=None)
                timeout = None if deadline is None else max(deadline - time.monotonic(), 0)
                answers = self._answers if self._asked else None
                ready = wait([conn, process.sentinel, *([answers] if answers else [])], timeout)
                if conn in ready:
                    try:
                        message = conn.recv()
                    except (EOFError, OSError):
                        return self._died(job)
                    except Exception as error:  # not what a child of ours sends: it cannot be trusted
                        logger.error("job %s of queue %s: its child process sent what cannot be read (%s)",
                                     job.id, job.queue, error)
                        return self._died(job, wait=False)
                    if message[0] == "done":
                        _kind, finish, peak_kb, tainted = message
                        self._done(peak_kb, tainted)
                        return cast(Finish, finish)
                    if hard_at is None or time.monotonic() < hard_at:  # else it is killed below, unwritten
                        self._ask(job, message[0], message[1])
                elif process.sentinel in ready:
                    return self._died(job)
                if answers is not None and answers in ready:
                    number, written = answers.recv()
                    if number == self._asked:
                        self._asked = 0
                        with contextlib.suppress(OSError, ValueError):
                            conn.send(written)
                # The deadlines, whatever the wait returned for: a job that reports without a pause
                # must not outlive them either.
                now = time.monotonic()
                if hard_at is not None and now >= hard_at:
                    logger.error("job %s of queue %s ran past its time limit of %s s: its child process is killed",
                                 job.id, job.queue, seconds_text(hard_ms))
                    self._discard()
                    return over_limit(job, hard_ms)
                if soft_at is not None and now >= soft_at:
                    soft_at = None
                    with contextlib.suppress(OSError):
                        os.kill(process.pid, SOFT_LIMIT_SIGNAL)
        finally:
            self._asked = 0  # a report of this attempt not written yet never will be

    def _ask(self, job: Job, kind: str, text: str) -> None:
        """Have a report of the child's job written off this thread; its answer comes back on _answers.

        The thread that runs the job must stay free to end it: a write that waits for Redis
        (an outage, a frozen server: the client's retries take minutes) would hold a time
        limit off for as long. One writer per slot keeps a job's reports in order.
        """
        if self._answers is None:
            self._answers, answers = multiprocessing.Pipe(duplex=False)
            threading.Thread(target=self._write_reports, args=(answers,), name=f"{self.name}-reports",
                             daemon=True).start()
        self._asks += 1
        self._asked = self._asks
        self._reports.put((self._asks, job, kind, text))

    def _write_reports(self, answers: Connection) -> None:
        """The slot's report writer: each report the job still waits for, written and answered in turn."""
        while (report := self._reports.get()) is not None:
            number, job, kind, text = report
            if number == self._asked:  # else its attempt ended meanwhile
                written = self._report(job, kind, text)
                with contextlib.suppress(OSError, ValueError):
                    answers.send((number, written))
        answers.close()

    def _report(self, job: Job, kind: str, text: str) -> bool:
        """Write a report of the child's job; False when it was not written (the job goes on)."""
        try:
            return (self._reporter.progress if kind == "progress" else self._reporter.log)(job, text)
        except Exception as error:  # a report is not the job's result: the child must get its answer
            logger.warning("job %s of queue %s: its %s was not recorded (%s)", job.id, job.queue, kind, error)
            return False

    def _done(self, peak_kb: int, tainted: bool) -> None:
        """Account for a job the child finished; replace the child when it has done its share.

        `tainted`: the soft limit interrupted the job while threads it started
        (an async job's event loop) may still run it, so the child is killed
        before the attempt's end is written: none of its code outlives it.
        """
        self._jobs += 1
        if tainted:
            logger.info("%s: replacing the child process: its job's soft limit left threads running", self.name)
            self._discard()
        elif self.max_jobs and self._jobs >= self.max_jobs:
            logger.info("%s: retiring the child process after %d job(s)", self.name, self._jobs)
            self._retire()
        elif self.max_memory_kb and peak_kb > self.max_memory_kb:
            logger.info("%s: retiring the child process, which grew to %d MB", self.name, peak_kb // 1024)
            self._retire()

    def _died(self, job: Job, *, wait: bool = True) -> Finish:
        if wait and self._process is not None:
            self._process.join(_CHILD_STOP_S)  # its pipe closes a moment before it exits: wait for its exit code
        how = _how(self._discard())
        if end := stopped(job):
            return end
        logger.error("job %s of queue %s: the child process running it died (%s)", job.id, job.queue, how)
        return ended(job, f"the child process running the job died: {how}")


def _kill(process: Any) -> None:
    """SIGKILL a child and whatever it started (its process group, see _child_main)."""
    with contextlib.suppress(OSError, ValueError):  # gone, or already reaped and closed
        if process.exitcode is not None:  # reaped: its pid may be another process's by now
            return
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:  # not yet a group of its own
            process.kill()


def _end(process: Any, conn: Connection, *, kill: bool, asked: bool = False) -> int | None:
    """End a child: ask it to leave (unless `kill`, or already `asked`), kill it past _CHILD_STOP_S; its exit code."""
    if kill:
        _kill(process)
    elif not asked:
        with contextlib.suppress(OSError, ValueError):
            conn.send(None)
    process.join(None if kill else _CHILD_STOP_S)
    if process.exitcode is None:
        _kill(process)
        process.join()
    code: int | None = process.exitcode
    conn.close()
    process.close()
    return code


def _how(code: int | None) -> str:
    """How a child process ended, from its exit code, in words."""
    if code is None:
        return "it is gone"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return f"killed by {name}" + (" (out of memory, or kill -9)" if -code == signal.SIGKILL else "")
    return f"exited with code {code}"


# -- in the child ------------------------------------------------------------

class _Child:
    """The child's side: runs jobs sent over the pipe, and is the jobs' reporter (the worker writes)."""

    def __init__(self, conn: Connection, handler: Handler) -> None:
        self.conn, self.handler = conn, handler
        self.pipe = threading.Lock()  # one exchange at a time: a job's threads share the pipe
        self.job: Job | None = None  # the job being run: reports of any other are not sent
        self.running = False  # the handler runs: a soft limit is raised in it
        self.asking = False  # the main thread waits for a report's answer: a soft limit waits too
        self.soft_pending = False
        self.soft_raised = False
        self.soft_ms = 0  # the running job's soft limit, for its message

    def progress(self, job: Job, progress_json: str) -> bool:
        return self._ask(job, "progress", progress_json)

    def log(self, job: Job, line: str) -> bool:
        return self._ask(job, "log", line)

    def _ask(self, job: Job, kind: str, text: str) -> bool:
        # A soft limit must not land between the question and its answer (the
        # answer would stay in the pipe, read as the next job): it is noted,
        # and raised once the answer is in. Signal handlers run on the main
        # thread only, so only its exchanges need this.
        main = threading.current_thread() is threading.main_thread()
        with self.pipe:
            if job is not self.job:  # from a thread a finished job left behind
                return False
            self.asking = main
            try:
                self.conn.send((kind, text))
                answer = bool(self.conn.recv())
            finally:
                self.asking = False
        if main and self.soft_pending:
            self.soft_pending = False
            self._raise_soft()
        return answer

    def on_soft_limit(self, signum: int, frame: Any) -> None:
        if self.asking:
            self.soft_pending = True
        elif self.running:
            self._raise_soft()

    def _raise_soft(self) -> None:
        self.soft_raised = True
        raise soft_limit_exceeded(self.soft_ms)

    def call(self, job: Job) -> Any:
        """The handler, marked as running only inside run_handler's try (a late signal fails the job, at worst)."""
        self.running = True
        try:
            return self.handler(job)
        finally:
            self.running = False

    def serve(self) -> None:
        while True:
            try:
                sent = self.conn.recv()
            except (EOFError, OSError):
                return  # the worker is gone
            if sent is None:
                return
            job, self.soft_ms = sent
            job.attach(self)
            threads, self.soft_raised, self.soft_pending = threading.active_count(), False, False
            with self.pipe:
                self.job = job
            finish = run_handler(self.call, job)
            tainted = self.soft_raised and threading.active_count() > threads
            with self.pipe:  # after any report in progress; none of this job's is sent from here on
                self.job = None
                self.conn.send(("done", finish, _peak_rss_kb(), tainted))


def _die_with(parent_pid: int) -> None:
    """Have the kernel kill this child when the worker dies (Linux), so a job never runs on without it."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it died before the line above took effect
        os._exit(1)


def _peak_rss_kb() -> int:
    """This child's own peak resident size, in KB.

    Not ru_maxrss alone: on Linux a spawned child keeps, across its exec, the
    high-water mark of the worker it was forked from, so every child of a
    worker bigger than the limit would seem past it after its first job.
    VmHWM is the peak of this process image only.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS, KB elsewhere


def _child_main(conn: Connection, handler_blob: bytes, child_init: Callable[[], None] | None,
                parent_pid: int) -> None:
    # Signals are the worker's business: a SIGTERM to the whole cgroup (systemd)
    # must not break a child's job. They came blocked (see launch).
    leave_stop_signals_to_the_parent()
    # A group of its own, so a kill (time limit, cancel) takes whatever the job started too.
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    _die_with(parent_pid)
    if child_init is not None:
        child_init()
    child = _Child(conn, pickle.loads(handler_blob))
    on_soft_limit_signal(child.on_soft_limit)
    conn.send("ready")
    child.serve()
