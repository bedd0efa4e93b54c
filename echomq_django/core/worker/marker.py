"""A worker's wait for work while its jobs run: a thread that blocks on the queue's marker."""

from __future__ import annotations

import logging
import threading
from typing import Any

from redis.exceptions import ResponseError

from ..protocol.connection import UNREACHABLE
from ..protocol.keys import QueueKeys
from ..protocol.scripts import Scripts
from .slots import Events

logger = logging.getLogger("echomq.worker")


class MarkerWaiter:
    """Blocks on the queue's marker when the fetch loop asks (`arm`), and wakes the loop with a None event.

    The loop asks when it has free slots and found nothing to take while
    jobs of its own run (an idle loop with nothing running waits itself, in
    its fetch's round trip). A producer's signal, a delayed job's due time
    or the timeout ends the wait. A signal taken while the loop is no longer
    `idle` (it filled its slots, began stopping) is put back for another.
    `blocking` is the Redis client id of the wait in progress, which the
    loop ends (CLIENT UNBLOCK) when it waits itself.
    """

    def __init__(self, client: Any, scripts: Scripts, keys: QueueKeys, events: Events, worker_id: str) -> None:
        self.client, self.scripts, self.keys, self.events, self.worker_id = client, scripts, keys, events, worker_id
        self.idle = threading.Event()  # the loop has free slots and found nothing to take (stop() clears it)
        self.blocking: int | None = None
        self._wanted = threading.Event()
        self._closed = threading.Event()
        self._timeout_s = 1.0

    def arm(self, timeout_s: float) -> None:
        """Block until work is signalled, or for `timeout_s` at most."""
        self._timeout_s = timeout_s
        self.idle.set()
        self._wanted.set()

    def close(self) -> None:
        self._closed.set()
        self.idle.clear()
        self._wanted.set()

    def run(self) -> None:
        while True:
            self._wanted.wait()
            if self._closed.is_set():
                return
            self._wanted.clear()
            woken: bool | None = False
            try:
                woken = self._block(self._timeout_s)
                if woken and not self.idle.is_set():
                    # The loop filled its slots, began stopping or waits itself meanwhile:
                    # the signal is for another wait, so put it back.
                    self.client.zadd(self.keys.marker, {"0": 0})
            except (*UNREACHABLE, ResponseError) as error:
                # The signal is lost; other workers wake at their block timeout.
                logger.error("worker %s: could not hand back a wake-up signal (%s)", self.worker_id, error)
            finally:
                if woken is not None:  # None: the loop ended this wait to wait itself
                    self.events.put(None)  # the loop looks for work whatever happened here

    def _block(self, timeout: float) -> bool | None:
        """Sleep until a producer signals work (the marker) or the timeout ends; True if it took the marker.

        None when the loop ended the wait (it waits for work itself).
        """
        try:
            if not self.scripts.waits_then_runs:  # a cluster
                return self.client.bzpopmin(self.keys.marker, timeout=timeout) is not None
            # On the thread's own connection, which the loop may unblock.
            self.blocking = self.scripts.client_id()
            try:
                waited = self.scripts.wait_then_run(self.keys.marker, timeout, [], None, None)
            finally:
                self.blocking = None
            assert waited is not None
            woken = waited[0]
            if isinstance(woken, ResponseError):
                if "CLIENT UNBLOCK" in str(woken):
                    return None
                raise woken
            return isinstance(woken, list)
        except (*UNREACHABLE, ResponseError) as error:
            # ResponseError: UNBLOCKED, when a failover turns the server we wait
            # on into a replica; the next wait goes to the new primary.
            logger.error("worker %s: Redis unreachable or failing over while waiting (%s); retrying",
                         self.worker_id, error)
            self._closed.wait(1.0)
            return False
