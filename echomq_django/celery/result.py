"""Celery's results on echomq's jobs: AsyncResult (a JobHandle: the job's id, a str) and GroupResult.

    result = add.delay(2, 2)
    result.get(timeout=10)         # 4; a failure raises the job's exception, rebuilt
    result.state                   # "SUCCESS" (states.py maps echomq's states)

A job's result is read from its hash in Redis, where it stays as the queue's
retention says (KEEP_COMPLETED, RESULT_TTL): there is no result backend to set.
"""

from __future__ import annotations

import builtins
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

from ..conf import get_settings
from ..core import (
    EchoMQError,
    Job,
    JobFailedError,
    JobHandle,
    JobNotFoundError,
    Plan,
    deadline_of,
    validate_id,
    validate_stored_id,
)
from ..queues import get_queue
from . import states
from .exceptions import TaskError, TaskRevokedError

# A workflow step failed because a member before it did: "member <id> failed: <the member's error>".
_MEMBER_FAILED = re.compile(r"member (\S+) failed: ")
_ERROR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The state a job reported with `self.update_state(state=..., meta=...)`: its progress, marked as this.
UPDATE_STATE_KEY = "celery_state"
# How often `get` looks again for a job that is in no queue yet (an AsyncResult(id) made before it was sent).
_FIND_INTERVAL_S = 0.1
_remote_classes: dict[str, type[Exception]] = {}


def rebuilt_error(reason: str | None, class_path: str = "") -> Exception:
    """The exception a failed job raised, made again from its reason ("ValueError: boom") and, where the job
    recorded it, its class's dotted path: that class if this process has imported it (and it is an Exception),
    a builtin of that name, else a TaskError subclass of that name. Nothing is imported for it."""
    text = reason if isinstance(reason, str) else ""
    while match := _MEMBER_FAILED.match(text):  # a step failed by its workflow: the member's own error
        text = text[match.end():]
    name, colon, message = text.partition(": ")
    if not colon or not _ERROR_NAME.fullmatch(name):
        name, message = "", text
    if not isinstance(class_path, str):  # another client's `errc`
        class_path = ""
    kind = _class_at(class_path) if class_path and class_path.rpartition(".")[2] == name else None
    if kind is None and name:
        found = getattr(builtins, name, None)
        kind = found if isinstance(found, type) and issubclass(found, Exception) else None
    if kind is not None:
        try:
            return kind(message)
        except Exception:  # a class whose constructor takes something else
            pass
    if not name:
        return TaskError(message)
    remote = _remote_classes.get(name)
    if remote is None:
        remote = _remote_classes.setdefault(name, type(name, (TaskError,), {"__module__": "echomq_django.remote"}))
    return remote(message)


def _class_at(path: str) -> type[Exception] | None:
    module_name, _, qualname = path.rpartition(".")
    found: Any = sys.modules.get(module_name)
    while found is not None and "." in qualname:
        head, _, qualname = qualname.partition(".")
        found = getattr(found, head, None)
    found = getattr(found, qualname, None) if found is not None else None
    return found if isinstance(found, type) and issubclass(found, Exception) else None


def celery_state(job: Job | None, state: str | None) -> str:
    """Celery's name for the state of `job` (states.py)."""
    if job is None:
        return states.PENDING
    if state == "completed":
        return states.SUCCESS
    if state == "failed":
        return states.REVOKED if job.cancel_reason else states.FAILURE
    if state == "active":
        reported = job.progress.get(UPDATE_STATE_KEY) if isinstance(job.progress, dict) else None
        return reported if isinstance(reported, str) and reported else states.STARTED
    if job.attempts_made > 0 and state in ("delayed", "wait", "prioritized", "paused"):
        return states.RETRY
    return states.PENDING


def _find_queue(job_id: str) -> Any:
    """The configured queue that holds job `job_id`, or None (one pipelined EXISTS per queue)."""
    queues = [get_queue(name) for name in get_settings().queues]
    pipe = queues[0].client.pipeline(transaction=False)
    for queue in queues:
        pipe.exists(queue.keys.job(job_id))
    return next((queue for queue, found in zip(queues, pipe.execute(), strict=True) if found), None)


