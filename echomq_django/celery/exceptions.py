"""The exceptions a Celery project imports from `celery.exceptions`, as echomq raises them."""

from __future__ import annotations

from ..core import EchoMQError, Retry, SoftTimeLimitExceeded, TimeLimitExceeded

__all__ = ["CeleryError", "ImproperlyConfigured", "MaxRetriesExceededError", "Retry", "SoftTimeLimitExceeded",
           "TaskError", "TaskRevokedError", "TimeLimitExceeded", "TimeoutError"]

TimeoutError = TimeoutError  # noqa: A001, PLW0127  (AsyncResult.get raises the builtin, as Celery's does)


class CeleryError(EchoMQError):
    """The base of the errors of this module that echomq does not have under another name."""


class TaskError(CeleryError):
    """A failed job's error whose class could not be found in this process: its name and message are kept."""


class MaxRetriesExceededError(TaskError):
    """`self.retry()` of a task that used its retries (raised as the task's final failure, when no `exc` is given)."""


class TaskRevokedError(TaskError):
    """The result of a job that was revoked (cancelled): `.get()` raises it, `.result` is it."""


class ImproperlyConfigured(CeleryError, ValueError):
    """A task option or call echomq cannot honour: it names the option and says why."""
