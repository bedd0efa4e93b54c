"""The registry of job functions by name, and the job this thread runs: what jobs.py, the workflows and Celery's
results share, kept below them all (jobs.py re-exports the public names).

Tests swap the registry with `monkeypatch.setattr(registry, "_registry", {...})`: it is read through this module.
"""

from __future__ import annotations

import contextvars
from typing import Any

from .core import Job

_registry: dict[str, Any] = {}  # name -> jobs.JobFunction
running: contextvars.ContextVar[Job | None] = contextvars.ContextVar("echomq_current_job", default=None)


def registry_now() -> dict[str, Any]:
    """The registry itself (not a copy): the worker's look-ups."""
    return _registry


def registered_jobs() -> dict[str, Any]:
    """Every registered job function by name."""
    return dict(_registry)


def register_function(registered: Any) -> Any:
    """Register a job function under its name (ValueError when another function has the name)."""
    if registered.name in _registry and _registry[registered.name].func is not registered.func:
        raise ValueError(f"two job functions are registered as {registered.name!r}; give one a name=")
    _registry[registered.name] = registered
    return registered


def current_job() -> Job | None:
    """The job this thread is running, inside a job function; else None.

    It is also where a running job is stopped: it raises what the worker set on
    the job (Job.check): JobCancelled at every call once the job was cancelled
    (Queue.cancel), SoftTimeLimitExceeded once past its soft time limit,
    TimeLimitExceeded past its hard limit. On the threads pool this is the only way a job learns of
    these (a thread cannot be interrupted), so a long job should call it now and
    then; a job may catch SoftTimeLimitExceeded to clean up, while a cancelled
    attempt fails whatever the job does.
    """
    job = running.get()
    if job is not None:
        job.check()
    return job
