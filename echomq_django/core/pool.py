"""Where a worker's jobs run: on the worker's own threads, or in child processes it keeps.

The worker (worker.py) does all the Redis work and hands each job to a slot,
one job at a time per slot. A slot returns the end of the attempt (a Finish)
and never raises for the job's sake:

- ThreadSlot runs the handler on the slot's thread. A job with a time limit
  runs on a thread of its own, which the slot watches: past the soft limit the
  job is asked to raise SoftTimeLimitExceeded at its next check (Job.check);
  past the hard limit the attempt fails and the slot moves on, leaving the
  thread to run out unobserved (a thread cannot be killed).
- ProcessSlot keeps one child process, started once and reused, and sends it
  one job at a time over a pipe. The child only runs the handler; its progress
  and log reports come back through the pipe, and the worker writes them. A
  soft limit is a SIGUSR1 that raises SoftTimeLimitExceeded wherever the job
  is; a hard limit, a cancel or a child that dies ends the attempt at once,
  and the next job gets a new child.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any

from .errors import JobCancelled, LockLostError, PayloadError, SoftTimeLimitExceeded, TimeLimitExceeded, is_final
from .job import Job, Reporter, encode_json
from .scripts import Finish

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
        result = handler(job)
        value = encode_json(result, f"return value of job {job.id}")
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


def seconds(ms: int) -> str:
    return f"{ms / 1000:g}"


def over_limit(job: Job, hard_ms: int) -> Finish:
    return ended(job, f"time limit of {seconds(hard_ms)} s exceeded", TimeLimitExceeded)


def _is_cancelled(job: Job) -> bool:
    return isinstance(job._interrupt, JobCancelled)


class ThreadSlot:
    """Runs jobs on the calling thread; a job with a time limit on a watched thread of its own."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def run(self, job: Job, soft_ms: int, hard_ms: int) -> Finish:
        if _is_cancelled(job):  # cancelled between its fetch and now
            return cancelled(job)
        if not soft_ms and not hard_ms:
            return run_handler(self.handler, job)
        outcome: list[Finish] = []
        done = threading.Event()

        def target() -> None:
            try:
                outcome.append(run_handler(self.handler, job))
            finally:
                done.set()

        threading.Thread(target=target, name=f"echomq-job-{job.id}", daemon=True).start()
        started = time.monotonic()
        if soft_ms and not done.wait(soft_ms / 1000):
            job.interrupt(SoftTimeLimitExceeded(f"soft time limit of {seconds(soft_ms)} s exceeded"))
        if not done.wait(max(hard_ms / 1000 - (time.monotonic() - started), 0) if hard_ms else None):
            job.interrupt(TimeLimitExceeded(f"time limit of {seconds(hard_ms)} s exceeded"))
            logger.error("job %s of queue %s ran past its time limit of %s s: its attempt failed; the thread "
                         "running it cannot be killed and runs on unobserved", job.id, job.queue, seconds(hard_ms))
            return over_limit(job, hard_ms)
        return outcome[0]

    def stop(self, job: Job) -> None:
        """A thread is stopped only by the job's own checks (job.interrupt, set by the worker)."""

    def close(self, *, kill: bool = False) -> None:
        pass


