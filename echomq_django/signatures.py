"""Signatures: a job with its arguments and options, as a step of a workflow (echomq_django.workflows).

`fn.s(*args, **kwargs)` on an @job function or an EchoMQ task makes one;
`fn.si(...)` makes one that does not receive the previous step's result.
What the target is does the rest: its `workflow_member(signature)` turns the
signature into the core's workflow member, checked (jobs.JobFunction,
backends.EchoMQTask).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .core import Member, WorkflowError

# What `.set()` takes: the options a step can have of its own.
OPTIONS = ("queue", "priority", "delay_ms", "attempts", "group", "allow_failure")


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

    def set(self, **options: Any) -> Signature:
        """This signature with other options: queue, priority, delay_ms, attempts, group, allow_failure."""
        if unknown := set(options) - set(OPTIONS):
            raise WorkflowError(f"unknown option(s) {', '.join(sorted(unknown))}; a step takes {', '.join(OPTIONS)}")
        if not isinstance(options.get("allow_failure", False), bool):
            raise WorkflowError(f"allow_failure is True or False, not {options['allow_failure']!r}")
        if not isinstance(options.get("queue", ""), str):
            raise WorkflowError(f"queue is a queue's name, not {options['queue']!r}")
        return dataclasses.replace(self, options={**self.options, **options})

    def member(self) -> Member:
        """The job this signature adds, checked now (WorkflowError, PayloadError, ImproperlyConfigured...)."""
        member = self.target.workflow_member(self)
        if not isinstance(member, Member):
            raise WorkflowError(f"{self.target!r} did not make a workflow member")
        return member
