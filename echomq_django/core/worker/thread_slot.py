"""The threads pool's slot: jobs run on the worker's own threads, a job with a time limit on a watched one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..errors import TimeLimitExceeded
from ..protocol.job import Job
from ..protocol.scripts import Finish
from ..protocol.times import seconds_text
from .pool import Handler, over_limit, run_handler, soft_limit_exceeded, stopped

logger = logging.getLogger("echomq.worker")


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