def _member_class(reason: str | None) -> str:
    """A workflow step failed by a member before it: the class the member recorded (one read), else ""."""
    match = _MEMBER_FAILED.match(reason or "")
    if match is None:
        return ""
    try:
        queue = _find_queue(validate_id(match.group(1)))
        member = None if queue is None else queue.get_job(match.group(1), log_lines=0)
    except EchoMQError:
        return ""
    return member.error_classes[-1] if member is not None and member.error_classes else ""


class AsyncResult(JobHandle):
    """A job's result as Celery's AsyncResult reads it: `.get()`, `.state`, `.ready()`, `.result`...

    `AsyncResult(id)` finds the job's queue among ECHOMQ["QUEUES"] (PENDING until it is in one).
    `.status` is `.state` here, as in Celery (a JobHandle's `.status` is echomq's state name).
    """

    parent: Any = None
    _queue: Any = None

    def __new__(cls, job_id: str, queue: Any = None, *, parent: Any = None, app: Any = None) -> AsyncResult:
        result = str.__new__(cls, validate_stored_id(job_id))
        result._queue = queue
        result.parent = parent
        return result

    def __repr__(self) -> str:
        return f"<AsyncResult: {self.id}>"

    @property
    def queue(self) -> Any:
        """The job's Queue; None while no configured queue holds it."""
        if self._queue is None:
            self._queue = _find_queue(self.id)
        return self._queue

    @queue.setter
    def queue(self, value: Any) -> None:
        self._queue = value

    @property
    def task_id(self) -> str:
        return self.id

    def _read(self) -> tuple[Job | None, str | None]:
        queue = self.queue
        return (None, None) if queue is None else queue.get_job_with_state(self.id, log_lines=0)

    @property
    def state(self) -> str:
        """PENDING, STARTED, RETRY, SUCCESS, FAILURE, REVOKED, or the state the job set (update_state)."""
        return celery_state(*self._read())

    @property
    def status(self) -> str:
        return self.state

    @property
    def result(self) -> Any:
        """The return value; the exception (rebuilt) of a failure or a retry; a revoke's TaskRevokedError; the
        meta of update_state while it runs; else None."""
        job, state = self._read()
        return _value(job, celery_state(job, state))

    info = result

    @property
    def traceback(self) -> str | None:
        """The stack trace of the job's latest failure, if it had one."""
        job, _ = self._read()
        return job.stacktrace[-1] if job is not None and job.stacktrace else None

    @property
    def date_done(self) -> datetime | None:
        """When the job ended (UTC), if it did."""
        job, state = self._read()
        if job is None or state not in ("completed", "failed") or job.finished_on is None:
            return None
        return datetime.fromtimestamp(job.finished_on / 1000, UTC)

    @property
    def name(self) -> str | None:
        job, _ = self._read()
        return None if job is None else job.name

    def ready(self) -> bool:
        return self.state in states.READY_STATES

    def successful(self) -> bool:
        return self.state == states.SUCCESS

    def failed(self) -> bool:
        return self.state == states.FAILURE

    def get(self, timeout: float | None = None, propagate: bool = True, interval: float = 0.5,
            disable_sync_subtasks: bool = True, **_: Any) -> Any:
        """Wait for the job's end: its return value; its exception raised (returned with propagate=False).

        TimeoutError after `timeout` seconds. As Celery, a job waiting for
        another job's result is refused (RuntimeError): it would hold a slot
        that the other one may need; pass disable_sync_subtasks=False to wait anyway.
        """
        from ..registry import current_job

        if disable_sync_subtasks and current_job() is not None:
            raise RuntimeError("Never call result.get() within a job: it holds a slot the other job may need; "
                               "chain the jobs instead (or pass disable_sync_subtasks=False)")
        deadline = deadline_of(timeout)
        while self.queue is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} did not finish within {timeout} s (it is in no queue)")
            time.sleep(_FIND_INTERVAL_S)
        left = None if deadline is None else max(deadline - time.monotonic(), 0)
        try:
            return self._wait(left, None)
        except (JobFailedError, JobNotFoundError):
            job, state = self._read()
            if job is None:
                raise
            error = _value(job, celery_state(job, state))
            if propagate and isinstance(error, BaseException):
                raise error from None
            return error

    def wait(self, timeout: float | None = None, propagate: bool = True, **options: Any) -> Any:
        """`get` (Celery's older name)."""
        return self.get(timeout=timeout, propagate=propagate, **options)

    def forget(self) -> None:
        """Delete the job's record and result if it ended (Celery's forget); a job that has not ended is kept."""
        job, state = self._read()
        if job is not None and state in ("completed", "failed"):
            self.queue.remove(self.id, only_from=state)

    def revoke(self, connection: Any = None, terminate: bool = False, signal: Any = None, wait: bool = False,
               timeout: float | None = None) -> None:
        """Cancel the job: one that has not started never runs (REVOKED). A running one runs on to its end, unless
        `terminate=True`, which stops it as Queue.cancel does (its worker's way, whatever `signal` says)."""
        if self.queue is not None:
            self.queue.cancel(self.id, "revoked", stop_running=terminate)

    def then(self, *_: Any, **__: Any) -> Any:
        raise NotImplementedError("echomq has no promise callbacks on results: link a signature instead")


