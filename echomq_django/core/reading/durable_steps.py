"""A job's durable steps and what a parked job waits for, read for the admin's job page, without Django.

Nothing here writes to Redis. A job may record up to MAX_STEPS steps of up to
MAX_RESULT_BYTES each (core/worker/durable.py), and another client may write anything
into the hash, so a read is held to MAX_SHOWN records and READ_BUDGET_BYTES:
the names come first (HRANDFIELD with a count returns names only, where HSCAN
would bring every value with them), then each record's size, then the records
themselves, smallest first, until the budget is spent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import QueueStateError
from ..producing.queue import Queue
from ..protocol.codec import decode_stored

MAX_SHOWN = 200
READ_BUDGET_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class StepRecord:
    """One step as its record says, or why its record cannot be read (`problem`; the other fields are None then)."""

    name: str
    state: str | None = None  # done, timeout, failed, waiting (core/worker/durable.py)
    kind: str | None = None  # step, sleep, signal, atomic, fan-out
    at_ms: int | None = None  # when the record was written
    result: Any = None  # a done step's result ("r")
    error: str | None = None  # a failed step's latest error ("e")
    until_ms: int | None = None  # a sleep's end, a signal wait's deadline (0: none)
    problem: str | None = None


@dataclass(frozen=True)
class StepsRead:
    """Up to MAX_SHOWN of a job's `total` steps, by when they were recorded, then by name (unread ones last)."""

    steps: list[StepRecord]
    total: int


def read_steps(queue: Queue, job_id: str, limit: int = MAX_SHOWN) -> StepsRead:
    """A job's durable steps, `limit` of them at most; QueueStateError when its steps key is not a hash."""
    key = queue.keys.steps(job_id)
    pipe = queue.client.pipeline(transaction=True)  # the count and the names from one moment
    pipe.hlen(key)
    pipe.hrandfield(key, limit)  # a positive count: distinct names, every one when the hash holds fewer
    total, names = pipe.execute(raise_on_error=False)
    if isinstance(total, Exception):
        raise QueueStateError(f"the steps key of job {job_id!r} of queue {queue.name!r} is not a hash: {total}")
    if not total:
        return StepsRead([], 0)
    pipe = queue.client.pipeline(transaction=False)
    for name in names:
        pipe.hstrlen(key, name)
    sizes = dict(zip(names, pipe.execute()))
    chosen, spent = [], 0
    for name in sorted(names, key=lambda name: sizes[name]):
        if spent + sizes[name] > READ_BUDGET_BYTES:
            break
        chosen.append(name)
        spent += sizes[name]
    texts = dict(zip(chosen, queue.client.hmget(key, chosen))) if chosen else {}
    steps = [parse_record(name, texts[name]) if name in texts else
             StepRecord(name, problem=f"a record of {sizes[name]:,} bytes: more than this page reads at once")
             for name in names]
    steps.sort(key=lambda step: (step.at_ms is None, step.at_ms or 0, step.name))
    return StepsRead(steps, int(total))


def parse_record(name: str, text: str | None) -> StepRecord:
    """A step's record decoded; one that is not the JSON object this package writes says so in `problem`."""
    if text is None:
        return StepRecord(name, problem="the record was removed while it was read")
    try:
        record = decode_stored(text)
    except ValueError as why:
        return StepRecord(name, problem=f"not JSON ({why}): {text[:100]}")
    if not isinstance(record, dict):
        return StepRecord(name, problem=f"not a JSON object: {text[:100]}")
    error = record.get("e")
    return StepRecord(
        name, state=_text(record.get("s")), kind=_text(record.get("k")), at_ms=_whole(record.get("at")),
        result=record.get("r"), error=None if error is None else str(error), until_ms=_whole(record.get("until")))


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _whole(value: Any) -> int | None:
    """A time in ms, when the record holds a finite number there."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return int(value)
    except (OverflowError, ValueError):
        return None


def waiting_for(queue: Queue, job_ids: Sequence[str]) -> list[tuple[str | None, float | None]]:
    """Each parked job's signal (its hash's `park`) and deadline (its score in `parked`: ms, inf for none, None when
    it is not parked), in one round trip."""
    pipe = queue.client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(queue.keys.job(job_id), "park")
        pipe.zscore(queue.keys.parked, job_id)
    replies = pipe.execute(raise_on_error=False)
    # A key of another type (another client's) reads as nothing there.
    clean = [None if isinstance(reply, Exception) else reply for reply in replies]
    return list(zip(clean[::2], clean[1::2]))
