"""A backend for Django's Tasks framework: `@task` functions run on echomq.

    TASKS = {"default": {"BACKEND": "echomq_django.backends.EchoMQBackend",
                         "QUEUES": ["default"], "OPTIONS": {"ENQUEUE_ON_COMMIT": True}}}

A task becomes a job named by the task's module path, with data
{"args": [...], "kwargs": {...}, "task": {"backend", "priority", "queue_name", "run_after"}};
`manage.py echomq_worker` runs it. The worker only ever runs a `Task` object
found at that path inside an installed app: any other path fails the job,
nothing else is imported. The result id is the job id. "QUEUES": [] allows
every queue of ECHOMQ["QUEUES"], and get_result then looks in each of them.

`@task(attempts=, backoff=, time_limit=, soft_time_limit=)` (EchoMQTask) sets
the job's retries and time limits (seconds), else the queue's. A task is
cancelled as any job is, `get_queue(task.queue_name).cancel(result.id)`, and
its result is then FAILED with a JobCancelled error that gives the reason.

Reading a task's job back as its Task and TaskResult, for get_result and
for the worker's run of it, is task_results.py.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from . import outbox
from .conf import get_settings, settings_readable, unserved_queue
from .core import (
    MAX_PRIORITY,
    MIN_PRIORITY,
    Backoff,
    Dedupe,
    InvalidNameError,
    Job,
    JobOptions,
    Member,
    NewJob,
    PayloadError,
    Queue,
    UnrecoverableError,
    class_path,
    decode_stored,
    delay_until,
    encode_json,
    fail_for_good,
    now_ms,
    validate_job_id,
    validate_name,
)
from .job_options import naive_zone, own_time_limits_ms
from .queues import get_queue
from .task_results import is_task_job, stored_task, task_datetime, task_result_of
from .tasks_compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
    task_finished,
    task_started,
)
from .workflows import Signature

logger = logging.getLogger("echomq.tasks")
KNOWN_OPTIONS = {"ENQUEUE_ON_COMMIT", "DATABASE"}
# The state that holds a task's job, as the task's status; any other state (wait, delayed...) is READY.
STATUS_OF_STATE = {"active": TaskResultStatus.RUNNING, "completed": TaskResultStatus.SUCCESSFUL,
                   "failed": TaskResultStatus.FAILED}


class TaskArgumentsError(PayloadError, TypeError):
    """Task arguments that cannot be stored as JSON: a TypeError, as Django's own backends raise."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EchoMQTask(Task):
    """A Task with echomq's job options: `@task(attempts=5, backoff=Backoff("exponential", 1000), time_limit=60)`."""

    attempts: int | None = None  # None: the queue's ATTEMPTS
    backoff: Backoff | None = None  # None: the queue's BACKOFF
    time_limit: float | None = None  # seconds an attempt may run; None: the queue's TIME_LIMIT
    soft_time_limit: float | None = None  # seconds until SoftTimeLimitExceeded; None: the queue's SOFT_TIME_LIMIT
    group: str = ""  # the group of its jobs ("": none); see in_group
    # Deduplication of its jobs (see deduplicated): a key ("": none), a throttle's TTL or a debounce window (ms).
    dedupe: str = ""
    dedupe_ttl_ms: int = 0
    debounce_ms: int = 0
    debounce_keep: bool = False

    def in_group(self, group: str) -> EchoMQTask:
        """This task with its jobs in `group` (a tenant, a user): `send_mail.in_group(f"t{tenant.id}").enqueue(...)`.

        The queue's groups take turns, so one group's backlog does not hold up
        another's jobs, and the queue's GROUP_MAX_ACTIVE caps each group's
        running jobs. Like `using()`, it returns a new task, validated.
        """
        return dataclasses.replace(self, group=group)

    def deduplicated(self, key: str, *, ttl_ms: int = 0, debounce_ms: int = 0, keep_first: bool = False) -> EchoMQTask:
        """This task with its jobs deduplicated by `key`, as `@job(dedupe=)` (docs/execution.md): validated.

        While a job enqueued with the key waits or runs, an enqueue adds nothing; its TaskResult's id then
        names that job (get_result follows it), as soon as the send has happened (after the commit).
        `ttl_ms`: a throttle; `debounce_ms` (and `keep_first`): a debounce.
        """
        try:
            Dedupe(key, ttl_ms=ttl_ms, debounce_ms=debounce_ms, keep_first=keep_first)
        except PayloadError as error:
            raise InvalidTask(f"{error}.") from None
        task = dataclasses.replace(self, dedupe=key, dedupe_ttl_ms=ttl_ms, debounce_ms=debounce_ms,
                                   debounce_keep=keep_first)
        task.get_backend().validate_task(task)  # (replace alone checks nothing)
        return task

    def dedupe_options(self) -> Dedupe | None:
        """Its Dedupe (PayloadError when the options are wrong, a key "" included), or None without any."""
        if not (self.dedupe or self.dedupe_ttl_ms or self.debounce_ms or self.debounce_keep):
            return None
        return Dedupe(self.dedupe, ttl_ms=self.dedupe_ttl_ms, debounce_ms=self.debounce_ms,
                      keep_first=self.debounce_keep)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A workflow signature of this task (echomq_django.workflows): the previous step's result comes first."""
        return Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: the previous step's result is not passed."""
        return Signature(self, args, kwargs, immutable=True)

    def workflow_member(self, signature: Signature) -> Member:
        """The job a signature of this task adds to a workflow (its options over the task's), checked."""
        options, task = signature.options, self
        overrides = {key: options[name] for name, key in (("queue", "queue_name"), ("priority", "priority"))
                     if name in options}
        if overrides:
            task = task.using(**overrides)
        if "group" in options:
            task = task.in_group(options["group"])
        backend = task.get_backend()
        if not isinstance(backend, EchoMQBackend):
            raise InvalidTask(f"Task {task.module_path} is not on an EchoMQ backend: it cannot be a workflow's step.")
        queue, payload, opts = backend.prepared(task, signature.args, signature.kwargs, now_ms())
        opts = dataclasses.replace(opts, attempts=options.get("attempts", opts.attempts),
                                   delay_ms=options.get("delay_ms", opts.delay_ms))
        return Member(queue, task.module_path, payload, opts, immutable=signature.immutable,
                      allow_failure=bool(options.get("allow_failure", False)))


