"""A backend for Django's Tasks framework: `@task` functions run on echomq.

    TASKS = {"default": {"BACKEND": "echomq_django.backends.EchoMQBackend",
                         "QUEUES": ["default"], "OPTIONS": {"ENQUEUE_ON_COMMIT": True}}}

A task becomes a job named by the task's module path, with data
{"args": [...], "kwargs": {...}, "task": {...}}; `manage.py echomq_worker`
runs it. The worker only ever runs a `Task` object found at that path inside
an installed app: any other path fails the job, nothing else is imported.
"""

from __future__ import annotations

import dataclasses
import math
import traceback
import uuid
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, transaction
from django.utils import timezone as django_timezone
from django.utils.module_loading import import_string

from .conf import get_settings
from .core import Backoff, InvalidNameError, Job, UnrecoverableError, validate_name
from .core.job import datetime_from_ms, encode_json
from .queues import get_queue
from .tasks_compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
    task_finished,
    task_started,
)

KNOWN_OPTIONS = {"ENQUEUE_ON_COMMIT", "DATABASE"}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EchoMQTask(Task):
    """A Task with echomq's retry options: `@task(attempts=5, backoff=Backoff("exponential", 1000))`."""

    attempts: int | None = None  # None: the queue's ATTEMPTS
    backoff: Backoff | None = None  # None: the queue's BACKOFF


def new_job_id() -> str:
    """A random job id that can never look like a generated (all-digit) one."""
    return "t" + uuid.uuid4().hex


class EchoMQBackend(BaseTaskBackend):
    task_class = EchoMQTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.enqueue_on_commit = self.options.get("ENQUEUE_ON_COMMIT", True)
        self.database = self.options.get("DATABASE", DEFAULT_DB_ALIAS)

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        attempts = getattr(task, "attempts", None)
        if attempts is not None and (not isinstance(attempts, int) or attempts < 1):
            raise InvalidTask(f"attempts must be a whole number >= 1, not {attempts!r}.")
        backoff = getattr(task, "backoff", None)
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidTask("backoff must be an echomq_django.core.Backoff, e.g. Backoff('exponential', 1000).")
        try:
            validate_name(task.queue_name, "queue name")
        except InvalidNameError as error:
            raise InvalidTask(str(error)) from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Send the task to its queue once the current transaction commits (at once outside one)."""
        self.validate_task(task)
        job_id, enqueued_at = new_job_id(), django_timezone.now()
        payload = {"args": list(args), "kwargs": dict(kwargs),
                   "task": {"backend": self.alias, "priority": task.priority, "queue_name": task.queue_name}}
        encode_json(payload, f"the arguments of task {task.module_path}")  # refuse non-JSON now, not later
        queue = get_queue(task.queue_name)
        delay_ms = 0
        if task.run_after is not None:
            delay_ms = max(0, math.ceil((task.run_after - enqueued_at).total_seconds() * 1000))
        opts = queue.default_opts.overridden(attempts=getattr(task, "attempts", None),
                                             backoff=getattr(task, "backoff", None),
                                             delay_ms=delay_ms, priority=task.priority)
        result = TaskResult(
            task=task, id=job_id, status=TaskResultStatus.READY, enqueued_at=enqueued_at, started_at=None,
            finished_at=None, last_attempted_at=None, args=list(args), kwargs=dict(kwargs),
            backend=self.alias, errors=[], worker_ids=[],
        )

        def send() -> None:
            queue.add(task.module_path, payload, opts=opts, job_id=job_id)
            task_enqueued.send(type(self), task_result=result)

        if self.enqueue_on_commit:
            transaction.on_commit(send, using=self.database, robust=False)
        else:
            send()
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as Redis has it now; TaskResultDoesNotExist if no queue of this backend has it."""
        try:
            validate_name(result_id, "task result id")
        except InvalidNameError as error:
            raise TaskResultDoesNotExist(str(error)) from None
        for queue_name in sorted(self.queues):
            queue = get_queue(queue_name)
            pipe = queue.client.pipeline(transaction=True)  # one consistent view of hash and sets
            pipe.hgetall(queue.keys.job(result_id))
            pipe.zscore(queue.keys.completed, result_id)
            pipe.zscore(queue.keys.failed, result_id)
            fields, completed, failed = pipe.execute()
            job = Job.from_hash(queue_name, result_id, fields)
            if fields and is_task_job(job):
                status = (TaskResultStatus.SUCCESSFUL if completed is not None
                          else TaskResultStatus.FAILED if failed is not None
                          else TaskResultStatus.RUNNING if job.token else TaskResultStatus.READY)
                try:
                    task = load_task(job.name)
                except UnrecoverableError as error:
                    raise TaskResultDoesNotExist(
                        f"job {result_id} exists but its task cannot be loaded: {error}") from None
                return task_result_of(job, task, status)
        raise TaskResultDoesNotExist(f"no task result {result_id!r} in the queues of backend {self.alias!r}")

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages: list[checks.CheckMessage] = []
        where = f"TASKS[{self.alias!r}]"
        for queue in sorted(self.queues):
            try:
                validate_name(queue, "queue name")
            except InvalidNameError as error:
                messages.append(checks.Error(f"{where}['QUEUES']: {error}.", id="echomq.E010",
                                             hint="Queue names become part of Redis keys."))
                continue
            if queue not in get_settings().queues:
                messages.append(checks.Warning(
                    f"{where} queue {queue!r} is not in ECHOMQ['QUEUES'], so echomq_worker only runs its tasks "
                    "when given --queue.", id="echomq.W010", hint=f"Add {queue!r} to ECHOMQ['QUEUES']."))
        for unknown in sorted(set(self.options) - KNOWN_OPTIONS):
            messages.append(checks.Warning(f"{where}['OPTIONS'] has an unknown key {unknown!r}.", id="echomq.W011",
                                           hint=f"Known options: {', '.join(sorted(KNOWN_OPTIONS))}."))
        if not isinstance(self.enqueue_on_commit, bool):
            messages.append(checks.Error(f"{where}['OPTIONS']['ENQUEUE_ON_COMMIT'] must be True or False.",
                                         id="echomq.E011", hint="True (the default) sends tasks after commit."))
        if self.database not in settings.DATABASES:
            messages.append(checks.Error(f"{where}['OPTIONS']['DATABASE'] {self.database!r} is not in DATABASES.",
                                         id="echomq.E012", hint="Name the database whose transactions matter."))
        return messages