def _value(job: Job | None, state: str) -> Any:
    if job is None:
        return None
    if state == states.SUCCESS:
        return job.returnvalue
    if state == states.REVOKED:
        return TaskRevokedError(job.cancel_reason or "revoked")
    if state in (states.FAILURE, states.RETRY):
        return rebuilt_error(job.failed_reason, job.error_classes[-1] if job.error_classes else
                             _member_class(job.failed_reason))
    if isinstance(job.progress, dict) and UPDATE_STATE_KEY in job.progress:
        return job.progress.get("meta")
    return None


class GroupResult(list[Any]):
    """The results of a group's members, in order (a list of AsyncResults, or GroupResults for nested groups)."""

    def __init__(self, id: str | None = None, results: Any = (), parent: Any = None) -> None:  # noqa: A002
        super().__init__(results)
        self.id, self.parent = id, parent

    def __repr__(self) -> str:
        return f"<GroupResult: {self.id} [{', '.join(str(result) for result in self)}]>"

    # A group's results are one object, not a value: hashed as one.
    __hash__ = object.__hash__  # type: ignore[assignment]

    @property
    def results(self) -> list[Any]:
        return list(self)

    children = results

    def get(self, timeout: float | None = None, propagate: bool = True, **options: Any) -> list[Any]:
        """Each member's `get`, in order, within `timeout` seconds in all."""
        deadline = deadline_of(timeout)
        values = []
        for result in self:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            values.append(result.get(timeout=left, propagate=propagate, **options))
        return values

    join = join_native = get

    def completed_count(self) -> int:
        return sum(1 for result in self if result.successful())

    def ready(self) -> bool:
        return all(result.ready() for result in self)

    def successful(self) -> bool:
        return all(result.successful() for result in self)

    def failed(self) -> bool:
        return any(result.failed() for result in self)

    def waiting(self) -> bool:
        return not self.ready()

    def revoke(self, connection: Any = None, terminate: bool = False, **options: Any) -> None:
        for result in self:
            result.revoke(terminate=terminate)

    def forget(self) -> None:
        for result in self:
            result.forget()


def result_of(plan: Plan) -> Any:
    """Celery's result of an added workflow, from its tree: a chain's last step's (its `parent` the one before), a
    group's GroupResult (with the workflow's id at the top), a chord's body's, a linked node's body's."""
    queues = {step.id: step.member.queue for step in plan.steps}

    def walk(node: Any, parent: Any, top: bool) -> Any:
        if len(node) == 2:
            return AsyncResult(node[1], queues[node[1]], parent=parent)
        kind, parts, _handler = node
        if kind == "group":
            return GroupResult(plan.id if top else None, [walk(part, None, False) for part in parts], parent)
        if kind == "linked":
            return walk(parts[0], parent, top)
        result = parent
        for part in parts:  # a chain's steps, a chord's header then body: each the next one's parent
            result = walk(part, result, False)
        return result

    return walk(plan.tree, None, True)
