"""Keep the JobRecord rows in step with each queue's failed and stalled sets.

A sync reads only what changed: failed jobs scored after the queue's cursor
(minus a margin for clocks that disagree between hosts), and the stalled set,
which is small. Rows are written in batches with one upsert each. A whole-set
comparison runs only when the counts of Redis and the mirror disagree (a job
left the failed set, or arrived with an old score), so a queue with 100,000
failed jobs and no news costs two counts and one short range read.

`echomq_sweep` syncs without a limit after every sweep. The admin syncs each
time a list is opened, with a limit (`sync_queue(queue, limit=...)`), so a
large backlog cannot hold the page: then only the newest failures are copied,
the whole-set comparison is left to the sweeper, and the result says the copy
is incomplete. The cursor's `synced_at` is the time of the last complete sync.

Redis may hold what no other client checked (scores of 1e20 or inf, counters
no column holds): such a job is clamped into range or, if the database still
refuses its row, skipped and logged, so it never hides the other jobs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import DatabaseError, transaction
from django.utils import timezone

from .core import (
    Job,
    Queue,
    count_failed_since,
    datetime_from_ms,
    failed_by_rank,
    failed_count,
    failed_since,
    read_jobs,
)
from .models import JobRecord, MirrorCursor

T = TypeVar("T")
# A row's state, as the str it is: a member of JobRecord.State is a str at run time, but mypy, with Django
# untyped, reads each as the (value, label) pair it is declared as.
FAILED, STALLED = str(JobRecord.State.FAILED), str(JobRecord.State.STALLED)
BATCH = 1000
# How far before the cursor each sync looks again for failed jobs: covers
# workers whose clocks run a little behind the one that moved the cursor. A job
# scored further back is still found: the counts then disagree and the sync
# compares the whole set.
CLOCK_MARGIN_MS = 5_000
# A limited sync compares the whole set only up to this many times its limit of ids.
COMPARE_FACTOR = 20
# The range of score_ms (a BigIntegerField, 64 bits).
SCORE_MIN_MS, SCORE_MAX_MS = -(2**63), 2**63 - 1
UPDATE_FIELDS = ["name", "state", "data", "opts", "attempts_made", "stall_count", "failed_reason",
                 "stacktrace", "error_class", "created_at", "processed_at", "finished_at", "score_ms", "synced_at"]

logger = logging.getLogger("echomq.mirror")


@dataclass(frozen=True)
class SyncResult:
    queue: str
    written: int
    deleted: int
    compared_all: bool
    duration_ms: float
    # False: a limited sync left work for the next one; the rows may miss up to
    # `pending` failed or marked jobs, or still hold some that left Redis.
    complete: bool = True
    pending: int = 0

    def summary(self) -> str:
        full = ", compared all ids" if self.compared_all else ""
        behind = "" if self.complete else f", incomplete (about {self.pending} job(s) left for the next sync)"
        return (f"mirror of {self.queue}: {self.written} row(s) written, {self.deleted} deleted "
                f"in {self.duration_ms:.0f} ms{full}{behind}")


def clamped_score_ms(score: float) -> int:
    """A failed-set score as a whole number of ms that score_ms can hold.

    Clamped rather than dropped: the row keeps a score equal to what the next
    sync computes from Redis, so it is not rewritten on every sync.
    """
    if math.isinf(score):
        return SCORE_MAX_MS if score > 0 else SCORE_MIN_MS
    return min(max(int(score), SCORE_MIN_MS), SCORE_MAX_MS)


def _batches(items: Iterable[T], size: int = BATCH) -> Iterator[list[T]]:
    ordered = list(items)
    for start in range(0, len(ordered), size):
        yield ordered[start:start + size]


# What every database the mirror runs on can store: PostgreSQL's text and jsonb
# refuse NUL characters and lone surrogates, and its integer column stops at 2**31 - 1.
_INT_MAX = 2**31 - 1


def storable(value: Any) -> Any:
    """`value` (text, or JSON data) with NUL as U+FFFD and lone surrogates as "?", keys included.

    Job fields come from Job.from_hash, which keeps a field nested too deeply for this
    recursion (or for the database's JSON checks) as its text (core's TooDeep).
    """
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [storable(item) for item in value]
    if isinstance(value, dict):
        return {storable(key): storable(item) for key, item in value.items()}
    return value


def _record(job: Job, state: str, score_ms: int | None) -> JobRecord:
    return JobRecord(
        queue=job.queue, job_id=job.id, name=storable(job.name[:255]), state=state, data=storable(job.data),
        opts=job.opts.to_json(), attempts_made=min(job.attempts_made, _INT_MAX),
        stall_count=min(job.stall_count, _INT_MAX),
        failed_reason=storable(job.failed_reason or ""), stacktrace=storable(job.stacktrace),
        error_class=storable(str(job.error_classes[-1])[:255]) if job.error_classes else "",
        created_at=datetime_from_ms(job.timestamp), processed_at=datetime_from_ms(job.processed_on),
        finished_at=datetime_from_ms(job.finished_on) or datetime_from_ms(score_ms), score_ms=score_ms,
    )


def _write(queue: Queue, state: str, scored_ids: list[tuple[str, int | None]]) -> int:
    """Read these jobs' hashes in one pipeline and upsert their rows in one statement."""
    records = []
    for (_job_id, score), read in zip(scored_ids, read_jobs(queue, [job_id for job_id, _ in scored_ids])):
        job = read.job or Job.from_hash(queue.name, read.job_id, {})
        if read.problem:
            job.failed_reason = read.problem
        records.append(_record(job, state, score))
    try:
        _upsert(records)
        return len(records)
    except (DatabaseError, OverflowError):  # sqlite3 raises OverflowError for ints beyond 64 bits
        pass  # one row the database refuses fails the whole statement: write them one by one
    written = 0
    for record in records:
        try:
            _upsert([record])
            written += 1
        except (DatabaseError, OverflowError) as error:
            logger.error("mirror of queue %s: job %s skipped, the database refused its row: %s",
                         queue.name, record.job_id, error)
    return written


