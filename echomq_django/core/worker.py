"""The consumer side: fetch jobs, run them on threads, keep their locks, finish them."""

from __future__ import annotations

import functools
import logging
import os
import queue as threadqueue
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError, ResponseError, TimeoutError

from .errors import JobNotFoundError, LockLostError, PayloadError, UnrecoverableError
from .job import DEFAULT_ATTEMPTS, Job, encode_json
from .keys import QueueKeys
from .queue import now_ms
from .scripts import Scripts

logger = logging.getLogger("echomq.worker")

Handler = Callable[[Job], Any]
DEFAULT_LOCK_DURATION_MS = 30_000
# moveToFinished's status codes for a failed attempt, in words.
_FAILURE_OUTCOMES = {2: "no attempts left", 3: "retrying now", 4: "retrying after its backoff"}


@dataclass(frozen=True)
class Retention:
    """How many finished jobs a set keeps: `count` newest (-1 = all), none older than `age_ms` (0 = any)."""

    count: int = -1
    age_ms: int = 0


class Worker:
    """Runs the jobs of one queue with `concurrency` threads until stopped.

    One fetch loop takes jobs (several per round trip when threads are free)
    and blocks on the queue's marker when there is nothing to do, instead of
    polling. A renewal thread extends all held locks in one call every
    `renew_interval_ms` (half the lock duration by default). A job's result is
    written with the token it was fetched with, so a worker whose lock lapsed
    and whose job was recovered gets LockLostError and overwrites nothing.

    Shutdown has two stages: the first `stop()` stops fetching and lets
    running jobs finish; a second `stop()` makes `run()` return at once, and
    the jobs still running are left to their lapsing locks and the sweeper.
    """

    def __init__(
        self, queue: str, handler: Handler, client: Any, *, prefix: str = "emq",
        concurrency: int = 1, lock_duration_ms: int = DEFAULT_LOCK_DURATION_MS,
        renew_interval_ms: int | None = None, block_timeout_s: float = 1.0,
        default_attempts: int = DEFAULT_ATTEMPTS,
        keep_completed: Retention = Retention(count=1000), keep_failed: Retention = Retention(),
        worker_id: str | None = None, scripts: Scripts | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        renew_interval_ms = renew_interval_ms or lock_duration_ms // 2
        if not 0 < renew_interval_ms < lock_duration_ms:
            raise ValueError(
                f"lock renewal every {renew_interval_ms} ms must be shorter than the "
                f"lock duration of {lock_duration_ms} ms"
            )
        self.keys = QueueKeys(queue, prefix)
        self.handler = handler
        self.client = client
        self.scripts = scripts or Scripts(client)
        self.concurrency = concurrency
        self.lock_duration_ms = lock_duration_ms
        self.renew_interval_ms = renew_interval_ms
        self.block_timeout_s = block_timeout_s
        self.default_attempts = default_attempts
        self.keep_completed = keep_completed
        self.keep_failed = keep_failed
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.processed = 0
        # (job id, token) of every attempt running now. Keyed by both: if this
        # worker's job was recovered and fetched again while the old attempt still
        # runs, the two attempts must not share an entry.
        self._held: set[tuple[str, str]] = set()
        self._running = 0
        self._slots = threading.Condition()
        self._jobs: threadqueue.SimpleQueue[Job | None] = threadqueue.SimpleQueue()
        self._stopping = threading.Event()
        self._aborted = threading.Event()
        self._renewal_done = threading.Event()

    # -- control ---------------------------------------------------------

    def stop(self) -> None:
        """First call: finish running jobs, fetch no more. Second call: return at once."""
        if self._stopping.is_set():
            logger.warning("worker %s: second stop, leaving %d running job(s) to the sweeper",
                           self.worker_id, self._running)
            self._aborted.set()
            self._renewal_done.set()
        else:
            logger.info("worker %s: stopping after %d running job(s)", self.worker_id, self._running)
            self._stopping.set()
        with self._slots:
            self._slots.notify_all()

    def run(self, *, burst: bool = False, max_jobs: int | None = None) -> int:
        """Process jobs until stopped (or, in burst mode, until none is ready); returns the count."""
        threads = [threading.Thread(target=self._job_thread, name=f"echomq-job-{i}", daemon=True)
                   for i in range(self.concurrency)]
        threads.append(threading.Thread(target=self._renew_locks, name="echomq-renew", daemon=True))
        for thread in threads:
            thread.start()
        fetched = 0
        try:
            while not self._stopping.is_set():
                if max_jobs is not None and fetched >= max_jobs:
                    break
                free = self._wait_for_free_slots()
                if free == 0:
                    continue
                if max_jobs is not None:
                    free = min(free, max_jobs - fetched)
                next_due, count = self._fetch(free)
                fetched += count
                if count:
                    continue
                if burst:
                    if self._running == 0:
                        break
                    self._wait_for_free_slots(change=True)
                    continue
                self._block(next_due)
            self._wait_until_idle()
        finally:
            self._stopping.set()
            self._renewal_done.set()
            for _ in range(self.concurrency):
                self._jobs.put(None)
        return self.processed

    # -- fetch loop ------------------------------------------------------

    def _wait_for_free_slots(self, change: bool = False) -> int:
        with self._slots:
            if change or self._running >= self.concurrency:
                self._slots.wait(timeout=self.block_timeout_s)
            return self.concurrency - self._running

    def _wait_until_idle(self) -> None:
        with self._slots:
            while self._running and not self._aborted.is_set():
                self._slots.wait(timeout=0.5)

    def _fetch(self, count: int) -> tuple[int | None, int]:
        token = f"{self.worker_id}:{uuid.uuid4().hex}"
        try:
            next_due, jobs = self.scripts.move_to_active(
                self.keys, token, self.lock_duration_ms, now_ms(), count, self.worker_id)
        except (ConnectionError, TimeoutError) as error:
            logger.error("worker %s: Redis unreachable while fetching (%s); retrying",
                         self.worker_id, error)
            self._stopping.wait(1.0)
            return None, 0
        except ResponseError as error:  # e.g. a queue key of the wrong type: say so, keep trying
            logger.error("worker %s: fetching from queue %s failed: %s", self.worker_id, self.keys.queue, error)
            self._stopping.wait(1.0)
            return None, 0
        for job_id, flat in jobs:
            job = Job.from_flat(self.keys.queue, job_id, flat)  # job.token is this fetch's token
            with self._slots:
                self._running += 1
                self._held.add((job_id, token))
            self._jobs.put(job)
        return next_due, len(jobs)

    def _block(self, next_due: int | None) -> None:
        """Sleep until a producer signals work, a delayed job is due, or the timeout ends."""
        timeout = self.block_timeout_s
        # A block longer than the client's socket timeout would end in a
        # TimeoutError (and retries) instead of an empty reply.
        # (redis-py's own default socket timeout is 5 s.)
        socket_timeout = self.client.connection_pool.connection_kwargs.get("socket_timeout") or 5.0
        timeout = min(timeout, max(socket_timeout - 1, 0.1))
        if next_due is not None:
            timeout = min(timeout, max((next_due - now_ms()) / 1000, 0.001))
        try:
            self.client.bzpopmin(self.keys.marker, timeout=timeout)
        except (ConnectionError, TimeoutError) as error:
            logger.error("worker %s: Redis unreachable while waiting (%s); retrying",
                         self.worker_id, error)
            self._stopping.wait(1.0)

    # -- job threads -----------------------------------------------------

    def _job_thread(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._process(job)
            except Exception:  # the thread must live on for the next job; the lock lapses
                logger.exception("worker %s: could not finish job %s; the sweeper will recover it",
                                 self.worker_id, job.id)
            finally:
                with self._slots:
                    self._held.discard((job.id, job.token))
                    self._running -= 1
                    self._slots.notify_all()

    def _process(self, job: Job) -> None:
        token = job.token or ""
        try:
            result = self.handler(job)
            value = encode_json(result, f"return value of job {job.id}")
        except Exception as error:  # the job's own failure: recorded on the job, not raised
            self._finish(job, token, error=error)
        else:
            self._finish(job, token, value=value)

    def _finish(self, job: Job, token: str, *, value: str = "", error: Exception | None = None) -> None:
        keys, retention = self.keys, self.keep_completed if error is None else self.keep_failed
        stacktrace = ""
        if error is not None:
            value = f"{type(error).__name__}: {error}"
            if not isinstance(error, PayloadError):
                stacktrace = "".join(traceback.format_exception(error))
        finish = functools.partial(
            self.scripts.move_to_finished,
            keys, job.id, token, now_ms(), completed=error is None, value=value,
            stacktrace=stacktrace, default_attempts=self.default_attempts,
            backoff_ms=job.opts.backoff.delay_before(job.attempts_made + 1),
            keep_count=retention.count, keep_age_ms=retention.age_ms,
            final=isinstance(error, (UnrecoverableError, PayloadError)),
            error_class="" if error is None else f"{type(error).__module__}.{type(error).__qualname__}",
        )
        try:
            status = self._with_outage_retries(finish)
        except LockLostError as lost:
            logger.warning("worker %s: %s", self.worker_id, lost)
            return
        except JobNotFoundError as gone:
            logger.warning("worker %s: %s; it was removed while running", self.worker_id, gone)
            return
        with self._slots:
            self.processed += 1
        if error is not None:
            outcome = _FAILURE_OUTCOMES.get(status, "failed")
            logger.info("job %s of queue %s failed, %s: %s", job.id, keys.queue, outcome, value)

    def _with_outage_retries(self, call: Callable[[], int]) -> int:
        """Run `call`, trying again through a Redis outage for as long as the lock would last.

        A finish re-sent after a lost reply is answered "already done" (the
        script remembers the token), so trying again never applies it twice.
        """
        deadline = time.monotonic() + self.lock_duration_ms / 1000
        while True:
            try:
                return call()
            except (ConnectionError, TimeoutError) as error:
                if time.monotonic() > deadline or self._aborted.is_set():
                    raise
                logger.error("worker %s: Redis unreachable while finishing a job (%s); retrying",
                             self.worker_id, error)
                time.sleep(1.0)

    # -- lock renewal ----------------------------------------------------

    def _renew_locks(self) -> None:
        while not self._renewal_done.wait(self.renew_interval_ms / 1000):
            with self._slots:
                held = sorted(self._held)
            if not held:
                continue
            try:
                lost = self.scripts.extend_locks(self.keys, held, self.lock_duration_ms)
            except (ConnectionError, TimeoutError) as error:
                logger.error("worker %s: could not renew locks (%s)", self.worker_id, error)
                continue
            for job_id in lost:
                logger.warning("worker %s: lost the lock of job %s; its result will be discarded",
                               self.worker_id, job_id)

