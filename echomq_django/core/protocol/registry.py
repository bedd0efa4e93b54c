"""The workers registry: which workers serve a queue now, and what each is doing.

Each worker keeps a record of itself under its queue's keys (QueueKeys.worker,
JSON, PX its lock duration) and its id in the queue's index (QueueKeys.workers),
written when it starts and again at each round of its lock renewer: one
pipeline per renewal interval, nothing per job. A clean stop deletes both; a
worker that dies stops writing, and its record lapses within a lock duration,
on Redis's clock. Per-queue keys under the queue's hash tag, so the registry
reads the same on a Cluster (no CLIENT LIST, no scan of the keyspace).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from .codec import decode_stored
from .connection import UNREACHABLE
from .keys import QueueKeys

logger = logging.getLogger("echomq.worker")

# The most workers one read of a queue's registry lists (the index's newest records).
MAX_LISTED = 1000
# An index member is pruned this many of its lock durations after its record lapsed (by the pruning
# host's clock): a host whose clock is that far ahead of another's hides the other's live workers.
PRUNE_AFTER = 10
# What no record's text holds: control characters would reach an operator's terminal (echomq_status).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class WorkerInfo:
    """One worker's record: who it is, where it runs, and what it is doing (as of `heartbeat_at_ms`)."""

    id: str
    queue: str
    host: str
    pid: int
    queues: tuple[str, ...]  # every queue its process serves
    pool: str
    concurrency: int
    version: str
    started_at_ms: int
    heartbeat_at_ms: int
    done: int = 0  # attempts whose results it wrote
    failed: int = 0  # of those, the ones that failed
    running: tuple[tuple[str, int], ...] = field(default=())  # (job id, when it started, ms), oldest first

    @property
    def busy_slots(self) -> int:
        return len(self.running)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "queues": list(self.queues), "running": [list(job) for job in self.running]}

    @classmethod
    def from_json(cls, queue: str, text: str) -> WorkerInfo | None:
        """A record as its worker wrote it; None when another client wrote something else there.

        Each number must be a natural number below 2**53 (a float holds it: the readers show a
        time as seconds), each text free of control characters, and the JSON nested no deeper
        than Python's recursion limit.
        """
        try:
            fields = decode_stored(text)
            return cls(
                id=_text(fields["id"]), queue=queue, host=_text(fields["host"]), pid=_natural(fields["pid"]),
                queues=tuple(_text(name) for name in fields["queues"]), pool=_text(fields["pool"]),
                concurrency=_natural(fields["concurrency"]), version=_text(fields["version"]),
                started_at_ms=_natural(fields["started_at_ms"]), heartbeat_at_ms=_natural(fields["heartbeat_at_ms"]),
                done=_natural(fields["done"]), failed=_natural(fields["failed"]),
                running=tuple((_text(job_id), _natural(started)) for job_id, started in fields["running"]))
        except (ValueError, TypeError, KeyError, OverflowError):
            return None


def _natural(value: Any) -> int:
    """A record's number (a time in ms, a count, a pid); ValueError when out of 0 .. 2**53 - 1."""
    number = int(value)
    if not 0 <= number < 2**53:
        raise ValueError(f"{number} is out of a record's range")
    return number


def _text(value: Any) -> str:
    """A record's text (an id, a host, a queue); ValueError when it holds a control character."""
    text = str(value)
    if _CONTROL.search(text):
        raise ValueError("a control character in a record's text")
    return text


class Heartbeat:
    """A worker's writes of its record: `beat()` at its start and at each renewal round, `leave()` at its end.

    `describe()` gives the record as of now. A write that fails (an outage)
    is logged (once until one succeeds) and tried again at the next round; the
    record lapses meanwhile if the outage outlasts a lock duration, as the
    worker's locks do.
    """

    def __init__(self, client: Any, keys: QueueKeys, describe: Callable[[], WorkerInfo], ttl_ms: int) -> None:
        self.client, self.keys, self.describe, self.ttl_ms = client, keys, describe, ttl_ms
        self._lock = threading.Lock()  # the renewer's beat and the worker's leave do not cross
        self._left = False
        self._failing = False

    def beat(self) -> None:
        with self._lock:
            if self._left:
                return
            info = self.describe()
            lapses_at = info.heartbeat_at_ms + self.ttl_ms
            pipe = self.client.pipeline(transaction=False)
            pipe.set(self.keys.worker(info.id), json.dumps(info.to_json(), separators=(",", ":")), px=self.ttl_ms)
            pipe.zadd(self.keys.workers, {info.id: lapses_at})
            # Those of workers that died, by this host's clock: ten lapses of slack for the clocks of
            # other hosts (a member left a while costs a reader one GET; a live one pruned, its listing).
            pipe.zremrangebyscore(self.keys.workers, "-inf", f"({info.heartbeat_at_ms - PRUNE_AFTER * self.ttl_ms}")
            self._send(pipe, info.id, "could not write its heartbeat")

    def leave(self) -> None:
        """Take the record out (a clean stop); no beat writes it again.

        After a beat that failed (Redis out of reach) it is left to lapse: the
        stop does not wait out the client's retries once more for it.
        """
        with self._lock:
            self._left = True
            if self._failing:
                return
            worker_id = self.describe().id
            pipe = self.client.pipeline(transaction=False)
            pipe.zrem(self.keys.workers, worker_id)
            pipe.delete(self.keys.worker(worker_id))
            self._send(pipe, worker_id, "could not leave the workers registry; its record lapses")

    def _send(self, pipe: Any, worker_id: str, problem: str) -> None:
        try:
            pipe.execute()
        except (*UNREACHABLE, ResponseError) as error:
            if not self._failing:
                logger.warning("worker %s: %s (%s)", worker_id, problem, error)
            self._failing = True
            return
        self._failing = False


def live_workers(client: Any, keys: QueueKeys) -> list[WorkerInfo]:
    """The workers of a queue whose records have not lapsed, oldest start first (at most MAX_LISTED)."""
    ids = client.zrange(keys.workers, 0, MAX_LISTED - 1, desc=True)
    if not ids:
        return []
    pipe = client.pipeline(transaction=False)
    for worker_id in ids:
        pipe.get(keys.worker(worker_id))
    found = []
    for text in pipe.execute(raise_on_error=False):
        if isinstance(text, str) and (info := WorkerInfo.from_json(keys.queue, text)) is not None:
            found.append(info)
    return sorted(found, key=lambda info: (info.started_at_ms, info.id))
