"""What a bulk change answers (BulkOutcome, Cancel, why a job was left alone), and cutting work into bounded
calls: by count (batched) and by bytes (batched_by_size), so that no script call grows with what users hand it."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from ..protocol.job import Job

T = TypeVar("T")


# And at most this many bytes of the jobs' names, data and options per call (a larger job goes
# alone): 200 jobs of 400 KB go in 20 calls of 4 MB, not one of 80 MB that holds Redis 200 ms.
CALL_BYTES = 4 * 1024 * 1024


# Jobs per pipelined round trip of a bulk change (retry_many, remove_many, cancel_many): each job is a
# script call of its own, which touches that job alone, so no call walks a whole state.
BULK_BATCH = 500


class Cancel(enum.Enum):
    """What Queue.cancel did; true when the job is cancelled or being stopped."""

    CANCELLED = "cancelled"  # it had not started, and is in failed now
    STOPPING = "stopping"  # it is running: its worker stops it within a lock renewal
    FINISHED = "finished"  # it had already completed or failed: nothing changed
    NOT_FOUND = "not found"  # no such job: nothing changed
    RUNNING = "running"  # it is running and was left to finish (cancel(stop_running=False)): nothing changed

    def __bool__(self) -> bool:
        return self in (Cancel.CANCELLED, Cancel.STOPPING)


# Why a bulk change left a job alone, when the job had simply moved on: it is no longer in the state the change
# was for (retried, taken, finished or removed meanwhile). A running job being cancelled: its worker stops it.
GONE = "no longer there (it moved on or was removed meanwhile)"


STOPPING = "running: its worker stops it at its next lock renewal"


@dataclass
class BulkOutcome:
    """What a bulk change did: the ids it changed (`done`), and every other id under why it was not."""

    done: list[str] = field(default_factory=list)
    other: dict[str, list[str]] = field(default_factory=dict)

    def add(self, job_id: str, why: str | None) -> None:
        if why is None:
            self.done.append(job_id)
        else:
            self.other.setdefault(why, []).append(job_id)

    def merge(self, more: BulkOutcome) -> None:
        self.done += more.done
        for why, ids in more.other.items():
            self.other.setdefault(why, []).extend(ids)

    @property
    def gone(self) -> list[str]:
        """The ids no longer in the state the change was for."""
        return self.other.get(GONE, [])


@dataclass(frozen=True)
class JobRead:
    """One job hash as read, or why there is none (`problem`)."""

    job_id: str
    job: Job | None
    problem: str | None = None


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Lists of at most `size` items, in order (itertools.batched needs Python 3.12)."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def batched_by_size(items: Iterable[T], count: int, size_of: Callable[[T], int], max_bytes: int = CALL_BYTES, *,
                    first_bytes: int = 0) -> Iterator[list[T]]:
    """Lists of at most `count` items and `max_bytes` (`size_of` each; the first list holds `first_bytes` more),
    in order; an item larger than `max_bytes` goes alone."""
    batch: list[T] = []
    used = first_bytes
    for item in items:
        size = size_of(item)
        if batch and (len(batch) == count or used + size > max_bytes):
            yield batch
            batch, used = [], 0
        batch.append(item)
        used += size
    if batch:
        yield batch


def text_bytes(text: str) -> int:
    """How many bytes `text` takes in Redis (UTF-8)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
