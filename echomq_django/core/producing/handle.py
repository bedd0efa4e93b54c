"""A handle on one enqueued job: its id (a str, as before), and its status, its result and a wait for it."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeoutError

from ..errors import JobFailedError, JobNotFinishedError, JobNotFoundError
from ..protocol.connection import socket_timeout

# The events after which a waiter reads the job again: it ended, or left every state.
_ENDS = frozenset({"completed", "failed", "removed", "cancelled"})
# Longest single blocking read of the events stream (ms): the job is read again at least this often, so
# an end whose event was trimmed away (a busy stream) or never written (retention) is still seen.
_BLOCK_MS = 1000


def deadline_of(timeout: float | None) -> float | None:
    """The monotonic time a wait of `timeout` seconds ends at; None (no end) for None or math.inf."""
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or math.isnan(timeout)):
        raise ValueError(f"timeout is a number of seconds or None, not {timeout!r}")
    return None if timeout is None or timeout == math.inf else time.monotonic() + max(timeout, 0)


class GivenUp(Exception):
    """Raised inside a wait's thread once its awaiter is gone, to end the thread (nobody reads it)."""


async def awaited(wait: Callable[[threading.Event], Any]) -> Any:
    """`wait(given_up)` on a thread of its own for asyncio code; `given_up` is set once the awaiter is done
    (cancelled, by asyncio.wait_for say), and the wait must end soon after: else the thread waits on, unread,
    and asyncio.run waits for it at its end."""
    given_up = threading.Event()
    try:
        return await asyncio.to_thread(wait, given_up)
    finally:
        given_up.set()


def sleep_unless(given_up: threading.Event, seconds: float) -> None:
    """Sleep `seconds`, or raise GivenUp as soon as `given_up` is set (a polling wait's sleep, in `awaited`)."""
    if given_up.wait(seconds):
        raise GivenUp


class JobHandle(str):
    """The id of an enqueued job (a str: anything that used the id as a string still works), and a look at it.

    `.status` is the state that holds the job now ("wait", "delayed", "active", "completed", "failed"...)
    or "missing" (removed, trimmed by retention, or not yet sent: an outbox job before its commit);
    `.result` its return value; `.wait(timeout)` waits for its end.
    """

    queue: Any  # the job's Queue (not imported here: queue.py makes handles, and an import circle is refused)

    def __new__(cls, job_id: str, queue: Any) -> JobHandle:
        handle = super().__new__(cls, job_id)
        handle.queue = queue
        return handle

    def __reduce__(self) -> tuple[type[str], tuple[str]]:  # pickled (to a pool's child, say) as the plain id
        return str, (str(self),)

    @property
    def id(self) -> str:
        return str(self)

    @property
    def status(self) -> str:
        return self.queue.get_state(self.id) or "missing"

    @property
    def result(self) -> Any:
        """The return value of a completed job; JobFailedError, JobNotFinishedError or JobNotFoundError else."""
        job, state = self.queue.get_job_with_state(self.id, log_lines=0)
        return self._outcome(job, state)

    def signal(self, name: str, payload: Any = None) -> bool:
        """Send the job the signal `name` with a JSON payload, for its `wait_for_signal` (Queue.signal)."""
        return bool(self.queue.signal(self.id, name, payload))

    def _outcome(self, job: Any, state: str | None) -> Any:
        if job is None:
            raise JobNotFoundError(f"job {self.id} of queue {self.queue.name} is not in Redis (removed, trimmed "
                                   "by retention, or not sent yet)")
        if state == "completed":
            return job.returnvalue
        if state == "failed":
            raise JobFailedError(self.id, job.failed_reason)
        raise JobNotFinishedError(f"job {self.id} of queue {self.queue.name} has not finished: it is {state}")

    def wait(self, timeout: float | None = None) -> Any:
        """Wait until the job completed (its return value), failed, was cancelled or removed (raised as `result`
        raises them); TimeoutError after `timeout` seconds.

        The wait reads the queue's events stream (a blocking XREAD), so it wakes when the job ends, and
        reads the job again at least once a second whatever the stream says.
        """
        return self._wait(timeout, None)

    def _wait(self, timeout: float | None, given_up: threading.Event | None) -> Any:
        """`wait`; also ends (returning None) within a blocking read once `given_up` is set."""
        deadline = deadline_of(timeout)
        client, events = self.queue.client, self.queue.keys.events
        # A blocking read well within the client's socket timeout (a producer's is short: ENQUEUE_TIMEOUT / 4).
        longest = _BLOCK_MS if (limit := socket_timeout(client)) is None else min(_BLOCK_MS, int(limit * 250))
        newest = client.xrevrange(events, count=1)
        position = newest[0][0] if newest else "0-0"
        while True:
            job, state = self.queue.get_job_with_state(self.id, log_lines=0)
            if state in ("completed", "failed") or job is None:
                return self._outcome(job, state)
            while True:
                if given_up is not None and given_up.is_set():
                    return None  # its awaiter was cancelled or timed out: nobody reads this
                left_ms = None if deadline is None else int((deadline - time.monotonic()) * 1000)
                if left_ms is not None and left_ms <= 0:
                    raise TimeoutError(f"job {self.id} of queue {self.queue.name} did not finish within {timeout} s")
                block = max(1, longest if left_ms is None else min(longest, left_ms))
                try:
                    read = client.xread({events: position}, count=1000, block=block)
                except RedisTimeoutError:  # the reply came later than the socket waits (a busy machine): no news
                    read = None
                if not read:
                    break  # a second without news: read the job again
                entries = read[0][1]
                position = entries[-1][0]
                if any(fields.get("jobId") == self.id and fields.get("event") in _ENDS for _, fields in entries):
                    break

    async def await_result(self, timeout: float | None = None) -> Any:
        """`wait` for asyncio code, on a thread of its own; the thread ends when the awaiter is cancelled."""
        return await awaited(lambda given_up: self._wait(timeout, given_up))
