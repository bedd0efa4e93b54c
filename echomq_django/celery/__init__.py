"""Celery's task and canvas API on echomq: a Celery project moves by changing its imports.

    # from celery import shared_task, chain, group, chord
    from echomq_django.celery import shared_task, chain, group, chord

No Celery is imported or needed. What each name does, and where echomq's
behaviour differs from Celery's, is in docs/migrating-from-celery.md.
"""

from __future__ import annotations

from typing import Any

from . import states
from .canvas import Signature, chain, chord, chunks, group, maybe_signature, signature
from .result import AsyncResult, GroupResult
from .result import AsyncResult as _AsyncResult  # (the names the app's methods of the same names return)
from .result import GroupResult as _GroupResult
from .task import Request, Task, shared_task, task

__all__ = ["AsyncResult", "Celery", "GroupResult", "Request", "Signature", "Task", "chain", "chord", "chunks",
           "current_task", "group", "maybe_signature", "shared_task", "signature", "states", "task"]


class _CurrentTask:
    """`current_task`: the task whose job runs in this thread (its `.request`), as Celery's proxy."""

    def __getattr__(self, name: str) -> Any:
        from ..registry import current_job, registered_jobs

        job = current_job()
        found = registered_jobs().get(job.name) if job is not None else None
        if found is None:
            raise AttributeError(f"no task runs here, so current_task has no {name!r}")
        return getattr(found, name)

    def __bool__(self) -> bool:
        from ..registry import current_job

        return current_job() is not None


current_task = _CurrentTask()


class Celery:
    """What a Celery project's `app = Celery(...)` is used for, on echomq: `@app.task`, `app.AsyncResult`,
    `app.send_task`. Settings come from ECHOMQ (docs/migrating-from-celery.md translates them), and tasks are
    found in every installed app's tasks.py, so `config_from_object` and `autodiscover_tasks` have nothing to do."""

    def __init__(self, main: str | None = None, **options: Any) -> None:
        if options:
            raise TypeError(f"Celery() settings go to ECHOMQ in settings.py, not {', '.join(sorted(options))}=")
        self.main = main

    def task(self, *args: Any, **options: Any) -> Any:
        return shared_task(*args, **options)

    def config_from_object(self, *_: Any, **__: Any) -> None:
        """Nothing: echomq reads ECHOMQ, not CELERY_* settings."""

    def autodiscover_tasks(self, *_: Any, **__: Any) -> None:
        """Nothing: workers, beats and the outbox relay import every installed app's jobs.py and tasks.py."""

    def AsyncResult(self, task_id: str) -> _AsyncResult:  # noqa: N802  (Celery's name)
        return _AsyncResult(task_id)

    def GroupResult(self, *args: Any, **kwargs: Any) -> _GroupResult:  # noqa: N802
        return _GroupResult(*args, **kwargs)

    def signature(self, name: str, args: Any = (), kwargs: Any = None, **options: Any) -> Signature:
        return signature(name, args, kwargs, **options)

    def send_task(self, name: str, args: Any = (), kwargs: Any = None, **options: Any) -> _AsyncResult:
        """Add a job of the task registered as `name` (apply_async's options)."""
        return self.signature(name, args, kwargs).apply_async(**options)
