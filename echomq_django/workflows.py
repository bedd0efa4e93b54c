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
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.db import router

from . import outbox, signatures
from .conf import get_settings
from .core import Canvas, Chain, Chord, Group, Linked, NewJob, Plan, WorkflowError, WorkflowHandle
from .outbox import OutboxWorkflow
from .outbox import workflows as outbox_workflows
from .registry import registered_jobs
from .signatures import CALL_OPTIONS, callbacks_of, expand_links, handler_of, linked, refuse_unknown

if TYPE_CHECKING:
    from .celery.result import AsyncResult

__all__ = ["Signature", "WorkflowError", "WorkflowResult", "chain", "chord", "group", "signature"]


class Signature(signatures.Signature):
    """A signature (signatures.py) with Celery's calling API: `.delay()`, `.apply_async()`, `sig | other`."""

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        """Add the job with these arguments before the signature's own: its AsyncResult."""
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> Any:
        """Add the job, with a call's arguments and options (countdown=, eta=, queue=, link=...): its AsyncResult."""
        refuse_unknown(options, CALL_OPTIONS, f"{self.name}.apply_async()")
        return apply_signature(self, tuple(args or ()), kwargs, options)

    def __or__(self, other: Any) -> Any:
        """`sig | other`: a chain of the two (other a signature, a chain, a group or a chord)."""
        return chain(self) | other


def apply_signature(signature: Signature, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None,
                    options: Mapping[str, Any] | None = None) -> AsyncResult:
    """Add a signature's job (Signature.apply_async): the call's arguments before its own, the call's options over
    its own. With `link` or `link_error`, the job and its callbacks are one workflow."""
    from .celery.result import AsyncResult, result_of

    signature = signature.partial(tuple(args), dict(kwargs or {})).set(**dict(options or {}))
    opts = signature.options
    if opts.get("link") or opts.get("link_error"):
        return result_of(enqueue_plan(signature))
    target = signature.target
    if not hasattr(target, "enqueue_with"):  # a map: one job, as a workflow member is made
        member = signature.member()
        job_id = outbox.enqueue(member.queue, NewJob(member.name, member.data, member.opts, member.job_id))
        return AsyncResult(job_id, member.queue)
    handle = target.enqueue_with(  # (set() checked the options: eta a datetime, task_id an id...)
        args=signature.args, kwargs=signature.kwargs, delay_ms=opts.get("delay_ms", 0), eta=opts.get("eta"),
        job_id=opts.get("task_id"),
        priority=opts.get("priority"), expires=opts.get("expires"), queue=opts.get("queue"),
        time_limit=opts.get("time_limit"), soft_time_limit=opts.get("soft_time_limit"), headers=opts.get("headers"),
        group=opts.get("group"))
    return AsyncResult(handle.id, handle.queue)


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


def enqueue_plan(node: Any, *, ttl_ms: int | None = None) -> Plan:
    """Plan `node` (its Celery links made steps) and add it now, or, inside a transaction with the outbox on for its
    first job's queue, write it as an outbox row of the transaction, added after the commit (outbox/workflows.py).

    Everything is checked before anything is sent or written (a signature
    of an unknown job, arguments that are not JSON, an empty group, too
    deep, too large for a row).
    """
    plan = Plan.of(expand_links(node), ttl_ms=get_settings().workflow_ttl_ms if ttl_ms is None else ttl_ms)
    database = router.db_for_write(OutboxWorkflow)
    if outbox_workflows.uses_outbox(plan, database):
        outbox_workflows.write(plan, database)
    else:
        plan.add()
    return plan