def _upsert(records: list[JobRecord]) -> None:
    # A savepoint of its own, so that a refused statement leaves the transaction around it usable.
    with transaction.atomic():
        JobRecord.objects.bulk_create(records, update_conflicts=True, unique_fields=["queue", "job_id"],
                                      update_fields=UPDATE_FIELDS)


def _delete(queue: Queue, state: str, job_ids: Iterable[str]) -> int:
    deleted = 0
    for batch in _batches(job_ids):
        deleted += JobRecord.objects.filter(queue=queue.name, state=state, job_id__in=batch).delete()[0]
    return deleted


def _new_or_changed(queue: Queue, state: str, scored_ids: list[tuple[str, int | None]]) -> list[tuple[str, int | None]]:
    # A row without its exception class (copied before the column existed) is copied again.
    known = {job_id: (score, error_class) for job_id, score, error_class in JobRecord.objects.filter(
        queue=queue.name, state=state, job_id__in=[i for i, _ in scored_ids]).values_list(
        "job_id", "score_ms", "error_class")}
    return [(job_id, score) for job_id, score in scored_ids
            if job_id not in known or known[job_id][0] != score or known[job_id][1] is None]


def _copy_failed(queue: Queue, page: list[tuple[str, float]]) -> int:
    """Upsert the rows of these (id, score) pairs of the failed set that are new or changed."""
    changed = _new_or_changed(queue, FAILED,
                              [(job_id, clamped_score_ms(score)) for job_id, score in page])
    return _write(queue, FAILED, changed) if changed else 0


def _sync_failed_since(queue: Queue, since_ms: int, limit: int | None = None) -> tuple[int, int, bool]:
    """Upsert failed jobs scored at or after `since_ms`, oldest first.

    Returns (rows written, highest score read, whether it read them all). With
    `limit`, it stops once it wrote that many rows or read COMPARE_FACTOR times
    as many ids; everything scored below the highest score read is then copied.
    """
    written, highest, offset = 0, since_ms, 0
    page_size = BATCH if limit is None else min(BATCH, limit)
    while page := failed_since(queue, since_ms, offset=offset, count=page_size):
        highest = max(highest, clamped_score_ms(page[-1][1]))
        written += _copy_failed(queue, page)
        offset += len(page)
        if limit is not None and (written >= limit or offset >= limit * COMPARE_FACTOR):
            return written, highest, not failed_since(queue, since_ms, offset=offset, count=1)
    return written, highest, True