class ProcessSlot:
    """One child process, started when first needed and reused, that runs this slot's jobs."""

    def __init__(self, handler: Handler, reporter: Reporter, *, child_init: Callable[[], None] | None = None,
                 max_jobs: int = 0, max_memory_kb: int = 0, name: str = "echomq-child") -> None:
        self._handler = pickle.dumps(handler)  # unpickled in the child after child_init (Django set up)
        self._reporter = reporter
        self._child_init = child_init
        self.max_jobs, self.max_memory_kb, self.name = max_jobs, max_memory_kb, name
        self._process: Any = None  # multiprocessing's SpawnProcess
        self._conn: Connection | None = None
        self._jobs = 0  # jobs the current child has run
        self._current: Job | None = None
        self._lock = threading.Lock()  # between run() and stop() (the renewal thread's cancel)

    # -- the child's life --------------------------------------------------

    def launch(self) -> None:
        """Start a child; wait_ready() waits until it can take jobs."""
        context = multiprocessing.get_context("spawn")  # no fork of a process that has threads
        parent, child = context.Pipe()
        process = context.Process(target=_child_main, args=(child, self._handler, self._child_init, os.getpid()),
                                  name=self.name, daemon=False)
        process.start()
        child.close()
        self._process, self._conn, self._jobs = process, parent, 0

    def wait_ready(self) -> None:
        """Wait for the launched child to be set up; RuntimeError (and no child) when it died first."""
        process, conn = self._process, self._conn
        assert process is not None and conn is not None
        with contextlib.suppress(EOFError, OSError):
            if conn in wait([conn, process.sentinel]) and conn.recv() == "ready":
                return
        process.join()
        code = process.exitcode  # read before close(), after which the process object refuses it
        self.close(kill=True)
        raise RuntimeError(f"{self.name}: the child process died while it started ({_how(code)}); "
                           "its error is on the worker's standard error")

    def close(self, *, kill: bool = False) -> None:
        """Ask the child to leave (`kill`: kill it at once) and wait for it."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if process is None or conn is None:
            return
        if not kill:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
            process.join(_CHILD_STOP_S)
        if process.is_alive():
            process.kill()
            process.join()
        conn.close()
        process.close()

    # -- jobs --------------------------------------------------------------

    def run(self, job: Job, soft_ms: int, hard_ms: int) -> Finish:
        if self._process is None or not self._process.is_alive():
            self.close(kill=True)
            try:
                self.launch()
                self.wait_ready()
            except (RuntimeError, OSError) as error:
                logger.error("%s", error)
                return ended(job, f"no child process could be started to run the job: {error}")
        with self._lock:  # a cancel from here on kills the child (stop)
            if _is_cancelled(job):
                return cancelled(job)
            self._current = job
        try:
            return self._run(job, soft_ms, hard_ms)
        finally:
            with self._lock:
                self._current = None

    def stop(self, job: Job) -> None:
        """Kill the child if it is running `job` (a cancel); run() then ends the attempt."""
        with self._lock:
            process = self._process
            if self._current is job and process is not None:
                with contextlib.suppress(OSError, ValueError):  # it was closed meanwhile
                    process.kill()

    def _run(self, job: Job, soft_ms: int, hard_ms: int) -> Finish:
        process, conn = self._process, self._conn
        assert process is not None and conn is not None
        started = time.monotonic()
        try:
            conn.send(replace(job))  # the copy has no reporter: the child attaches its own
        except (OSError, ValueError):
            pass  # it died meanwhile: the wait below sees it
        soft_at = started + soft_ms / 1000 if soft_ms else None
        hard_at = started + hard_ms / 1000 if hard_ms else None
        while True:
            deadline = min((t for t in (soft_at, hard_at) if t is not None), default=None)
            timeout = None if deadline is None else max(deadline - time.monotonic(), 0)
            ready = wait([conn, process.sentinel], timeout)
            if conn in ready:
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    return self._died(job, process)
                if message[0] == "done":
                    self._done(message[2])
                    finish: Finish = message[1]
                    return finish
                written = (self._reporter.progress if message[0] == "progress" else self._reporter.log)(
                    job, message[1])
                with contextlib.suppress(OSError, ValueError):
                    conn.send(written)
            elif ready:
                return self._died(job, process)
            elif hard_at is not None and time.monotonic() >= hard_at:
                logger.error("job %s of queue %s ran past its time limit of %s s: its child process is killed",
                             job.id, job.queue, seconds(hard_ms))
                self.close(kill=True)
                return over_limit(job, hard_ms)
            elif soft_at is not None:
                soft_at = None
                with contextlib.suppress(OSError):
                    os.kill(process.pid, signal.SIGUSR1)

    def _done(self, max_rss_kb: int) -> None:
        """Account for a job the child finished; retire the child when it has done its share."""
        self._jobs += 1
        if self.max_jobs and self._jobs >= self.max_jobs:
            logger.info("%s: retiring the child process after %d job(s)", self.name, self._jobs)
            self.close()
        elif self.max_memory_kb and max_rss_kb > self.max_memory_kb:
            logger.info("%s: retiring the child process, which grew to %d MB", self.name, max_rss_kb // 1024)
            self.close()

    def _died(self, job: Job, process: Any) -> Finish:
        try:
            process.join(_CHILD_STOP_S)
            code = process.exitcode
        except ValueError:  # closed meanwhile (the worker's second stop)
            code = None
        self.close(kill=True)
        how = _how(code)
        if _is_cancelled(job):
            return cancelled(job)
        if isinstance(job._interrupt, LockLostError):  # the sweeper recovered it: its result is refused anyway
            return ended(job, "stopped: this attempt lost its lock", LockLostError)
        logger.error("job %s of queue %s: the child process running it died (%s)", job.id, job.queue, how)
        return ended(job, f"the child process running the job died: {how}")


def _how(code: int | None) -> str:
    """How a child process ended, from its exit code, in words."""
    if code is None:
        return "it is gone"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
        return f"killed by {name}" + (" (out of memory, or kill -9)" if -code == signal.SIGKILL else "")
    return f"exited with code {code}"


# -- in the child ------------------------------------------------------------

class _PipeReporter:
    """A child's job reports go to the worker, which writes them (the child has no Redis client)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def progress(self, job: Job, progress_json: str) -> bool:
        return self._ask("progress", progress_json)

    def log(self, job: Job, line: str) -> bool:
        return self._ask("log", line)

    def _ask(self, kind: str, text: str) -> bool:
        # A soft limit's signal must not land between the question and its
        # answer (the answer would be read as the reply to the next one): it
        # waits, and is raised in the job once the answer is in.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        try:
            self.conn.send((kind, text))
            return bool(self.conn.recv())
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})


_running: Job | None = None  # the child's job, while its handler runs


def _soft_limit(signum: int, frame: Any) -> None:
    if _running is not None:
        raise SoftTimeLimitExceeded("soft time limit exceeded")


def _interruptible(handler: Handler) -> Handler:
    """The handler, marked as running only while it runs, so the soft limit's signal is raised there.

    The mark is set and cleared inside run_handler's try: a signal that lands
    as the job returns is either raised in the job (a failed attempt) or
    ignored, never raised in the child's own code, which it would kill.
    """
    def call(job: Job) -> Any:
        global _running
        _running = job
        try:
            return handler(job)
        finally:
            _running = None
    return call


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
    # Signals are the worker's business: Ctrl-C in a terminal reaches the whole
    # process group, and a child must not break its job for it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with(parent_pid)
    if child_init is not None:
        child_init()
    handler: Handler = _interruptible(pickle.loads(handler_blob))
    reporter = _PipeReporter(conn)
    signal.signal(signal.SIGUSR1, _soft_limit)
    conn.send("ready")
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return  # the worker is gone
        if job is None:
            return
        job.attach(reporter)
        finish = run_handler(handler, job)
        conn.send(("done", finish, _peak_rss_kb()))