class _Enqueue:
    """enqueue() and aenqueue() of chain, group and chord in Django: through the outbox, with WORKFLOW_TTL; and
    Celery's calling API (`delay`, `apply_async`, `|`, `link`, `link_error`)."""

    kind = ""  # (core's Canvas gives each its own)

    def enqueue(self, *, ttl_ms: int | None = None) -> WorkflowResult:
        """Add the whole workflow (enqueue_plan); the result's id is the workflow's."""
        plan = enqueue_plan(self, ttl_ms=ttl_ms)
        return WorkflowResult(plan.home, plan.id)

    async def aenqueue(self, *, ttl_ms: int | None = None) -> WorkflowResult:
        """`enqueue` for asyncio code, on a thread of its own."""
        return await asyncio.to_thread(self.enqueue, ttl_ms=ttl_ms)

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        """Add the workflow, these arguments given to its first steps (Celery's partial call): its results."""
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> Any:
        """Add the workflow, `args` and `kwargs` given to its first steps: a chain's first, a group's and a
        chord's header's every member. Options: link=, link_error= (the whole's), queue= and priority= (of the
        steps without their own). Celery's results: a chain's or chord's last AsyncResult, a group's GroupResult."""
        from .celery.result import result_of

        refuse_unknown(options, ("link", "link_error", "queue", "priority"), f"{self.kind}.apply_async()")
        node = linked(self, callbacks_of(options.get("link"), "link"),
                      callbacks_of(options.get("link_error"), "link_error"))
        node = with_call(expand_links(node), tuple(args or ()), dict(kwargs or {}),
                         {key: options[key] for key in ("queue", "priority") if options.get(key) is not None})
        return result_of(enqueue_plan(node))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`apply_async` with these arguments, as Celery's `canvas(...)` is."""
        return self.apply_async(args, kwargs)

    def link(self, callback: Any) -> Any:
        """Run `callback` with the workflow's result once it succeeded; returns the callback."""
        object.__setattr__(self, "links", [*getattr(self, "links", []), callback])
        return callback

    def link_error(self, errback: Any) -> Any:
        """Run `errback` once if the workflow fails (a group: for each member that fails); returns the errback."""
        object.__setattr__(self, "errbacks", [*getattr(self, "errbacks", []), errback])
        return errback

    def __or__(self, other: Any) -> Any:
        """`a | b`: a chain; a group followed by a step is a chord, as Celery upgrades it."""
        if isinstance(self, Group) and not isinstance(other, Group):
            return chord(self, other)
        steps = self.steps if isinstance(self, Chain) and handler_of(self) is None and not _has_links(self) \
            else (self,)
        more = other.steps if isinstance(other, Chain) and handler_of(other) is None and not _has_links(other) \
            else (other,)
        return chain(*steps, *more)


def _has_links(node: Any) -> bool:
    return bool(getattr(node, "links", None) or getattr(node, "errbacks", None))


def with_call(node: Any, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]) -> Any:
    """`node` with a call's arguments given to its first steps, and its options to every step without its own."""
    if isinstance(node, Signature):
        node = node.partial(args, kwargs)
        extra = {key: value for key, value in options.items() if key not in node.options}
        return node.set(**extra) if extra else node
    if isinstance(node, Chain):
        steps = [with_call(step, args, kwargs, options) if index == 0 else with_call(step, (), {}, options)
                 for index, step in enumerate(node.steps)]
        return Chain(*steps, on_error=node.on_error)
    if isinstance(node, Group):
        return Group(*[with_call(member, args, kwargs, options) for member in node.members])
    if isinstance(node, Chord):
        return Chord(with_call(node.header, args, kwargs, options), with_call(node.body, (), {}, options),
                     node.on_error)
    if isinstance(node, Linked):
        return Linked(with_call(node.body, args, kwargs, options),
                      [with_call(callback, (), {}, options) for callback in node.callbacks], node.on_error)
    return node


class _Handled:
    """A chain's or chord's `on_error`: core reads its error handler there, and Celery's code calls it to add one
    (`chain(...).on_error(errback)`). Read here, it is that call; the handler itself is `error_handler`."""

    @property
    def on_error(self) -> Any:
        return self.link_error_returning_self

    @on_error.setter
    def on_error(self, handler: Any) -> None:
        object.__setattr__(self, "error_handler", handler)

    def link_error_returning_self(self, errback: Any) -> Any:
        self.link_error(errback)  # type: ignore[attr-defined]
        return self


class _Chain(_Handled, _Enqueue, Chain):
    pass


class _Group(_Enqueue, Group):
    pass


class _Chord(_Handled, _Enqueue, Chord):
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
        # One signature or canvas alone is a header of one, as Celery takes it.
        header = _Group(header) if isinstance(header, (Signature, Canvas)) else _Group(*header)
    return _Chord(header, body, on_error)
