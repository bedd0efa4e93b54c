"""Celery's calling API on every @job function and EchoMQ task: `delay`, `apply_async`, `signature`, `map`,
`starmap` and `chunks`, on echomq's own enqueue and workflows.

    send_receipt.delay(order.pk)                                      # -> AsyncResult
    send_receipt.apply_async((order.pk,), countdown=60, queue="mail")
    charge.apply_async((order.pk,), link=ship.s(), link_error=refund.si(order.pk))
    add.chunks(zip(range(100), range(100)), 10).delay()              # 10 jobs of 10 calls each

A call with `link` or `link_error` is a small workflow (docs/workflows.md):
the callbacks are made ready by the script that ends the job, once. The
options a call can take are signatures.CALL_OPTIONS; any other is refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .core import Job, Member, PayloadError, UnrecoverableError, WorkflowError
from .signatures import CALL_OPTIONS, Signature

if TYPE_CHECKING:
    from .celery.result import AsyncResult, GroupResult

# The name of the job that runs a function over many argument lists (map, starmap, chunks).
MAP_JOB = "echomq.map"
# Celery's options that echomq does not take, and why: refused by name.
REFUSED = {
    "serializer": "echomq stores JSON only (never pickle)",
    "compression": "echomq stores JSON as it is",
    "exchange": "echomq routes by queue alone",
    "routing_key": "echomq routes by queue alone: give queue=",
    "shadow": "a job is shown under its function's name",
    "retry": "an enqueue is retried within ENQUEUE_TIMEOUT, then raises",
    "retry_policy": "an enqueue is retried within ENQUEUE_TIMEOUT, then raises",
    "chord": "give a chord with echomq_django.celery.chord",
    "add_to_parent": "a job started from another job has no parent result to join",
    "ignore_result": "give ignore_result on the task",
    "reply_to": "results are kept in Redis with the job",
    "connection": "echomq's connection is ECHOMQ['REDIS_URL']",
    "producer": "echomq's connection is ECHOMQ['REDIS_URL']",
}


def refuse_unknown(options: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """PayloadError naming the first option of `options` not in `allowed` (with why, for Celery's own)."""
    allowed = set(allowed)
    for name in options:
        if name not in allowed:
            why = REFUSED.get(name, f"it is not an option echomq knows; it takes {', '.join(sorted(allowed))}")
            raise PayloadError(f"{where} cannot take {name}=: {why}")


def countdown_ms(countdown: Any) -> int:
    """A countdown in seconds (Celery's) as a delay in ms (PayloadError for a negative or non-number)."""
    if isinstance(countdown, bool) or not isinstance(countdown, (int, float)) or not countdown >= 0 \
            or math.isinf(countdown):
        raise PayloadError(f"countdown is a number of seconds from 0, not {countdown!r}")
    return math.ceil(countdown * 1000)


class CeleryCalls:
    """Celery's calling API: the methods every @job function (jobs.JobFunction) has besides `enqueue`."""

    name: str

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Add a job with these arguments (Celery's spelling of `enqueue`); its AsyncResult."""
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> AsyncResult:
        """Add a job with Celery's options: countdown=, eta=, expires=, queue=, priority=, task_id=, link=,
        link_error=, time_limit=, soft_time_limit=, headers=. Its AsyncResult (a JobHandle)."""
        refuse_unknown(options, CALL_OPTIONS, f"{self.name}.apply_async()")
        return self.signature(args, kwargs, **options).apply_async()

    def signature(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                  **options: Any) -> Signature:
        """A signature of this function with these arguments and Celery's options (Celery's `task.signature`)."""
        if isinstance(args, (str, bytes)) or (args is not None and not isinstance(args, Iterable)):
            raise PayloadError(f"args is a list or tuple of arguments, not {args!r}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise PayloadError(f"kwargs is a dict of keyword arguments, not {kwargs!r}")
        immutable = bool(options.pop("immutable", False))
        signature = Signature(self, tuple(args or ()), dict(kwargs or {}), immutable=immutable)
        return signature.set(**options) if options else signature

    def map(self, items: Iterable[Any]) -> Signature:
        """One job that calls this function with each item as its argument; its result is the list of theirs."""
        return Signature(MapTarget(self, star=False), (_items(items),))

    def starmap(self, items: Iterable[Iterable[Any]]) -> Signature:
        """One job that calls this function with each item's arguments (`fn(*item)`); the list of their results."""
        return Signature(MapTarget(self, star=True), (_items(items),))

    def chunks(self, items: Iterable[Iterable[Any]], n: int) -> Chunks:
        """The items in jobs of `n` calls each (`starmap` over each chunk): `.delay()`, or `.group()` to compose."""
        return Chunks(self, _items(items), n)


def _items(items: Iterable[Any]) -> list[Any]:
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise PayloadError(f"map, starmap and chunks take an iterable of items, not {items!r}")
    return [list(item) if isinstance(item, tuple) else item for item in items]


class MapTarget:
    """The target of a map or starmap signature: the MAP_JOB job on the function's queue."""

    def __init__(self, function: Any, *, star: bool) -> None:
        self.function, self.star = function, star
        self.name = f"{'starmap' if star else 'map'}({function.name})"

    def __repr__(self) -> str:
        return self.name

    def workflow_member(self, signature: Signature) -> Member:
        """The function's member, renamed MAP_JOB, with [its name, the items, star] as arguments."""
        inner = self.function.workflow_member(Signature(self.function, (), {}, signature.options,
                                                        immutable=signature.immutable))
        items = signature.args[-1] if signature.args else []
        # Immutable: a map in a workflow takes no previous result (its items are its arguments).
        return Member(inner.queue, MAP_JOB, {"args": [self.function.name, items, self.star], "kwargs": {}},
                      inner.opts, immutable=True, allow_failure=inner.allow_failure, job_id=inner.job_id)


def run_map(job_record: Job, functions: Mapping[str, Any]) -> list[Any]:
    """Run a MAP_JOB job: its function over its items, in order; the list of the results."""
    data = job_record.data if isinstance(job_record.data, dict) else {}
    arguments = data.get("args", [])
    if not isinstance(arguments, list) or len(arguments) != 3 or not isinstance(arguments[1], list):
        raise UnrecoverableError(f"job {job_record.id} is a map whose arguments are not [name, items, star]")
    name, items, star = arguments
    function = functions.get(name)
    if function is None:
        raise UnrecoverableError(f"no job function named {name!r} is registered in this worker")
    if star:
        for item in items:
            if not isinstance(item, list):
                raise UnrecoverableError(f"job {job_record.id} is a starmap with an item that is not a list: "
                                         f"{item!r}")
        return [function(*item) for item in items]
    return [function(item) for item in items]


class Chunks:
    """`fn.chunks(items, n)`: the items in jobs of `n` calls each, a group of starmaps."""

    def __init__(self, function: Any, items: list[Any], n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise PayloadError(f"chunks takes a chunk size from 1, not {n!r}")
        self.function, self.items, self.n = function, items, n

    def group(self) -> Any:
        """The group of starmap jobs, one per chunk (a workflow group, to compose or `.delay()`)."""
        from .workflows import group

        return group([self.function.starmap(self.items[start:start + self.n])
                      for start in range(0, len(self.items), self.n)])

    def delay(self) -> GroupResult:
        return self.apply_async()

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> GroupResult:
        """Add the chunks' jobs: a GroupResult whose `.get()` is the list of each chunk's list of results."""
        if args or kwargs:
            raise PayloadError("chunks take their items when made, not when applied")
        return self.group().apply_async(**options)


def apply_signature(signature: Signature, args: Iterable[Any] = (), kwargs: Mapping[str, Any] | None = None,
                    options: Mapping[str, Any] | None = None) -> AsyncResult:
    """Add a signature's job (Signature.apply_async): the call's arguments before its own, the call's options over
    its own. With `link` or `link_error`, the job and its callbacks are one workflow."""
    from .celery.result import AsyncResult, result_of

    signature = signature.partial(tuple(args), dict(kwargs or {})).set(**dict(options or {}))
    opts = signature.options
    if opts.get("link") or opts.get("link_error"):
        return result_of(_enqueue_canvas(signature))
    target = signature.target
    if not hasattr(target, "enqueue_with"):  # a map: one job, as a workflow member is made
        member = signature.member()
        from . import outbox
        from .core import NewJob

        job_id = outbox.enqueue(member.queue, NewJob(member.name, member.data, member.opts, member.job_id))
        return AsyncResult(job_id, member.queue)
    delay_ms = opts.get("delay_ms", 0)
    eta = opts.get("eta")
    if eta is not None and not isinstance(eta, datetime):
        raise PayloadError(f"eta is a datetime, not {eta!r}")
    handle = target.enqueue_with(
        args=signature.args, kwargs=signature.kwargs, delay_ms=delay_ms, eta=eta, job_id=opts.get("task_id"),
        priority=opts.get("priority"), expires=opts.get("expires"), queue=opts.get("queue"),
        time_limit=opts.get("time_limit"), soft_time_limit=opts.get("soft_time_limit"), headers=opts.get("headers"),
        group=opts.get("group"))
    return AsyncResult(handle.id, handle.queue)


def _enqueue_canvas(node: Any) -> Any:
    """Plan and add a canvas (its links made workflow steps); the Plan, to build its results from."""
    from .workflows import enqueue_plan

    return enqueue_plan(node)


def handler_of(node: Any) -> Any:
    """A chain's or chord's error handler (workflows.py keeps it as `error_handler` on its own classes)."""
    return getattr(node, "error_handler", None) if hasattr(node, "error_handler") else node.on_error


def expand_links(node: Any) -> Any:
    """`node` with every signature's `link` and `link_error` (and a canvas's) made core workflow nodes: a
    signature with callbacks becomes a Linked node, and each error callback its on_error."""
    from .core import Canvas, Chain, Chord, Group, Linked

    if isinstance(node, Signature):
        links = _signatures(node.options.get("link"), "link")
        errbacks = _signatures(node.options.get("link_error"), "link_error")
        if not links and not errbacks:
            return node
        bare = node.without("link", "link_error")
        wrapped: Any = Linked(bare, [expand_links(link) for link in links], errbacks[0] if errbacks else None)
        for errback in errbacks[1:]:
            wrapped = Linked(wrapped, (), errback)
        return wrapped
    if not isinstance(node, Canvas):
        return node
    links, errbacks = getattr(node, "links", []), getattr(node, "errbacks", [])
    if isinstance(node, Group):
        members = [expand_links(member) for member in node.members]
        if errbacks:  # as Celery: each member gets the group's error callbacks
            members = [_with_errbacks(member, errbacks) for member in members]
        result: Any = Group(*members)
        errbacks = []
    elif isinstance(node, Chord):
        result = Chord(expand_links(node.header), expand_links(node.body), handler_of(node))
    elif isinstance(node, Chain):
        result = Chain(*[expand_links(step) for step in node.steps], on_error=handler_of(node))
    elif isinstance(node, Linked):
        result = Linked(expand_links(node.body), [expand_links(c) for c in node.callbacks], node.on_error)
    else:
        raise WorkflowError(f"not a canvas echomq knows: {node!r}")
    if links or errbacks:  # a canvas's own: its callbacks get its result; an error callback runs once
        result = Linked(result, [expand_links(link) for link in links], errbacks[0] if errbacks else None)
        for errback in errbacks[1:]:
            result = Linked(result, (), errback)
    return result


def _with_errbacks(member: Any, errbacks: list[Any]) -> Any:
    from .core import Linked

    for errback in errbacks:  # (each member's own copy: Celery clones it per member)
        member = Linked(member, (), errback)
    return member


def _signatures(value: Any, what: str) -> list[Any]:
    """A link option's callbacks: one signature or a list of them."""
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if not callable(getattr(item, "member", None)) and not hasattr(item, "parts"):
            raise WorkflowError(f"{what} takes signatures (fn.s(...)), not {item!r}")
    return items