# The tasks with a hard time limit made so far, by (path, backend, queue), for the check of
# queues that run on threads (checks.check_time_limits). A task is validated by its backend
# whenever it is made (@task, Task.using), which is where it is recorded.
_time_limited: dict[tuple[str, str, str], Task] = {}


def time_limited_tasks() -> list[Task]:
    """Each task on an echomq backend seen with a hard time limit, once per path, backend and queue."""
    return [_time_limited[key] for key in sorted(_time_limited)]


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
        if isinstance(task.priority, bool):  # True == 1 passes Django's own check
            raise InvalidTask(f"priority must be a whole number between {MIN_PRIORITY} and {MAX_PRIORITY}, not a bool.")
        super().validate_task(task)
        if task.run_after is not None:  # the job's delay has a limit (ten years): refuse it here, not at enqueue
            try:
                JobOptions(delay_ms=delay_until(task.run_after, now_ms(), naive_zone()))
            except PayloadError as error:
                raise InvalidTask(f"run_after {task.run_after.isoformat()} is too far ahead: {error}.") from None
        attempts = getattr(task, "attempts", None)
        if attempts is not None and (not isinstance(attempts, int) or attempts < 1):
            raise InvalidTask(f"attempts must be a whole number >= 1, not {attempts!r}.")
        backoff = getattr(task, "backoff", None)
        if backoff is not None and not isinstance(backoff, Backoff):
            raise InvalidTask("backoff must be an echomq_django.core.Backoff, e.g. Backoff('exponential', 1000).")
        try:
            own_time_limits_ms(task)
        except PayloadError as error:
            raise InvalidTask(f"{error}.") from None
        if getattr(task, "time_limit", None) is not None:
            _time_limited[(task.module_path, task.backend, str(task.queue_name))] = task
        if group := getattr(task, "group", ""):
            try:
                JobOptions(group=group, priority=task.priority)
            except PayloadError as error:
                raise InvalidTask(f"{error}.") from None
        if isinstance(task, EchoMQTask):
            try:
                task.dedupe_options()
            except PayloadError as error:
                raise InvalidTask(f"{error}.") from None
        try:
            validate_name(task.queue_name, "queue name")
        except InvalidNameError as error:
            raise InvalidTask(str(error)) from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Send the task to its queue once the current transaction commits (at once outside one).

        InvalidTask for a queue outside ECHOMQ["QUEUES"]; TaskArgumentsError (a TypeError)
        for arguments that cannot be stored as JSON.
        """
        # One timestamp: stored as the job's, returned as enqueued_at, and the start of any delay.
        timestamp_ms = now_ms()
        queue, payload, opts = self.prepared(task, args, kwargs, timestamp_ms)
        dedupe = task.dedupe_options() if isinstance(task, EchoMQTask) else None
        job_id = outbox.new_job_id()
        result = TaskResult(
            task=task, id=job_id, status=TaskResultStatus.READY, enqueued_at=task_datetime(timestamp_ms),
            started_at=None, finished_at=None, last_attempted_at=None, args=payload["args"],
            kwargs=payload["kwargs"], backend=self.alias, errors=[], worker_ids=[],
        )

        def send() -> None:
            queue.add(task.module_path, payload, opts=opts, job_id=job_id, timestamp_ms=timestamp_ms, dedupe=dedupe)
            task_enqueued.send(type(self), task_result=result)

        if get_settings().uses_outbox(queue.name) and connections[self.database].in_atomic_block:
            # Written in this transaction, sent after its commit (outbox/jobs.py): enqueued once committed.
            outbox.enqueue(queue, NewJob(task.module_path, payload, opts, job_id, dedupe), timestamp_ms=timestamp_ms,
                           using=self.database)
            transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result), using=self.database)
        elif self.enqueue_on_commit:
            transaction.on_commit(send, using=self.database, robust=False)
        else:
            send()
        return result

    def prepared(self, task: Task, args: Any, kwargs: Any,
                 timestamp_ms: int) -> tuple[Queue, dict[str, Any], JobOptions]:
        """The task's queue, its job's data and options, all checked (InvalidTask, TaskArgumentsError)."""
        self.validate_task(task)
        if problem := unserved_queue(task.queue_name):
            raise InvalidTask(f"Task {task.module_path} cannot be enqueued: {problem}.")
        queue = get_queue(task.queue_name)
        payload = self.job_data(task, args, kwargs, queue.max_payload_bytes)
        limits = own_time_limits_ms(task)
        opts = queue.default_opts.overridden(attempts=getattr(task, "attempts", None),
                                             backoff=getattr(task, "backoff", None),
                                             delay_ms=delay_until(task.run_after, timestamp_ms, naive_zone()),
                                             priority=task.priority, time_limit_ms=limits["time_limit_ms"],
                                             soft_time_limit_ms=limits["soft_time_limit_ms"],
                                             group=getattr(task, "group", ""))
        return queue, payload, opts

    def job_data(self, task: Task, args: Any, kwargs: Any, max_bytes: int) -> dict[str, Any]:
        """The job's data: the arguments and what rebuilds the Task; TaskArgumentsError if it cannot be stored.

        The arguments as they are stored, and as get_result reads them back: normalized as Django's
        TaskResult does (tuples become lists, UTF-8 bytes str), then through JSON (so {1: 2} is {"1": 2}).
        """
        spec = {"backend": self.alias, "priority": task.priority, "queue_name": task.queue_name}
        if task.run_after is not None:
            spec["run_after"] = task.run_after.isoformat()
        what = f"the arguments of task {task.module_path}"
        try:
            data = {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs)), "task": spec}
        except (TypeError, ValueError, RecursionError) as error:
            raise TaskArgumentsError(f"{what} must be JSON-serializable: {error}") from None
        try:  # refuse now what the send would refuse after the commit
            return decode_stored(encode_json(data, what, max_bytes))
        except PayloadError as error:
            raise TaskArgumentsError(str(error)) from None

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as Redis has it now; TaskResultDoesNotExist if no queue of this backend has it."""
        try:
            validate_job_id(result_id)
        except InvalidNameError as error:
            raise TaskResultDoesNotExist(str(error)) from None
        for queue_name in self.result_queues():
            queue = get_queue(queue_name)
            job, state = queue.get_job_with_state(result_id)
            if job is None and (holder := queue.deduplicated_to(result_id)) is not None:
                job, state = queue.get_job_with_state(holder)  # its enqueue was deduplicated: the job that ran
            if job is not None and is_task_job(job):
                try:
                    task = stored_task(job)
                except UnrecoverableError as error:
                    raise TaskResultDoesNotExist(
                        f"job {result_id} exists but its task cannot be loaded: {error}") from error
                return task_result_of(job, task, STATUS_OF_STATE.get(state or "", TaskResultStatus.READY))
        raise TaskResultDoesNotExist(f"no task result {result_id!r} in the queues of backend {self.alias!r}")

    def result_queues(self) -> list[str]:
        """The queues this backend's tasks can be in: its QUEUES, or with "QUEUES": [] every echomq queue."""
        return sorted(self.queues or get_settings().queues)

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
            if settings_readable() and (problem := unserved_queue(queue)):
                messages.append(checks.Error(
                    f"{where}['QUEUES'] lists {queue!r}: {problem}, and enqueue refuses it.", id="echomq.E014",
                    hint=f"Add {queue!r} to ECHOMQ['QUEUES'], or remove it from {where}['QUEUES'] "
                         "([] allows every queue of ECHOMQ['QUEUES'])."))
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


