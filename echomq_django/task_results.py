"""A task's job read back: the Task it was enqueued as, and its TaskResult as Redis has it now.

The backend's get_result and the worker's run of a task job (backends.py)
both start here. The worker imports a task only from inside an installed app
(`load_task`), and the job's data rebuilds the Task as it was enqueued: its
priority, queue, run_after and backend.
"""

from __future__ import annotations

import traceback
from datetime import datetime

from django.apps import apps
from django.conf import settings
from django.utils import timezone as django_timezone
from django.utils.module_loading import import_string

from .core import Job, JobCancelled, UnrecoverableError, class_path, datetime_from_ms
from .tasks_compat import InvalidTask, InvalidTaskBackend, Task, TaskError, TaskResult, TaskResultStatus


def load_task(path: str) -> Task:
    """The Task object at `path`, which must be inside an installed app; else UnrecoverableError."""
    if apps.get_containing_app_config(path) is None:
        raise UnrecoverableError(f"{path!r} is not inside an installed app, so it is not imported")
    try:
        found = import_string(path)
    except ImportError as error:  # chained, so the trace shows why (a missing module, a broken import)
        raise UnrecoverableError(f"cannot import task {path!r}: {type(error).__name__}: {error}") from error
    if not isinstance(found, Task):
        raise UnrecoverableError(f"{path!r} is not a Django Task (decorate it with @task)")
    return found


def stored_task(job: Job) -> Task:
    """The Task of a task job as it was enqueued: its priority, queue, run_after and backend.

    UnrecoverableError when it cannot be loaded or rebuilt.
    """
    spec = job.data["task"]
    task = load_task(job.name)
    try:
        run_after = spec.get("run_after")
        return task.using(priority=spec.get("priority"), queue_name=job.queue, backend=spec.get("backend"),
                          run_after=datetime.fromisoformat(run_after) if run_after else None)
    except (InvalidTask, InvalidTaskBackend, TypeError, ValueError) as error:
        raise UnrecoverableError(f"task {job.name!r} of job {job.id} cannot be rebuilt: {error}") from error


def task_result_of(job: Job, task: Task, status: TaskResultStatus) -> TaskResult:
    """A TaskResult of `task` (as stored_task rebuilt it) from its job's hash."""
    traces = job.stacktrace[-len(job.error_classes):] if job.error_classes else []
    result = TaskResult(
        task=task, id=job.id, status=status, enqueued_at=task_datetime(job.timestamp),
        started_at=task_datetime(job.started_on), last_attempted_at=task_datetime(job.processed_on),
        finished_at=(task_datetime(job.finished_on)
                     if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None),
        args=job.data.get("args", []), kwargs=job.data.get("kwargs", {}), backend=task.backend,
        errors=[TaskError(exception_class_path=path, traceback=trace)
                for path, trace in zip(job.error_classes, traces)],
        worker_ids=list(job.worker_ids),
    )
    if status == TaskResultStatus.FAILED and job.cancel_reason is not None:
        cancelled = cancel_error(job)
        last = result.errors[-1] if result.errors else None
        if last is None or last.exception_class_path != cancelled.exception_class_path:
            result.errors.append(cancelled)  # cancelled before it ran, or its attempt ended otherwise
        elif job.cancel_reason not in last.traceback:
            result.errors[-1] = cancelled  # the attempt the worker stopped (a killed child has no traceback)
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.returnvalue)
    return result


def cancel_error(job: Job) -> TaskError:
    """The error of a cancelled task's result: a JobCancelled that gives the reason (Queue.cancel)."""
    error = JobCancelled(job.cancel_reason)
    return TaskError(exception_class_path=class_path(error),
                     traceback="".join(traceback.format_exception_only(error)))


def task_datetime(ms: int | None) -> datetime | None:
    """A result's time from a protocol timestamp (ms): aware UTC, or with USE_TZ = False naive in TIME_ZONE."""
    value = datetime_from_ms(ms)
    if value is not None and not settings.USE_TZ:
        value = django_timezone.make_naive(value, django_timezone.get_default_timezone())
    return value


def is_task_job(job: Job) -> bool:
    return isinstance(job.data, dict) and isinstance(job.data.get("task"), dict)
