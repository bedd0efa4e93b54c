"""Workflows for Django: chains, groups and chords of @job functions and EchoMQ tasks.

    from echomq_django.workflows import chain, chord, group

    chain(fetch.s(url), parse.s(), store.s()).enqueue()        # parse(fetch's result), then store(parse's)
    group(resize.s(photo_id, size) for size in SIZES).enqueue()  # at once; the result: their results, in order
    chord([count.s(shard) for shard in range(10)], total.s()).enqueue()   # total([10 counts]), once

`fn.s(*args, **kwargs)` is a signature: the job and its arguments; the
previous step's result comes first (`fn.si(...)`: it does not).
`.set(queue=..., priority=..., delay_ms=..., attempts=..., group=...,
allow_failure=True)` overrides its options. `.enqueue()` adds the whole
workflow (one atomic call per queue involved) and returns a
`WorkflowResult`: `.id`, `.status`, `.results()`, `.wait(timeout)`,
`.cancel()`. The hand-offs between steps happen inside Redis, in the
script that ends each member (core/producing/workflow.py, docs/workflows.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from django.db import router

from .conf import get_settings
from .core import Chain, Chord, Group, Plan, WorkflowError, WorkflowHandle
from .jobs import registered_jobs
from .outbox import OutboxWorkflow
from .outbox import workflows as outbox_workflows
from .signatures import Signature

__all__ = ["Signature", "WorkflowError", "WorkflowResult", "chain", "chord", "group", "signature"]


def signature(target: Any, *args: Any, **kwargs: Any) -> Signature:
    """A signature of `target`: an @job function, an EchoMQ task, or the name of a registered @job.

    WorkflowError for a name no @job is registered under.
    """
    if isinstance(target, str):
        if (found := registered_jobs().get(target)) is None:
            raise WorkflowError(f"no job function named {target!r} is registered (is the module with its @job "
                                "imported?)")
        target = found
    return Signature(target, args, kwargs)


class WorkflowResult(WorkflowHandle):
    """A workflow that was enqueued: `.id`, `.status`, `.results()`, `.wait(timeout)`, `await .await_results()`,
    `.cancel()`."""


class _Enqueue:
    """enqueue() and aenqueue() of chain, group and chord in Django: through the outbox, with WORKFLOW_TTL."""

    def enqueue(self, *, ttl_ms: int | None = None) -> WorkflowResult:
        """Add the whole workflow now, or, inside a transaction with the outbox on for its first job's queue, write
        it as an outbox row of the transaction, added after the commit (outbox/workflows.py).

        Everything is checked before anything is sent or written (a signature
        of an unknown job, arguments that are not JSON, an empty group, too
        deep, too large for a row); the result's id is the workflow's either way.
        """
        plan = Plan.of(self, ttl_ms=get_settings().workflow_ttl_ms if ttl_ms is None else ttl_ms)
        database = router.db_for_write(OutboxWorkflow)
        if outbox_workflows.uses_outbox(plan, database):
            outbox_workflows.write(plan, database)
        else:
            plan.add()
        return WorkflowResult(plan.home, plan.id)

    async def aenqueue(self, *, ttl_ms: int | None = None) -> WorkflowResult:
        """`enqueue` for asyncio code, on a thread of its own."""
        return await asyncio.to_thread(self.enqueue, ttl_ms=ttl_ms)


class _Chain(_Enqueue, Chain):
    pass


class _Group(_Enqueue, Group):
    pass


class _Chord(_Enqueue, Chord):
    pass


def chain(*steps: Any, on_error: Signature | None = None) -> Chain:
    """Steps one after the other, each given the previous one's result first; `on_error` runs once on a failure."""
    return _Chain(*steps, on_error=on_error)


def group(*members: Any) -> Group:
    """Members that run at once; the group's result is the list of theirs, in the order given."""
    return _Group(*members)


def chord(header: Group | Iterable[Any], body: Any, *, on_error: Signature | None = None) -> Chord:
    """`header` (a group, or its members), then `body` once, with the list of their results first."""
    if not isinstance(header, Group):
        header = _Group(*header)
    return _Chord(header, body, on_error)