def send_finished(result: TaskResult) -> None:
    """Send task_finished; a receiver's error is logged, and never changes the task's outcome or runs it again."""
    for receiver, response in task_finished.send_robust(EchoMQBackend, task_result=result):
        if isinstance(response, Exception):
            logger.error("task_finished receiver %r failed for task %s (id %s)", receiver,
                         result.task.module_path, result.id, exc_info=response)


def run_task_job(job: Job) -> Any:
    """Run a task job in the worker, sending task_started and task_finished around it.

    A return value that is not JSON fails the job for good with the TypeError of Django's normalize_json,
    as in Django's backends.
    task_started is sent as Django's backends send it: a receiver's error fails the attempt before
    the task runs. task_finished is sent robustly: a receiver's error is logged on "echomq.tasks"
    and the outcome stands, so a successful task is never run again. Its finished_at has the
    kind and ms precision of get_result's, but is the handler's end: the job's finishedOn is
    written just after, so get_result's finished_at can be a few ms later.
    """
    result = task_result_of(job, stored_task(job), TaskResultStatus.RUNNING)
    task, args, kwargs = result.task, [*job.workflow_args, *result.args], result.kwargs
    task_started.send(EchoMQBackend, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        # Running it again would not help: a return value that cannot be stored fails for good,
        # with Django's own words for what JSON cannot hold ("Unsupported type: ...").
        try:
            value = normalize_json(value)
        except RecursionError:
            pass  # deeper than Django's walk can go: encode_json refuses it below, saying so
        except (TypeError, ValueError) as error:
            raise fail_for_good(error) from None
        try:
            encode_json(value, f"the return value of task {task.module_path}")
        except PayloadError as error:
            raise fail_for_good(TypeError(str(error))) from None
    except BaseException as error:  # SystemExit and KeyboardInterrupt too: the worker records them as failures
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        object.__setattr__(result, "finished_at", task_datetime(now_ms()))
        result.errors.append(TaskError(
            exception_class_path=class_path(error),
            traceback="".join(traceback.format_exception(error))))
        send_finished(result)  # inside the handler, so receivers see sys.exc_info() as in Django's backends
        raise
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", task_datetime(now_ms()))
    object.__setattr__(result, "_return_value", value)
    send_finished(result)
    return value

