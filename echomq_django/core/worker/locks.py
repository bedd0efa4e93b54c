"""Keeping a worker's locks alive while its jobs run."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..protocol.keys import QueueKeys
from ..protocol.scripts import Scripts

logger = logging.getLogger("echomq.worker")

# How soon a worker tries Redis again after a call failed (the client's own
# retries, about 15 s, are over by then). A failed renewal is tried again this
# soon rather than a whole interval later: after an outage the sweep's hold
# waits one lock duration for the workers, and no longer.
RETRY_PAUSE_S = 0.2


class LockRenewer:
    """The locks of the attempts one worker is running, renewed together.

    Each attempt is held as (job id, token): if a job of this worker was
    recovered and fetched again while its old attempt still runs, the two
    attempts do not share an entry. `run()` (on a thread of its own) renews
    every held lock in one script call every `renew_interval_ms`, and at once
    after `renew_soon()`. A renewal also tells of each held attempt that is
    to stop: `on_stop(job id, token, lost)` is called for one whose job was
    cancelled meanwhile (lost False) or whose ownership was lost (lost True: the
    sweeper recovered the job, which may run elsewhere now), at every renewal
    until it is released. `beside()`, if given, is called after each renewal
    (the worker's other periodic write).
    """

    def __init__(self, scripts: Scripts, keys: QueueKeys, lock_duration_ms: int, renew_interval_ms: int,
                 worker_id: str, on_stop: Callable[[str, str, bool], None] | None = None,
                 beside: Callable[[], None] | None = None) -> None:
        self.scripts, self.keys, self.worker_id, self.on_stop = scripts, keys, worker_id, on_stop
        self.beside = beside
        self.lock_duration_ms, self.renew_interval_ms = lock_duration_ms, renew_interval_ms
        self._held: dict[tuple[str, str], int] = {}  # each attempt held, and when (ms) it was taken
        self._held_lock = threading.Lock()
        self._soon = threading.Event()
        self._stopped = threading.Event()

    def hold(self, job_id: str, token: str) -> None:
        with self._held_lock:
            self._held.setdefault((job_id, token), int(time.time() * 1000))

    def release(self, job_id: str, token: str) -> None:
        with self._held_lock:
            self._held.pop((job_id, token), None)

    def running(self) -> list[tuple[str, int]]:
        """(job id, when it was taken, ms) of each attempt held, oldest first."""
        with self._held_lock:
            return sorted(((job_id, since) for (job_id, _), since in self._held.items()), key=lambda job: job[1])

    def renew_soon(self) -> None:
        """Renew now rather than at the end of the interval (after an outage, say)."""
        self._soon.set()

    def stop(self) -> None:
        self._stopped.set()
        self._soon.set()

    def run(self) -> None:
        pause = self.renew_interval_ms / 1000
        while not self._stopped.is_set():
            self._soon.wait(pause)
            self._soon.clear()
            if self._stopped.is_set():
                return
            pause = self.renew_interval_ms / 1000 if self.renew() else RETRY_PAUSE_S
            if self.beside is not None:
                self.beside()

    def renew(self) -> bool:
        """Renew every held lock in one call; False when the call failed."""
        with self._held_lock:
            held = sorted(self._held)  # the (job id, token) keys
        if not held:
            return True
        try:
            codes = self.scripts.lock_codes(self.keys, held, self.lock_duration_ms)
        except Exception as error:  # an outage, OOM, a failover's READONLY: try again soon
            logger.error("worker %s: could not renew locks (%s)", self.worker_id, error)
            return False
        for (job_id, token), code in zip(held, codes):
            if code == -1:
                logger.warning("worker %s: lost the lock of job %s; its result will be discarded",
                               self.worker_id, job_id)
            if code in (-1, 2) and self.on_stop is not None:
                self.on_stop(job_id, token, code == -1)
        return True
