"""The child's side of the processes pool: what runs inside a slot's child process.

The child only runs the handler, one job at a time as the pipe brings them;
the worker keeps all the Redis work, so the child's reports (progress, log
lines) go back through the pipe, and the worker writes them.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from ..protocol.job import Job
from .pool import Handler, run_handler, soft_limit_exceeded
from .signals import leave_stop_signals_to_the_parent, on_soft_limit_signal


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
        return bool(self._ask(job, "progress", progress_json))

    def log(self, job: Job, line: str) -> bool:
        return bool(self._ask(job, "log", line))

    def step(self, job: Job, op: str, name: str, kind: str, text: str, deadline: int) -> Any:
        answer = self._ask(job, "step", (op, name, kind, text, deadline))
        if isinstance(answer, BaseException):  # the worker could not reach Redis, or it refused the call
            raise answer
        if answer is False:  # from a thread a finished job left behind
            raise RuntimeError(f"job {job.id}'s attempt has ended: its steps can no longer be recorded")
        return answer

    def _ask(self, job: Job, kind: str, text: Any) -> Any:
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
                answer = self.conn.recv()
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


def child_main(conn: Connection, handler_blob: bytes, child_init: Callable[[], None] | None,
               parent_pid: int) -> None:
    """The child process's life (ProcessSlot.launch starts it): set up, then run the jobs the pipe brings."""
    # Signals are the worker's business: a SIGTERM to the whole cgroup (systemd)
    # must not break a child's job. They came blocked (see ProcessSlot.launch).
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