def _copy_newest_failed(queue: Queue, limit: int) -> int:
    """Upsert the newest `limit` failed jobs that are new or changed."""
    written = 0
    for offset in range(0, limit, BATCH):
        page = failed_since(queue, -math.inf, offset=offset, count=min(BATCH, limit - offset), newest_first=True)
        written += _copy_failed(queue, page)
    return written


def _compare_all_failed(queue: Queue) -> tuple[int, int]:
    """Make the failed rows equal the failed set, id by id; returns (written, deleted)."""
    in_redis: dict[str, int] = {}
    for start in range(0, failed_count(queue), BATCH * 10):
        for job_id, score in failed_by_rank(queue, start, BATCH * 10):
            in_redis[job_id] = clamped_score_ms(score)
    in_mirror = set(JobRecord.objects.filter(queue=queue.name, state=FAILED)
                    .values_list("job_id", flat=True).iterator(chunk_size=10_000))
    written = 0
    for batch in _batches(sorted(set(in_redis) - in_mirror)):
        written += _write(queue, FAILED, [(job_id, in_redis[job_id]) for job_id in batch])
    return written, _delete(queue, FAILED, in_mirror - set(in_redis))


def _sync_stalled(queue: Queue, limit: int | None) -> tuple[int, int, int]:
    """Make the stalled rows follow the marks; returns (written, deleted, marks left uncopied)."""
    in_redis = queue.stalled_ids()
    in_mirror = set(JobRecord.objects.filter(queue=queue.name, state=STALLED)
                    .values_list("job_id", flat=True))
    new = sorted(in_redis - in_mirror)
    copied = new if limit is None else new[:limit]
    written = 0
    for batch in _batches(copied):
        written += _write(queue, STALLED, [(job_id, None) for job_id in batch])
    return written, _delete(queue, STALLED, in_mirror - in_redis), len(new) - len(copied)


def sync_queue(queue: Queue, *, limit: int | None = None) -> SyncResult:
    """Bring the mirror of one queue's failed and stalled sets up to date.

    With `limit`, write about that many rows of each set at most, and compare
    whole sets only while neither side holds more than COMPARE_FACTOR * limit ids. A larger backlog of
    failures is copied from both ends: the oldest (the cursor moves past them)
    and the newest (the first page of the admin's list); the rest is left to
    the next sync, and the result says so.
    """
    started = time.perf_counter()
    cursor = MirrorCursor.objects.filter(queue=queue.name).first()
    since = max(0, (cursor.failed_through_ms if cursor else 0) - CLOCK_MARGIN_MS)
    deleted, compared_all, pending = 0, False, 0
    written, highest, read_all = _sync_failed_since(queue, since, limit)
    if not read_all and limit is not None:
        written += _copy_newest_failed(queue, limit)
        pending = max(1, count_failed_since(queue, highest) - limit)
    else:
        in_redis = failed_count(queue)
        mirrored = JobRecord.objects.filter(queue=queue.name, state=FAILED).count()
        if mirrored != in_redis and (limit is None or max(in_redis, mirrored) <= limit * COMPARE_FACTOR):
            more_written, deleted = _compare_all_failed(queue)
            written, compared_all = written + more_written, True
        elif mirrored != in_redis:
            pending = abs(in_redis - mirrored)
    stalled_written, stalled_deleted, stalled_pending = _sync_stalled(queue, limit)
    pending += stalled_pending
    _advance(queue.name, cursor, highest, complete=not pending)
    return SyncResult(queue.name, written + stalled_written, deleted + stalled_deleted, compared_all,
                      (time.perf_counter() - started) * 1000, complete=not pending, pending=pending)


def _advance(queue_name: str, cursor: MirrorCursor | None, highest_ms: int, *, complete: bool) -> None:
    """Move the cursor to `highest_ms`, and stamp `synced_at` when the sync left nothing behind."""
    # Never past the present: a job scored in the far future (1e20, inf) would
    # otherwise leave every later failure behind the cursor, found only by a
    # whole-set comparison. Jobs scored ahead of now are simply read again.
    through_ms = min(highest_ms, int(time.time() * 1000))
    changes: dict[str, object] = {}
    if through_ms > (cursor.failed_through_ms if cursor else 0):
        changes["failed_through_ms"] = through_ms
    if complete:
        changes["synced_at"] = timezone.now()
    if cursor is None:
        MirrorCursor.objects.get_or_create(queue=queue_name, defaults=changes)
    elif changes:
        MirrorCursor.objects.filter(pk=cursor.pk).update(**changes)
