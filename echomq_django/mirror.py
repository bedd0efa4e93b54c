"""Keep the JobRecord rows in step with each queue's failed and stalled sets.

A sync reads only what changed: failed jobs scored after the queue's cursor
(minus a margin for clocks that disagree between hosts), and the stalled set,
which is small. Rows are written in batches with one upsert each. A whole-set
comparison runs only when the counts of Redis and the mirror disagree (a job
left the failed set, or arrived with an old score), so a queue with 100,000
failed jobs and no news costs two counts and one short range read.

Redis may hold what no other client checked (scores of 1e20 or inf, counters
no column holds): such a job is clamped into range or, if the database still
refuses its row, skipped and logged, so it never hides the other jobs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import DatabaseError, transaction

from .core import Job, Queue
from .core.job import datetime_from_ms
from .core.queue import batched, now_ms
from .models import JobRecord, MirrorCursor

BATCH = 1000
# How far before the cursor each sync looks again for failed jobs: covers
# workers whose clocks run a little behind the one that moved the cursor. A job
# scored further back is still found: the counts then disagree and the sync
# compares the whole set.
CLOCK_MARGIN_MS = 5_000
# The range of score_ms (a BigIntegerField, 64 bits).
SCORE_MIN_MS, SCORE_MAX_MS = -(2**63), 2**63 - 1
UPDATE_FIELDS = ["name", "state", "data", "opts", "attempts_made", "stall_count", "failed_reason",
                 "stacktrace", "created_at", "processed_at", "finished_at", "score_ms", "synced_at"]

logger = logging.getLogger("echomq.mirror")


@dataclass(frozen=True)
class SyncResult:
    queue: str
    written: int
    deleted: int
    compared_all: bool
    duration_ms: float

    def summary(self) -> str:
        full = ", compared all ids" if self.compared_all else ""
        return (f"mirror of {self.queue}: {self.written} row(s) written, {self.deleted} deleted "
                f"in {self.duration_ms:.0f} ms{full}")


def clamped_score_ms(score: float) -> int:
    """A failed-set score as a whole number of ms that score_ms can hold.

    Clamped rather than dropped: the row keeps a score equal to what the next
    sync computes from Redis, so it is not rewritten on every sync.
    """
    if math.isinf(score):
        return SCORE_MAX_MS if score > 0 else SCORE_MIN_MS
    return min(max(int(score), SCORE_MIN_MS), SCORE_MAX_MS)


def _record(job: Job, state: str, score_ms: int | None) -> JobRecord:
    return JobRecord(
        queue=job.queue, job_id=job.id, name=job.name[:255], state=state, data=job.data,
        opts=job.opts.to_json(), attempts_made=job.attempts_made, stall_count=job.stall_count,
        failed_reason=job.failed_reason or "", stacktrace=job.stacktrace,
        created_at=datetime_from_ms(job.timestamp), processed_at=datetime_from_ms(job.processed_on),
        finished_at=datetime_from_ms(job.finished_on) or datetime_from_ms(score_ms), score_ms=score_ms,
    )


def _write(queue: Queue, state: str, scored_ids: list[tuple[str, int | None]]) -> int:
    """Read these jobs' hashes in one pipeline and upsert their rows in one statement."""
    pipe = queue.client.pipeline(transaction=False)
    for job_id, _score in scored_ids:
        pipe.hgetall(queue.keys.job(job_id))
    records = []
    for (job_id, score), fields in zip(scored_ids, pipe.execute(raise_on_error=False)):
        wrong_type = isinstance(fields, Exception)  # a key another client overwrote
        job = Job.from_hash(queue.name, job_id, {} if wrong_type else fields)
        if wrong_type:
            job.failed_reason = "the job key holds another type than a hash"
        elif not fields:
            job.failed_reason = "the job hash no longer exists in Redis"
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
    for batch in batched(job_ids, BATCH):
        deleted += JobRecord.objects.filter(queue=queue.name, state=state, job_id__in=batch).delete()[0]
    return deleted


