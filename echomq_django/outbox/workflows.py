"""Workflows through the transactional outbox: one row per workflow, written in the transaction that enqueued it.

With OUTBOX on for a workflow's home queue (the queue of its first job), an
enqueue inside `transaction.atomic()` plans the workflow (everything checked,
its id known) and writes one OutboxWorkflow row of that transaction: the
workflow's shape and jobs, as planned. Right after the commit the process adds
the plan and deletes the row; a row left behind (Redis away, the process
killed) is sent by the relay (relaying.Relay) as job rows are.

A row may be sent twice (its process died after the add and before the
delete, or it raced a relay on SQLite). The relay plans it again under the
same workflow id: its jobs get the same ids and its addWorkflow calls the
same tokens, and each call's reply is kept under its token for as long as
the row may be sent (OUTBOX_MAX_AGE plus an hour), so the second send adds
nothing, even once the jobs ran and were trimmed. A row holds at most
MAX_ROW_BYTES: a larger workflow is refused at its enqueue, in the transaction.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import defaultdict
from typing import Any

from django.db import DatabaseError, connections, router, transaction
from django.db.models import Q
from redis.exceptions import RedisError

from ..conf import get_settings
from ..core import (
    MAX_DEPTH,
    UNREACHABLE,
    Chain,
    Chord,
    EchoMQError,
    Group,
    JobOptions,
    Linked,
    Member,
    Plan,
    WorkflowError,
    decode_stored,
    now_ms,
    validate_job_id,
)
from ..queues import get_queue
from .jobs import RECORD_MARGIN_MS, RELAY_AFTER_S, Sent
from .models import OutboxWorkflow

logger = logging.getLogger("echomq.outbox")

# The most bytes one row's canvas may hold: a row is read whole by its relay. 16 MiB takes a chord of 10,000
# jobs of 1 KB arguments each; 100,000 jobs of small arguments (100 bytes each) take about 15 MB.
MAX_ROW_BYTES = 16 * 1024 * 1024
# Rows one relay query sends (each may be MAX_ROW_BYTES, and its plan more in memory).
RELAY_BATCH = 4


def uses_outbox(plan: Plan, database: str) -> bool:
    """Whether `plan` is written to the outbox: OUTBOX on for its home queue, inside a transaction on `database`."""
    return get_settings().uses_outbox(plan.home.name) and connections[database].in_atomic_block


def write(plan: Plan, database: str) -> None:
    """Write `plan` as a row of the transaction open on `database`, added to Redis after the commit.

    WorkflowError when the row would hold more than MAX_ROW_BYTES.
    """
    text = canvas_text(plan)
    size = len(text.encode())
    if size > MAX_ROW_BYTES:
        raise WorkflowError(
            f"workflow {plan.id} ({len(plan.steps)} jobs) is {size:,} bytes as an outbox row, more than the "
            f"{MAX_ROW_BYTES:,} a row holds: enqueue it in smaller workflows, or after the commit "
            "(transaction.on_commit), without the outbox's guarantee")
    row = OutboxWorkflow(queue=plan.home.name, workflow_id=plan.id, jobs=len(plan.steps), canvas=text,
                         ttl_ms=plan.ttl_ms, timestamp_ms=now_ms())
    row.save(using=database, force_insert=True)
    _written(database).append((row, plan))
    transaction.on_commit(lambda: send_written(database), using=database, robust=True)


def canvas_text(plan: Plan) -> str:
    """The row's JSON: the plan's tree, each step as ["job", queue, name, data, opts, immutable, allow_failure]."""
    steps = {step.id: step for step in plan.steps}

    def shape(node: Any) -> Any:
        if len(node) == 3:  # a chain, group or chord; a step is [queue, id]
            return [node[0], [shape(part) for part in node[1]], None if node[2] is None else shape(node[2])]
        member = steps[node[1]].member
        return ["job", member.queue.name, member.name, member.data, member.opts.to_json(), member.immutable,
                member.allow_failure, member.job_id]

    return json.dumps(shape(plan.tree), separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def plan_of(row: OutboxWorkflow) -> Plan:
    """The row's workflow planned again with its id, so its jobs' ids (an EchoMQError says why it cannot be).

    Checked as an enqueue checks a workflow: the table is anyone's to edit.
    """
    try:
        plan = Plan.of(_canvas(decode_stored(row.canvas), 0), ttl_ms=row.ttl_ms,
                       workflow_id=validate_job_id(row.workflow_id))
    except EchoMQError:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as error:
        raise WorkflowError(f"the row's canvas is not a workflow as enqueue writes it ({error!r})") from None
    if plan.home.name != row.queue:
        raise WorkflowError(f"the row's workflow starts on queue {plan.home.name!r}, not on its queue {row.queue!r}")
    return plan


def _canvas(node: Any, depth: int) -> Any:
    """A canvas (or a member) of core's classes from the row's JSON `node`."""
    if depth > 2 * MAX_DEPTH:
        raise WorkflowError(f"a workflow nests at most {MAX_DEPTH} levels deep")
    if node[0] == "job":
        _, queue, name, data, opts, immutable, allow_failure, *job_id = node  # (a row of 0.x has no job id)
        return Member(get_queue(queue), name, data, JobOptions.from_json(opts), immutable=immutable is True,
                      allow_failure=allow_failure is True, job_id=job_id[0] if job_id else None)
    kind, parts, handler = node
    children = [_canvas(part, depth + 1) for part in parts]
    on_error = None if handler is None else _canvas(handler, depth + 1)
    if kind == "chain":
        return Chain(*children, on_error=on_error)
    if kind == "group" and on_error is None:
        return Group(*children)
    if kind == "chord" and len(children) == 2 and isinstance(children[0], Group):
        return Chord(children[0], children[1], on_error)
    if kind == "linked" and children:
        return Linked(children[0], children[1:], on_error)
    raise WorkflowError(f"not a chain, group, chord or linked node: {kind!r} of {len(children)} part(s)")


_local = threading.local()


def _written(database: str) -> list[tuple[OutboxWorkflow, Plan]]:
    """The rows (and their plans) this thread wrote in its transactions on `database` that no commit sent yet."""
    if not hasattr(_local, "written"):
        _local.written = defaultdict(list)
    return _local.written[database]


def send_written(database: str) -> None:
    """After a commit: add the plans of the rows this thread wrote that the commit kept, and delete the rows."""
    written = _written(database)
    if not written:
        return
    pairs, written[:] = list(written), []
    kept = set(OutboxWorkflow.objects.using(database).filter(pk__in=[row.pk for row, _ in pairs])
               .values_list("pk", flat=True))
    done = [row.pk for row, plan in pairs if row.pk in kept and _added(plan)]
    _record(database, done, {})


def _added(plan: Plan) -> bool:
    """Add `plan`, each call recorded for as long as its row may be sent again; False (logged) if Redis failed."""
    plan.record_ms = get_settings().outbox_max_age_ms + RECORD_MARGIN_MS
    try:
        plan.add()
    except (*UNREACHABLE, RedisError) as error:
        logger.warning("outbox: workflow %s of queue %s not added (%s); the relay adds it later",
                       plan.id, plan.home.name, error)
        return False
    return True


def send(database: str, rows: list[OutboxWorkflow]) -> Sent:
    """Plan each row again and add it; delete the rows added, keep why for those that cannot be (never sent)."""
    done, refused, unsent = [], {}, 0
    for row in rows:
        try:
            plan = plan_of(row)
        except EchoMQError as error:
            refused[row.pk] = str(error)
            continue
        if _added(plan):
            done.append(row.pk)
        else:
            unsent += 1
    _record(database, done, refused)
    return Sent(len(done), len(refused), unsent)


def _record(database: str, done: list[Any], refused: dict[Any, str]) -> None:
    """Delete the rows sent; keep each refused one's error. A database error is logged (the row is sent again)."""
    try:
        with transaction.atomic(using=database):
            if done:
                OutboxWorkflow.objects.using(database).filter(pk__in=done).delete()
            for pk, reason in refused.items():
                OutboxWorkflow.objects.using(database).filter(pk=pk).update(error=reason[:2000])
    except DatabaseError as error:
        logger.warning("outbox: %d sent workflow row(s) not deleted (%s); a later send adds nothing twice",
                       len(done), error)
    for pk, reason in refused.items():
        logger.error("outbox: workflow row %s refused, not sent again: %s", pk, reason)


