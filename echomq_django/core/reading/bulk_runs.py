"""A bulk change run outside the request that asked for it, in steps, each step a job of the queue it changes.

A run is a record (QueueKeys.bulk_run, a HASH) and, once read, its ids in
order (QueueKeys.bulk_run_ids, a LIST). Each step changes the ids from the
record's `cursor` on, BULK_BATCH per round trip, at most STEP_JOBS in all, so
one step's time is bounded whatever the run's size. A run survives the crash
of whoever runs it, and two runners at once:

- each round trip carries a token named after the run and its place in the
  ids (`<run>.<cursor>`), and its scripts keep their answers under it for
  ANSWERS_MS: a round trip sent again, by the same runner after a lost reply or
  by another after a crash, changes no job twice and gets the same answers;
- the cursor moves on and the counts grow in one transaction, and only from the
  cursor the round trip started at (WATCH): a round trip whose counts another
  runner has already added adds nothing.

So every job is changed at most once and counted exactly once.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import WatchError

from ..producing.outcomes import BULK_BATCH, BulkOutcome, batched
from ..producing.queue import Queue
from ..protocol.codec import decode_stored
from ..protocol.times import now_ms
from .browse import state_ids

logger = logging.getLogger("echomq.admin")

# Ids one step changes at most (ten round trips).
STEP_JOBS = 5_000
# How long a run's round trips keep their answers: far longer than a runner takes to be replaced (the lock
# duration, then a sweep) and than one step takes.
ANSWERS_MS = 3_600_000
# How long a run's record (and its ids) stays after its latest step: its page shows it that long.
RUN_KEPT_MS = 7 * 86_400_000
# Ids a run keeps per reason it left jobs alone, to name them on its page.
IDS_KEPT = 10
ACTIONS = ("retry", "cancel", "delete")


@dataclass
class RunCounts:
    """What a run did so far: jobs changed, and per reason for leaving jobs alone, how many and the first few."""

    done: int = 0
    other: dict[str, list[Any]] = field(default_factory=dict)  # why: [count, [first IDS_KEPT ids]]

    def merge(self, outcome: BulkOutcome) -> None:
        self.done += len(outcome.done)
        for why, ids in outcome.other.items():
            count, first = self.other.setdefault(why, [0, []])
            self.other[why] = [count + len(ids), (first + ids)[:IDS_KEPT]]

    def encoded(self) -> str:
        return json.dumps({"done": self.done, "other": self.other})

    @classmethod
    def decoded(cls, text: str | None) -> RunCounts:
        """The counts as `encoded` wrote them; what another client broke is left out (the run goes on)."""
        try:
            fields = decode_stored(text) if text else {}
        except ValueError:
            fields = {}
        fields = fields if isinstance(fields, dict) else {}
        done, other = fields.get("done", 0), fields.get("other", {})
        counts = cls(done if _whole(done) else 0)
        for why, entry in other.items() if isinstance(other, dict) else ():
            if isinstance(entry, list) and len(entry) == 2 and _whole(entry[0]) and isinstance(entry[1], list):
                counts.other[why] = [entry[0], [str(job_id) for job_id in entry[1][:IDS_KEPT]]]
        return counts


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class BulkRun:
    """A run as its record has it."""

    run_id: str
    action: str
    state: str  # the list it was asked on (the message's wording; a delete's only_from)
    status: str  # "reading" (its ids), "running", "done"
    total: int  # ids to change (0 while reading)
    cursor: int  # ids changed so far
    counts: RunCounts
    fields: dict[str, str]  # the caller's own (who asked, where), as given to start_run

    @property
    def finished(self) -> bool:
        return self.status == "done"


def start_run(queue: Queue, action: str, state: str, ids: list[str] | None, fields: dict[str, str],
              reason: str = "", only_from: str = "") -> str:
    """Record a run of `action` on `ids` (None: every id `state` holds when its first step reads them); its id."""
    if action not in ACTIONS:
        raise ValueError(f"a run's action is one of {', '.join(ACTIONS)}, not {action!r}")
    run_id = secrets.token_hex(8)
    key = queue.keys.bulk_run(run_id)
    pipe = queue.client.pipeline(transaction=True)
    if ids:
        for chunk in batched(ids, 1000):
            pipe.rpush(queue.keys.bulk_run_ids(run_id), *chunk)
        pipe.pexpire(queue.keys.bulk_run_ids(run_id), RUN_KEPT_MS)
    pipe.hset(key, mapping={**{f"f:{name}": value for name, value in fields.items()}, "action": action,
                            "state": state, "reason": reason, "only_from": only_from, "cursor": 0,
                            "status": "reading" if ids is None else "running", "total": len(ids or []),
                            "counts": RunCounts().encoded(), "created_ms": now_ms()})
    pipe.pexpire(key, RUN_KEPT_MS)
    pipe.execute()
    return run_id


def read_run(queue: Queue, run_id: str) -> BulkRun | None:
    """The run's record, or None when there is none (never started, or lapsed)."""
    record = queue.client.hgetall(queue.keys.bulk_run(run_id))
    if not record or record.get("action") not in ACTIONS:
        return None
    total, cursor = record.get("total", "0"), record.get("cursor", "0")
    if not (total.isdigit() and cursor.isdigit() and total.isascii() and cursor.isascii()):
        logger.warning("queue %s: bulk run %s has a broken record (total %.40r, cursor %.40r); it is left alone",
                       queue.name, run_id, total, cursor)
        return None
    return BulkRun(run_id, record["action"], record.get("state", ""), record.get("status", ""),
                   int(total), int(cursor), RunCounts.decoded(record.get("counts")),
                   {name[2:]: value for name, value in record.items() if name.startswith("f:")})


