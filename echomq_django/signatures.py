"""Signatures: a job with its arguments and options, as a step of a workflow (echomq_django.workflows, whose
Signature adds Celery's `sig.delay()`, `sig.apply_async()` and `sig | other` to this one); and how a signature's
Celery links (`link`, `link_error`) become nodes of a workflow (expand_links).

`fn.s(*args, **kwargs)` on an @job function or an EchoMQ task makes one;
`fn.si(...)` makes one that does not receive the previous step's result.
What the target is does the rest: its `workflow_member(signature)` turns the
signature into the core's workflow member, checked (jobs.JobFunction,
backends.EchoMQTask).
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Self

from .core import Canvas, Chain, Chord, Group, Linked, Member, PayloadError, WorkflowError, validate_job_id

# What `.set()` takes: echomq's options of a step, then Celery's options of a call (calling.py).
OPTIONS = ("queue", "priority", "delay_ms", "attempts", "group", "allow_failure")
CALL_OPTIONS = ("countdown", "eta", "expires", "queue", "priority", "task_id", "link", "link_error",
                "time_limit", "soft_time_limit", "headers")


@dataclasses.dataclass(frozen=True)
class Signature:
    """An @job function or an EchoMQ task, with its arguments and options."""

    target: Any
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    immutable: bool = False

    def __post_init__(self) -> None:
        if not callable(getattr(self.target, "workflow_member", None)):
            raise WorkflowError(f"a signature needs an @job function or an EchoMQ task, not {self.target!r}")

    def __repr__(self) -> str:
        arguments = [repr(arg) for arg in self.args] + [f"{key}={value!r}" for key, value in self.kwargs.items()]
        return f"{self.name}{'.si' if self.immutable else '.s'}({', '.join(arguments)})"

    @property
    def name(self) -> str:
        """The job's name (Celery's `sig.task` too)."""
        return str(getattr(self.target, "name", self.target))

    task = name

    @property
    def id(self) -> str | None:
        """The job id given with `task_id=`, if any."""
        return self.options.get("task_id")

    def set(self, **options: Any) -> Self:
        """This signature with other options: queue, priority, delay_ms, attempts, group, allow_failure; and
        Celery's countdown, eta, expires, task_id, link, link_error, time_limit, soft_time_limit, headers,
        immutable."""
        immutable = options.pop("immutable", self.immutable)
        if unknown := set(options) - set(OPTIONS) - set(CALL_OPTIONS):
            raise WorkflowError(f"unknown option(s) {', '.join(sorted(unknown))}; a step takes "
                                f"{', '.join(dict.fromkeys(OPTIONS + CALL_OPTIONS))}, immutable")
        if not isinstance(options.get("allow_failure", False), bool):
            raise WorkflowError(f"allow_failure is True or False, not {options['allow_failure']!r}")
        if not isinstance(options.get("queue", ""), str):
            raise WorkflowError(f"queue is a queue's name, not {options['queue']!r}")
        if "countdown" in options:
            countdown = options.pop("countdown")
            if countdown is not None:
                options["delay_ms"] = countdown_ms(countdown)
        if options.get("eta") is not None and not isinstance(options["eta"], datetime):
            raise PayloadError(f"eta is a datetime, not {options['eta']!r}")
        if options.get("task_id") is not None:
            validate_job_id(options["task_id"])
        if options.get("headers") is not None and not isinstance(options["headers"], Mapping):
            raise PayloadError(f"headers are a dict, not {options['headers']!r}")
        given = {key: value for key, value in options.items() if value is not None}
        return dataclasses.replace(self, options={**self.options, **given}, immutable=bool(immutable))

    def without(self, *names: str) -> Self:
        """This signature without these options."""
        return dataclasses.replace(self, options={k: v for k, v in self.options.items() if k not in names})

    def partial(self, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None) -> Self:
        """This signature with a call's arguments: its args before the signature's own (as Celery's partials),
        its kwargs over the signature's; an immutable signature keeps its own arguments."""
        if self.immutable or (not args and not kwargs):
            return self
        return dataclasses.replace(self, args=(*args, *self.args), kwargs={**self.kwargs, **dict(kwargs or {})})

    clone = partial

    def member(self) -> Member:
        """The job this signature adds, checked now (WorkflowError, PayloadError, ImproperlyConfigured...)."""
        if self.options.get("eta") is not None:
            raise WorkflowError(f"{self!r}: a workflow step cannot take eta= (it starts when its inputs came); "
                                "give countdown= instead")
        member = self.target.workflow_member(self)
        if not isinstance(member, Member):
            raise WorkflowError(f"{self.target!r} did not make a workflow member")
        return member

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here and now, as Celery's `sig()` does: the call's arguments before the signature's."""
        signature = self.partial(args, kwargs)
        if not callable(self.target):
            raise WorkflowError(f"{self.name} cannot be called here: apply it (.delay())")
        return self.target(*signature.args, **signature.kwargs)

    def link(self, callback: Any) -> Any:
        """Run `callback` with this job's result once it succeeded (Celery's link); returns the callback."""
        self.options["link"] = [*_listed(self.options.get("link")), callback]
        return callback

    def link_error(self, errback: Any) -> Any:
        """Run `errback` once if this job fails for good (Celery's link_error); returns the errback."""
        self.options["link_error"] = [*_listed(self.options.get("link_error")), errback]
        return errback

    def on_error(self, errback: Any) -> Self:
        """`link_error`, returning this signature (Celery's `sig.on_error`)."""
        self.link_error(errback)
        return self


def _listed(value: Any) -> list[Any]:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


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


def handler_of(node: Any) -> Any:
    """A chain's or chord's error handler (workflows.py keeps it as `error_handler` on its own classes)."""
    return getattr(node, "error_handler", None) if hasattr(node, "error_handler") else node.on_error


# A header of the jobs of an immutable error callback of a Celery task, made mutable in the plan so that its job
# still hears which job failed, and why (celery/task.py then calls it with its own arguments alone).
IMMUTABLE_ERRBACK = "echomq-immutable-errback"
# A header of the jobs of a Celery task's error callback linked to one signature: that signature's job id. Its
# workflow fails a job that never ran when a job before it failed; the callback then hears of that job, not of
# the one it watches, and, as Celery never sent the one it watches, it is not called.
ERRBACK_OF = "echomq-errback-of"


def expand_links(node: Any) -> Any:
    """`node` with every signature's `link` and `link_error` (and a canvas's) made core workflow nodes: a
    signature with callbacks becomes a Linked node, and each error callback its on_error."""
    return _mark_errbacks(_expand(node))


def linked(node: Any, links: list[Any], errbacks: list[Any]) -> Any:
    """`node` with these callbacks beside it and these error callbacks, as Linked nodes (one per error callback:
    a Linked node has one); `node` itself when there are none."""
    if not links and not errbacks:
        return node
    node = Linked(node, links, errbacks[0] if errbacks else None)
    for errback in errbacks[1:]:
        node = Linked(node, (), errback)
    return node


def _hears_failures(errback: Any) -> bool:
    """Whether an error callback is a Celery task's, which is told of failures by headers (celery/task.py)."""
    return isinstance(errback, Signature) and getattr(errback.target, "hears_failures", False) is True


def _with_header(signature: Signature, key: str, value: Any) -> Signature:
    return signature.set(headers={**(signature.options.get("headers") or {}), key: value})


def _mark_errbacks(node: Any) -> Any:
    """Each error handler of a Celery task that is immutable, made mutable with the IMMUTABLE_ERRBACK header:
    the task must know whether the failed job ran at all (a job failed before it ran calls no error callback)."""
    if not isinstance(node, Canvas):
        return node
    handler = node.on_error
    if _hears_failures(handler) and handler.immutable:
        # (made mutable in the plan only: the task is then called with its own arguments alone)
        handler = _with_header(dataclasses.replace(handler, immutable=False), IMMUTABLE_ERRBACK, True)
    if isinstance(node, Group):
        return Group(*[_mark_errbacks(member) for member in node.members])
    if isinstance(node, Chord):
        return Chord(_mark_errbacks(node.header), _mark_errbacks(node.body), handler)
    if isinstance(node, Chain):
        return Chain(*[_mark_errbacks(step) for step in node.steps], on_error=handler)
    if isinstance(node, Linked):
        return Linked(_mark_errbacks(node.body), [_mark_errbacks(c) for c in node.callbacks], handler)
    return node


def _expand(node: Any) -> Any:
    if isinstance(node, Signature):
        links = callbacks_of(node.options.get("link"), "link")
        errbacks = callbacks_of(node.options.get("link_error"), "link_error")
        if not links and not errbacks:
            return node
        bare, errbacks = _watched(node.without("link", "link_error"), errbacks)
        return linked(bare, [_expand(link) for link in links], errbacks)
    if not isinstance(node, Canvas):
        return node
    links, errbacks = getattr(node, "links", []), getattr(node, "errbacks", [])
    if isinstance(node, Group):
        members = [_expand(member) for member in node.members]
        if errbacks:  # as Celery: each member gets the group's error callbacks
            members = [_with_errbacks(member, errbacks) for member in members]
        result: Any = Group(*members)
        errbacks = []
    elif isinstance(node, Chord):
        body = node.body
        if isinstance(body, Signature) and body.options.get("link_error"):
            # A chord body's error callbacks are the chord's, as in Celery: they run when the header fails too.
            errbacks = [*callbacks_of(body.options["link_error"], "link_error"), *errbacks]
            body = body.without("link_error")
        result = Chord(_expand(node.header), _expand(body), handler_of(node))
    elif isinstance(node, Chain):
        result = Chain(*[_expand(step) for step in node.steps], on_error=handler_of(node))
    elif isinstance(node, Linked):
        result = Linked(_expand(node.body), [_expand(c) for c in node.callbacks], node.on_error)
    else:
        raise WorkflowError(f"not a canvas echomq knows: {node!r}")
    # A canvas's own callbacks get its result; its error callbacks run once.
    return linked(result, [_expand(link) for link in links], errbacks)


def _watched(signature: Signature, errbacks: list[Any]) -> tuple[Signature, list[Any]]:
    """A signature with a job id of its own, and its Celery error callbacks told it (ERRBACK_OF)."""
    if not any(_hears_failures(errback) for errback in errbacks):
        return signature, errbacks
    job_id = signature.options.get("task_id") or str(uuid.uuid4())
    return signature.set(task_id=job_id), [
        _with_header(errback, ERRBACK_OF, job_id) if _hears_failures(errback) else errback for errback in errbacks]


def _with_errbacks(member: Any, errbacks: list[Any]) -> Any:
    """A group's member with the group's error callbacks (each member its own copy, as Celery clones them)."""
    if isinstance(member, Signature):
        member, errbacks = _watched(member, errbacks)
    return linked(member, [], errbacks)


def callbacks_of(value: Any, what: str) -> list[Any]:
    """A link option's callbacks: one signature or a list of them."""
    if value is None:
        return []
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for item in items:
        if not callable(getattr(item, "member", None)) and not hasattr(item, "parts"):
            raise WorkflowError(f"{what} takes signatures (fn.s(...)), not {item!r}")
    return items