def _new_or_changed(queue: Queue, state: str, scored_ids: list[tuple[str, int | None]]) -> list[tuple[str, int | None]]:
    known = dict(JobRecord.objects.filter(queue=queue.name, state=state, job_id__in=[i for i, _ in scored_ids])
                 .values_list("job_id", "score_ms"))
    return [(job_id, score) for job_id, score in scored_ids if job_id not in known or known[job_id] != score]


def _sync_failed_since(queue: Queue, since_ms: int) -> tuple[int, int]:
    """Upsert failed jobs scored at or after `since_ms`; returns (rows written, highest score)."""
    written, highest, offset = 0, since_ms, 0
    while True:
        page = queue.client.zrangebyscore(queue.keys.failed, since_ms, "+inf", start=offset, num=BATCH,
                                          withscores=True)
        if not page:
            return written, highest
        scored = [(job_id, clamped_score_ms(score)) for job_id, score in page]
        highest = max(highest, scored[-1][1])
        changed = _new_or_changed(queue, JobRecord.State.FAILED, scored)
        if changed:
            written += _write(queue, JobRecord.State.FAILED, changed)
        offset += len(page)


def _compare_all_failed(queue: Queue) -> tuple[int, int]:
    """Make the failed rows equal the failed set, id by id; returns (written, deleted)."""
    in_redis: dict[str, int] = {}
    for start in range(0, queue.client.zcard(queue.keys.failed), BATCH * 10):
        for job_id, score in queue.client.zrange(queue.keys.failed, start, start + BATCH * 10 - 1, withscores=True):
            in_redis[job_id] = clamped_score_ms(score)
    in_mirror = set(JobRecord.objects.filter(queue=queue.name, state=JobRecord.State.FAILED)
                    .values_list("job_id", flat=True).iterator(chunk_size=10_000))
    written = 0
    for batch in batched(sorted(set(in_redis) - in_mirror), BATCH):
        written += _write(queue, JobRecord.State.FAILED, [(job_id, in_redis[job_id]) for job_id in batch])
    return written, _delete(queue, JobRecord.State.FAILED, in_mirror - set(in_redis))


def _sync_stalled(queue: Queue) -> tuple[int, int]:
    in_redis = queue.stalled_ids()
    in_mirror = set(JobRecord.objects.filter(queue=queue.name, state=JobRecord.State.STALLED)
                    .values_list("job_id", flat=True))
    written = 0
    for batch in batched(sorted(in_redis - in_mirror), BATCH):
        written += _write(queue, JobRecord.State.STALLED, [(job_id, None) for job_id in batch])
    return written, _delete(queue, JobRecord.State.STALLED, in_mirror - in_redis)


def sync_queue(queue: Queue) -> SyncResult:
    """Bring the mirror of one queue's failed and stalled sets up to date."""
    started = time.perf_counter()
    cursor, _ = MirrorCursor.objects.get_or_create(queue=queue.name)
    written, highest = _sync_failed_since(queue, max(0, cursor.failed_through_ms - CLOCK_MARGIN_MS))
    deleted, compared_all = 0, False
    mirrored = JobRecord.objects.filter(queue=queue.name, state=JobRecord.State.FAILED).count()
    if mirrored != queue.client.zcard(queue.keys.failed):
        more_written, deleted = _compare_all_failed(queue)
        written, compared_all = written + more_written, True
    stalled_written, stalled_deleted = _sync_stalled(queue)
    # Never past the present: a job scored in the far future (1e20, inf) would
    # otherwise leave every later failure behind the cursor, found only by a
    # whole-set comparison. Jobs scored ahead of now are simply read again.
    through_ms = min(highest, now_ms())
    if through_ms > cursor.failed_through_ms:
        MirrorCursor.objects.filter(pk=cursor.pk).update(failed_through_ms=through_ms)
    return SyncResult(queue.name, written + stalled_written, deleted + stalled_deleted, compared_all,
                      (time.perf_counter() - started) * 1000)
