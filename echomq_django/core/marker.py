"""A worker's marker waiter: one thread that sleeps until a producer signals work, and wakes the worker's loop.

While the loop has free slots and found nothing to take, it arms the
waiter, which blocks on the queue's marker (a sorted set a producer writes
to) until a signal or the next delayed job's due time. Whatever ends the
wait, the waiter puts a wake-up (None) on the loop's queue of events. A
signal that arrives once the loop no longer waits (its slots filled, it
began stopping) is put back for another worker.
"""

from __future__ import annotations

import logging
import queue as threadqueue
import threading
from typing import Any

from redis.exceptions import ResponseError

from .connection import UNREACHABLE
from .keys import QueueKeys
from .scripts import Scripts

logger = logging.getLogger("echomq.worker")


class MarkerWaiter:
    """The thread that blocks on the marker for a worker's loop (run() is its body)."""

    def __init__(self, worker_id: str, client: Any, scripts: Scripts, keys: QueueKeys,
                 events: threadqueue.SimpleQueue[Any], idle: threading.Event, done: threading.Event,
                 timeout_s: float) -> None:
        self.worker_id, self.client, self.scripts, self.keys = worker_id, client, scripts, keys
        self._events = events  # the loop's queue: a wake-up is None
        self._idle = idle  # the loop has free slots and found nothing to take (the loop and stop() clear it)
        self._done = done  # the worker has ended: run() returns
        self._wanted = threading.Event()  # the loop asks for a wait
        self._timeout_s = timeout_s
        # The thread's connection while it blocks (its Redis client id), for the loop to end that wait.
        self.blocking: int | None = None

    def arm(self, timeout_s: float) -> None:
        """Block until work is signalled or `timeout_s` ends (called by the loop, which then waits for events)."""
        self._timeout_s = timeout_s
        self._idle.set()
        self._wanted.set()

    def release(self) -> None:
        """Let run() see that the worker has ended (call after setting `done`)."""
        self._wanted.set()

    def run(self) -> None:
        while True:
            self._wanted.wait()
            if self._done.is_set():
                return
            self._wanted.clear()
            woken: bool | None = False
            try:
                woken = self._block(self._timeout_s)
                if woken and not self._idle.is_set():
                    # The loop filled its slots, began stopping or waits itself meanwhile:
                    # the signal is for another wait, so put it back.
                    self.client.zadd(self.keys.marker, {"0": 0})
            except (*UNREACHABLE, ResponseError) as error:
                # The signal is lost; other workers wake at their block timeout.
                logger.error("worker %s: could not hand back a wake-up signal (%s)", self.worker_id, error)
            finally:
                if woken is not None:  # None: the loop ended this wait to wait itself
                    self._events.put(None)  # the loop looks for work whatever happened here

    def _block(self, timeout: float) -> bool | None:
        """Sleep until a producer signals work (the marker) or the timeout ends; True if it took the marker.

        None when the loop ended the wait (it waits for work itself).
        """
        try:
            if not self.scripts.waits_then_runs:  # a cluster
                return self.client.bzpopmin(self.keys.marker, timeout=timeout) is not None
            # On the thread's own connection, which the loop may unblock (see Worker._exchange).
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
            self._done.wait(1.0)
            return False
