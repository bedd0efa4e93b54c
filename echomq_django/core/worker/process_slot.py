"""The processes pool's slot: a child process it keeps, sent one job at a time, and ended by a limit or a cancel.

What runs inside the child is child_side.py; the child's reports are written
by the slot's ReportWriter (reports.py).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from ..protocol.job import Job, Reporter
from ..protocol.scripts import Finish
from ..protocol.times import seconds_text
from .child_side import child_main
from .pool import Handler, ended, over_limit, stopped
from .reports import STALE, ReportWriter
from .signals import SOFT_LIMIT_SIGNAL

logger = logging.getLogger("echomq.worker")

_CHILD_STOP_S = 5.0  # how long a child asked to leave may take before it is killed


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
        self._writer = ReportWriter(reporter, name)  # the reports of the slot's jobs, written off the job's thread

    # -- the child's life --------------------------------------------------

    def launch(self) -> None:
        """Start a child; wait_ready() waits until it can take jobs."""
        context = multiprocessing.get_context("spawn")  # no fork of a process that has threads
        parent, child = context.Pipe()
        process = context.Process(target=child_main, args=(child, self._handler, self._child_init, os.getpid()),
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
        self._writer.close()
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
                answers = self._writer.awaited
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
                        self._writer.ask(job, message[0], message[1])
                elif process.sentinel in ready:
                    return self._died(job)
                if answers is not None and answers in ready and (written := self._writer.answer()) is not STALE:
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
            self._writer.forget()  # a report of this attempt not written yet never will be

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
    """SIGKILL a child and whatever it started (its process group, see child_side.child_main)."""
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