def relay_batch(*, batch: int = RELAY_BATCH, after_s: float = RELAY_AFTER_S, now: int | None = None,
                using: str | None = None, past: tuple[int, Any] | None = None) -> tuple[Sent, tuple[int, Any] | None]:
    """outbox.relay_batch for workflow rows: (what it did, where the next batch starts, None after the last)."""
    database = using or router.db_for_write(OutboxWorkflow)
    now = now_ms() if now is None else now
    rows = OutboxWorkflow.objects.using(database).filter(
        error="", timestamp_ms__lte=now - after_s * 1000,
        timestamp_ms__gte=now - get_settings().outbox_max_age_ms).order_by("timestamp_ms", "pk")
    if past is not None:
        rows = rows.filter(Q(timestamp_ms__gt=past[0]) | Q(timestamp_ms=past[0], pk__gt=past[1]))
    if connections[database].features.has_select_for_update_skip_locked:
        with transaction.atomic(using=database):  # the rows stay locked until added and deleted
            taken = list(rows.select_for_update(skip_locked=True)[:batch])
            sent = send(database, taken)
    else:
        taken = list(rows[:batch])  # no transaction around Redis's answer: see outbox.relay_batch
        sent = send(database, taken)
    return sent, ((taken[-1].timestamp_ms, taken[-1].pk) if len(taken) == batch else None)
