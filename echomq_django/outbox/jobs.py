"""The transactional outbox: a job enqueued inside a transaction is committed with it, then sent to Redis.

With ECHOMQ["OUTBOX"] (or a queue's own OUTBOX), an enqueue inside
`transaction.atomic()` writes the job, validated and encoded, as an OutboxJob
row of that transaction, so the job exists exactly when the data it is about
does. Right after the commit the process sends the rows it wrote, one round
trip per queue, and deletes them. A send that fails (Redis away, the process
killed) leaves them, and the relay (relaying.py's `Relay`: `echomq_sweep` runs one,
`echomq_relay` runs it alone) sends rows older than RELAY_AFTER_S. The commit
never raises because of Redis.

A row may be sent twice: the process died after the add and before the
delete, or it and a relay sent it at once. The add records each row it sends
(addJob's `sent`: the id and the row's timestamp, for OUTBOX_MAX_AGE plus an
hour), so the second send adds nothing, even once the job has completed and
been trimmed; a later enqueue of the same id, another row, is added again. Rows older than
OUTBOX_MAX_AGE are never sent: the record that would keep them from running
twice may be gone; `manage.py check --deploy` and the admin report them.
A workflow is one row of its own table, sent the same way (workflows.py).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connections, router, transaction
from django.db.models import Count, Min, Q
from redis.exceptions import RedisError

from ..conf import get_settings
from ..core import (
    UNREACHABLE,
    EchoMQError,
    EncodedJob,
    JobOptions,
    NewJob,
    Queue,
    decode_stored,
    now_ms,
    send_traced,
    validate_job_id,
    validate_job_name,
)
from ..queues import get_queue
from .models import OutboxJob, OutboxWorkflow

logger = logging.getLogger("echomq.outbox")

# A relay sends the rows at least this old: younger ones are their committing process's to send.
RELAY_AFTER_S = 5.0
# Seconds between a relay's passes, and the most rows one pass sends per query.
RELAY_INTERVAL_S = 1.0
RELAY_BATCH = 500
# Jobs per addJob call of a send (all of a queue's calls go in one round trip): small enough that a call
# stays a few milliseconds inside Redis on a busy machine (500, an add_bulk call's size, took 57 ms there).
SEND_JOBS_PER_CALL = 100
# The record of a sent id outlives the oldest row that may still be sent by this much (clocks differ).
RECORD_MARGIN_MS = 3_600_000


def new_job_id() -> str:
    """A random job id that can never look like a generated (all-digit) one."""
    return "t" + uuid.uuid4().hex


def enqueue(queue: Queue, job: NewJob, *, timestamp_ms: int | None = None, using: str | None = None) -> str:
    """Add `job` to `queue` now, or, inside a transaction on a queue with the outbox, after the commit.

    The id is returned either way (an outbox job without one gets one here).
    `using`: the database whose transaction counts (default: OutboxJob's, per the routers).
    """
    database = using or router.db_for_write(OutboxJob)
    if not (get_settings().uses_outbox(queue.name) and connections[database].in_atomic_block):
        return queue.add(job.name, job.data, opts=job.opts, job_id=job.job_id, timestamp_ms=timestamp_ms,
                         dedupe=job.dedupe)
    if job.job_id is None:
        job = NewJob(job.name, job.data, job.opts, new_job_id(), job.dedupe)

    def write(trace: str) -> list[str]:
        encoded = queue.encode(job, trace)  # refused now, in the request, rather than after the commit
        row = OutboxJob(queue=queue.name, timestamp_ms=now_ms() if timestamp_ms is None else timestamp_ms,
                        **encoded._asdict())
        # A caller's id enqueued twice in one transaction is one row, as it is one job in Redis.
        OutboxJob.objects.using(database).bulk_create([row], ignore_conflicts=True)
        _written(database).append(row)
        transaction.on_commit(lambda: send_written(database), using=database, robust=True)
        return [encoded.job_id]

    # With tracing on, the send span is the row's write: the job carries the context of the enqueue.
    [job_id] = send_traced(queue.name, write)
    return job_id


_local = threading.local()


def _written(database: str) -> list[OutboxJob]:
    """The rows this thread wrote in its transactions on `database` that no commit has sent yet."""
    if not hasattr(_local, "written"):
        _local.written = defaultdict(list)
    return _local.written[database]


def send_written(database: str) -> None:
    """After a commit: send the rows this thread wrote that the commit kept, and delete them.

    Called once per row written; the first call sends them all, the others
    find nothing left. Rows of a transaction or savepoint that rolled back
    are not in the table: the query that finds the kept ones leaves them out.
    """
    written = _written(database)
    if not written:
        return
    rows, written[:] = list(written), []
    kept = set(OutboxJob.objects.using(database).filter(pk__in=[row.pk for row in rows]).values_list("pk", flat=True))
    send(database, [row for row in rows if row.pk in kept])


@dataclass(frozen=True)
class Sent:
    """What one send did: rows added (or found added before), refused (not sendable as they are), left to retry."""

    sent: int = 0
    refused: int = 0
    unsent: int = 0

    def __add__(self, other: Sent) -> Sent:
        return Sent(self.sent + other.sent, self.refused + other.refused, self.unsent + other.unsent)


def send(database: str, rows: list[OutboxJob]) -> Sent:
    """Send `rows` to Redis, one round trip per queue, and delete those Redis took (or had already).

    A queue Redis cannot be reached on, or whose script call fails, leaves its
    rows for the relay; a row that cannot be sent as it is (checked as enqueue
    checks a job) keeps its error and is not sent again. Never raises for Redis.
    """
    done: list[Any] = []  # the rows' primary keys
    refused: dict[Any, str] = {}  # primary key -> why
    unsent = 0
    settings = get_settings()
    record_ms = settings.outbox_max_age_ms + RECORD_MARGIN_MS
    by_queue: dict[str, list[OutboxJob]] = defaultdict(list)
    for row in rows:
        by_queue[row.queue].append(row)
    for name, queue_rows in by_queue.items():
        try:
            queue = get_queue(name)
        except EchoMQError as error:
            refused.update((row.pk, str(error)) for row in queue_rows)
            continue
        readable = []
        for row in queue_rows:
            problem = _unreadable(row)
            if problem:
                refused[row.pk] = problem
            else:
                readable.append(row)
        # One call per timestamp: a job's delay counts from its own enqueue.
        by_time: dict[int, list[OutboxJob]] = defaultdict(list)
        for row in readable:
            by_time[row.timestamp_ms].append(row)
        calls, called = [], []
        for timestamp, timed in by_time.items():
            for start in range(0, len(timed), SEND_JOBS_PER_CALL):  # one call each: add_calls cuts at more
                chunk = timed[start:start + SEND_JOBS_PER_CALL]
                calls += queue.add_calls([_encoded(row) for row in chunk], timestamp, sent_ms=record_ms)
                called.append(chunk)
        if not calls:
            continue
        try:
            replies, acked = queue.scripts.run_confirmed(calls, queue.confirm)
        except (*UNREACHABLE, RedisError) as error:
            logger.warning("outbox: %d job(s) of queue %s not sent (%s); the relay sends them later",
                           len(readable), name, error)
            unsent += len(readable)
            continue
        if queue.confirm is not None and acked < queue.confirm.replicas:
            logger.warning("outbox: %d job(s) of queue %s sent, but %d of %d replicas confirmed them; they stay "
                           "in the outbox, and a later send (which adds nothing twice) tries again",
                           len(readable), name, acked, queue.confirm.replicas)
            unsent += len(readable)
            continue
        for reply, chunk in zip(replies, called):
            if isinstance(reply, Exception):
                logger.error("outbox: %d job(s) of queue %s not sent, Redis refused them (%s); sent again later",
                             len(chunk), name, reply)
                unsent += len(chunk)
            else:
                done += [row.pk for row in chunk]
    _record(database, done, refused)
    return Sent(len(done), len(refused), unsent)


def _encoded(row: OutboxJob) -> EncodedJob:
    return EncodedJob(job_id=row.job_id, name=row.name, data=row.data, opts=row.opts, delay_ms=row.delay_ms,
                      priority=row.priority, group=row.group, expires_ms=row.expires_ms, dedupe=row.dedupe,
                      dedupe_mode=row.dedupe_mode, dedupe_ms=row.dedupe_ms)


def _unreadable(row: OutboxJob) -> str:
    """Why a stored row cannot be sent ("" if it can): it was written by enqueue, but the table is anyone's.

    Checked as enqueue checked it, so that what the script refuses is Redis's
    state (out of memory, a key of another type), which may pass: such a row
    is sent again, not given up.
    """
    try:
        validate_job_id(row.job_id)
        validate_job_name(row.name)
        JobOptions(delay_ms=row.delay_ms, priority=row.priority, group=row.group)
        decode_stored(row.data)
        if not isinstance(decode_stored(row.opts), dict):
            return "opts is not a JSON object"
    except (EchoMQError, ValueError, TypeError) as error:
        return str(error)
    return ""


def _record(database: str, done: list[Any], refused: dict[Any, str]) -> None:
    """Delete the rows sent; keep each refused one's error. A database error is logged (the row is sent again)."""
    try:
        with transaction.atomic(using=database):
            if done:
                OutboxJob.objects.using(database).filter(pk__in=done).delete()
            for pk, reason in refused.items():
                OutboxJob.objects.using(database).filter(pk=pk).update(error=reason[:2000])
    except DatabaseError as error:
        logger.warning("outbox: %d sent row(s) not deleted (%s); a later send adds nothing twice", len(done), error)
    for pk, reason in refused.items():
        logger.error("outbox: row %s refused, not sent again: %s", pk, reason)


def relay(*, batch: int = RELAY_BATCH, after_s: float = RELAY_AFTER_S, now: int | None = None,
          using: str | None = None) -> Sent:
    """Send one batch of the rows at least `after_s` old and younger than OUTBOX_MAX_AGE, oldest first.

    Where the database has SELECT ... FOR UPDATE SKIP LOCKED, the rows one
    relay sends are locked until it has deleted them, so relays running at
    once send different rows; elsewhere (SQLite) two may send one row, and
    the add's record keeps the second from adding anything, and no
    transaction is held while Redis answers (it would hold off every commit).
    """
    return relay_batch(batch=batch, after_s=after_s, now=now, using=using)[0]


def relay_batch(*, batch: int = RELAY_BATCH, after_s: float = RELAY_AFTER_S, now: int | None = None,
                using: str | None = None, past: tuple[int, Any] | None = None) -> tuple[Sent, tuple[int, Any] | None]:
    """`relay`, from the rows after `past` (a row's timestamp and id) on: (what it did, where the next batch starts).

    The next batch starts after this one's last row, None when this one was
    not full: rows left to retry (their queue's calls failed) do not come
    back in the same pass, so they hold up no row behind them.
    """
    database = using or router.db_for_write(OutboxJob)
    now = now_ms() if now is None else now
    rows = OutboxJob.objects.using(database).filter(
        error="", timestamp_ms__lte=now - after_s * 1000,  # at least after_s old: with 0, every row there
        timestamp_ms__gte=now - get_settings().outbox_max_age_ms).order_by("timestamp_ms", "pk")
    if past is not None:
        rows = rows.filter(Q(timestamp_ms__gt=past[0]) | Q(timestamp_ms=past[0], pk__gt=past[1]))
    if connections[database].features.has_select_for_update_skip_locked:
        with transaction.atomic(using=database):  # the rows stay locked until sent and deleted
            taken = list(rows.select_for_update(skip_locked=True)[:batch])
            sent = send(database, taken)
    else:
        # No transaction around the send: on SQLite its read lock would hold every commit off for as long as
        # Redis takes to answer (ENQUEUE_TIMEOUT per queue), and a commit gives up after 5 s.
        taken = list(rows[:batch])
        sent = send(database, taken)
    return sent, ((taken[-1].timestamp_ms, taken[-1].pk) if len(taken) == batch else None)


@dataclass(frozen=True)
class QueueOutbox:
    """A queue's rows in the outbox: how many, the oldest one's age, those too old and those refused (never sent)."""

    rows: int
    oldest_age_s: float
    stale: int
    refused: int


def outbox_state(now: int | None = None, using: str | None = None) -> dict[str, QueueOutbox]:
    """Per queue with rows in the outbox (a workflow's row counts as one, in its home queue), what `QueueOutbox`
    says; two queries per table."""
    database = using or router.db_for_write(OutboxJob)
    now = now_ms() if now is None else now
    oldest_allowed = now - get_settings().outbox_max_age_ms
    rows: dict[str, int] = defaultdict(int)
    oldest: dict[str, int] = {}
    stale: dict[str, int] = defaultdict(int)
    refused: dict[str, int] = defaultdict(int)
    for model in (OutboxJob, OutboxWorkflow):
        table = model.objects.using(database)
        for row in table.values("queue").annotate(rows=Count("pk"), oldest=Min("timestamp_ms")):
            rows[row["queue"]] += row["rows"]
            oldest[row["queue"]] = min(oldest.get(row["queue"], row["oldest"]), row["oldest"])
        for queue, error in table.exclude(error="", timestamp_ms__gte=oldest_allowed).values_list("queue", "error"):
            if error:
                refused[queue] += 1
            else:
                stale[queue] += 1
    return {queue: QueueOutbox(rows[queue], max(0.0, (now - oldest[queue]) / 1000), stale[queue], refused[queue])
            for queue in sorted(rows)}


def outbox_in_use() -> bool:
    """Whether ECHOMQ or any configured queue has OUTBOX on, or rows are left in the outbox (it was on before).

    Then echomq_sweep relays and the check, the status and the metrics show the
    outbox. With OUTBOX off the table is only looked at (a failure to read it,
    as before its migration, counts as no rows): rows written while it was on,
    or by a previous release's processes during a deploy, are still sent.
    """
    settings = get_settings()
    if any(settings.uses_outbox(name) for name in settings.queues):
        return True
    database = router.db_for_write(OutboxJob)
    try:
        with transaction.atomic(using=database):  # a savepoint inside a request's transaction: a failure ends here
            return OutboxJob.objects.using(database).exists() or OutboxWorkflow.objects.using(database).exists()
    except DatabaseError:
        return False