def run_step(queue: Queue, run_id: str, after: Callable[[BulkOutcome], None] = lambda outcome: None,
             limit: int = STEP_JOBS, batch: int = BULK_BATCH) -> BulkRun | None:
    """Change the run's next `limit` ids or so (`batch` per round trip; `after` each outcome); the run as it is then."""
    run = read_run(queue, run_id)
    if run is not None and run.status == "reading":
        _read_ids(queue, run)
    changed = 0
    while (run := read_run(queue, run_id)) is not None and not run.finished and changed < limit:
        ids = queue.client.lrange(queue.keys.bulk_run_ids(run_id), run.cursor, run.cursor + batch - 1)
        if not ids:
            _commit(queue, run, [], BulkOutcome())
            continue
        outcome = _change(queue, run, ids)
        after(outcome)
        _commit(queue, run, ids, outcome)
        changed += len(ids)
    return run


def _read_ids(queue: Queue, run: BulkRun) -> None:
    """Take every id the run's state holds now as the run's ids (read again whole if a runner died reading)."""
    ids = state_ids(queue, run.state)
    key, ids_key = queue.keys.bulk_run(run.run_id), queue.keys.bulk_run_ids(run.run_id)
    with queue.client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)
            if pipe.hget(key, "status") != "reading":
                return  # another runner read them first
            pipe.multi()
            pipe.delete(ids_key)
            for chunk in batched(ids, 1000):
                pipe.rpush(ids_key, *chunk)
            pipe.pexpire(ids_key, RUN_KEPT_MS)
            pipe.hset(key, mapping={"status": "running", "total": len(ids)})
            pipe.execute()
        except WatchError:
            pass  # another runner read them meanwhile: its ids stand


def _change(queue: Queue, run: BulkRun, ids: list[str]) -> BulkOutcome:
    """One round trip of the run's action on `ids`, answered once per its place in the run."""
    record = queue.client.hmget(queue.keys.bulk_run(run.run_id), "reason", "only_from")
    token = f"{run.run_id}.{run.cursor}"
    if run.action == "retry":
        return queue.retry_many(ids, token=token, record_ms=ANSWERS_MS)
    if run.action == "cancel":
        return queue.cancel_many(ids, reason=record[0] or "", token=token, record_ms=ANSWERS_MS)
    return queue.remove_many(ids, only_from=record[1] or None, token=token, record_ms=ANSWERS_MS)


def _commit(queue: Queue, run: BulkRun, ids: list[str], outcome: BulkOutcome) -> None:
    """Move the cursor past `ids` and add their outcome, unless another runner moved it first; done at the end."""
    key = queue.keys.bulk_run(run.run_id)
    with queue.client.pipeline(transaction=True) as pipe:
        try:
            pipe.watch(key)
            if int(pipe.hget(key, "cursor") or 0) != run.cursor:
                return  # another runner counted this round trip
            counts = RunCounts.decoded(pipe.hget(key, "counts"))
            counts.merge(outcome)
            pipe.multi()
            pipe.hset(key, mapping={"cursor": run.cursor + len(ids), "counts": counts.encoded()})
            if not ids:
                pipe.hset(key, mapping={"status": "done", "finished_ms": now_ms()})
            pipe.pexpire(key, RUN_KEPT_MS)
            pipe.pexpire(queue.keys.bulk_run_ids(run.run_id), RUN_KEPT_MS)
            pipe.execute()
        except WatchError:
            pass  # the same: another runner's commit came first