def load_task(path: str) -> Task:
    """The Task object at `path`, which must be inside an installed app; else UnrecoverableError."""
    if apps.get_containing_app_config(path) is None:
        raise UnrecoverableError(f"{path!r} is not inside an installed app, so it is not imported")
    try:
        found = import_string(path)
    except ImportError as error:
        raise UnrecoverableError(f"cannot import task {path!r}: {error}") from None
    if not isinstance(found, Task):
        raise UnrecoverableError(f"{path!r} is not a Django Task (decorate it with @task)")
    return found


def task_result_of(job: Job, task: Task, status: TaskResultStatus) -> TaskResult:
    """A TaskResult built from a task job's hash."""
    spec = job.data["task"]
    task = task.using(priority=spec.get("priority"), queue_name=job.queue)
    traces = job.stacktrace[-len(job.error_classes):] if job.error_classes else []
    result = TaskResult(
        task=task, id=job.id, status=status, enqueued_at=datetime_from_ms(job.timestamp),
        started_at=datetime_from_ms(job.started_on), last_attempted_at=datetime_from_ms(job.processed_on),
        finished_at=(datetime_from_ms(job.finished_on)
                     if status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED) else None),
        args=job.data.get("args", []), kwargs=job.data.get("kwargs", {}), backend=spec.get("backend", "default"),
        errors=[TaskError(exception_class_path=path, traceback=trace)
                for path, trace in zip(job.error_classes, traces)],
        worker_ids=list(job.worker_ids),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.returnvalue)
    return result


def is_task_job(job: Job) -> bool:
    return isinstance(job.data, dict) and isinstance(job.data.get("task"), dict)


def run_task_job(job: Job) -> Any:
    """Run a task job in the worker, sending task_started and task_finished around it."""
    result = task_result_of(job, load_task(job.name), TaskResultStatus.RUNNING)
    task, args, kwargs = result.task, result.args, result.kwargs
    task_started.send(EchoMQBackend, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        encode_json(value, f"the return value of task {task.module_path}")
    except Exception as error:
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", django_timezone.now())
        result.errors.append(TaskError(
            exception_class_path=f"{type(error).__module__}.{type(error).__qualname__}",
            traceback="".join(traceback.format_exception(error))))
        task_finished.send(EchoMQBackend, task_result=result)
        raise
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", django_timezone.now())
    object.__setattr__(result, "_return_value", value)
    task_finished.send(EchoMQBackend, task_result=result)
    return value

