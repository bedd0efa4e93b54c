"""Signatures: a job with its arguments and options, as a step of a workflow (echomq_django.workflows), or to
apply on its own, Celery's way (`sig.delay()`, `sig.apply_async()`, `sig | other`).

`fn.s(*args, **kwargs)` on an @job function or an EchoMQ task makes one;
`fn.si(...)` makes one that does not receive the previous step's result.
What the target is does the rest: its `workflow_member(signature)` turns the
signature into the core's workflow member, checked (jobs.JobFunction,
backends.EchoMQTask).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from .core import Member, PayloadError, WorkflowError, validate_job_id

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

    def set(self, **options: Any) -> Signature:
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
            from .calling import countdown_ms

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

    def without(self, *names: str) -> Signature:
        """This signature without these options."""
        return dataclasses.replace(self, options={k: v for k, v in self.options.items() if k not in names})

    def partial(self, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None) -> Signature:
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

    # Celery's calling API (calling.py does the work).

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        """Add the job with these arguments before the signature's own: its AsyncResult."""
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> Any:
        """Add the job, with a call's arguments and options (countdown=, eta=, queue=, link=...): its AsyncResult."""
        from .calling import apply_signature, refuse_unknown

        refuse_unknown(options, CALL_OPTIONS, f"{self.name}.apply_async()")
        return apply_signature(self, tuple(args or ()), kwargs, options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here and now, as Celery's `sig()` does: the call's arguments before the signature's."""
        signature = self.partial(args, kwargs)
        function = getattr(self.target, "func", None) or self.target
        return function(*signature.args, **signature.kwargs)

    def link(self, callback: Any) -> Any:
        """Run `callback` with this job's result once it succeeded (Celery's link); returns the callback."""
        self.options["link"] = [*_listed(self.options.get("link")), callback]
        return callback

    def link_error(self, errback: Any) -> Any:
        """Run `errback` once if this job fails for good (Celery's link_error); returns the errback."""
        self.options["link_error"] = [*_listed(self.options.get("link_error")), errback]
        return errback

    def on_error(self, errback: Any) -> Signature:
        """`link_error`, returning this signature (Celery's `sig.on_error`)."""
        self.link_error(errback)
        return self

    def __or__(self, other: Any) -> Any:
        """`sig | other`: a chain of the two (other a signature, a chain, a group or a chord)."""
        from .workflows import chain

        return chain(self) | other


def _listed(value: Any) -> list[Any]:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]
