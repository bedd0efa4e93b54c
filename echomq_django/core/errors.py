"""Exceptions raised by the queue runtime."""

from __future__ import annotations

MAX_RETRY_AFTER_S = 86_400  # a day: a longer pause of a whole queue is a mistake
# The longest wait of one job (a retry's countdown, a postponement): ten years, as protocol/options.py's MAX_DELAY_MS.
MAX_WAIT_S = 10 * 365 * 86_400


class EchoMQError(Exception):
    """Base class of every error this package raises on purpose."""


class InvalidNameError(EchoMQError, ValueError):
    """A queue name, job id or key prefix that must not become part of a Redis key."""


class PayloadError(EchoMQError, ValueError):
    """Job data, options or a return value that cannot be stored (not JSON, too large)."""


class JobNotFoundError(EchoMQError, LookupError):
    """The job hash does not exist (never added, removed, or trimmed by retention)."""


class JobFailedError(EchoMQError):
    """The job whose result was asked for failed (for good): `reason` says why."""

    def __init__(self, job_id: str, reason: str | None) -> None:
        self.job_id, self.reason = job_id, reason
        super().__init__(f"job {job_id} failed: {reason or 'no reason recorded'}")

    def __reduce__(self) -> tuple[type[JobFailedError], tuple[str, str | None]]:
        return type(self), (self.job_id, self.reason)


class JobNotFinishedError(EchoMQError):
    """The job whose result was asked for has not finished yet."""


class LockLostError(EchoMQError):
    """The worker no longer owns the job: its lock lapsed and the job was recovered.

    The worker's late result is discarded; whoever owns the job now decides its fate.
    """


class JobLockedError(EchoMQError):
    """The job is held by a live worker, so it cannot be removed."""


class QueueStateError(EchoMQError):
    """A queue key holds a Redis type the protocol does not expect."""


class UnrecoverableError(EchoMQError):
    """Raised by a job to fail it for good: no retry, whatever attempts are left."""


class JobCancelled(EchoMQError):
    """Raised inside a running job that was cancelled (Queue.cancel), at its next check.

    On the threads pool this is how a running job is stopped: at its next
    `current_job()`, `update_progress` or `log` (Job.check). The attempt fails
    for good with the cancel's reason, whatever the job does with this.
    """


class RateLimited(EchoMQError):
    """Raised by a job that was told to slow down (an HTTP 429, say): try it again after `retry_after` seconds.

    The job goes back to the front of the queue without using an attempt, and
    the queue's fetching pauses for `retry_after` seconds across all workers.
    """

    def __init__(self, retry_after: float = 0, message: str = "") -> None:
        if not 0 <= retry_after <= MAX_RETRY_AFTER_S:  # nan fails it too
            raise ValueError(f"retry_after is seconds from 0 to {MAX_RETRY_AFTER_S}, not {retry_after!r}")
        self.retry_after, self.message = retry_after, message
        super().__init__(message or f"rate limited: retry after {retry_after:g} s")

    def __reduce__(self) -> tuple[type[RateLimited], tuple[float, str]]:  # pickled as it was made
        return type(self), (self.retry_after, self.message)


class Postponed(EchoMQError):
    """Raised for a job that must wait `countdown` seconds before it runs (a task's own rate limit): it goes to
    `delayed` without using an attempt, and, unlike RateLimited, the queue's other jobs go on starting."""

    def __init__(self, countdown: float, reason: str = "") -> None:
        if not 0 <= countdown <= MAX_WAIT_S:  # nan fails it too
            raise ValueError(f"countdown is seconds from 0 to {MAX_WAIT_S}, not {countdown!r}")
        self.countdown, self.reason = countdown, reason
        super().__init__(f"postponed {countdown:g} s{': ' + reason if reason else ''}")

    def __reduce__(self) -> tuple[type[Postponed], tuple[float, str]]:  # pickled as it was made
        return type(self), (self.countdown, self.reason)


class Retry(EchoMQError):
    """Raised by a job to end this attempt and run again after `countdown` seconds (the job's backoff by default).

    It counts an attempt, as any failure does: with none left the job fails for good, with the reason.
    `current_job().retry(countdown=, reason=)` raises it.
    """

    def __init__(self, countdown: float | None = None, reason: str = "") -> None:
        if countdown is not None and not 0 <= countdown <= MAX_WAIT_S:  # nan fails it too
            raise ValueError(f"countdown is seconds from 0 to {MAX_WAIT_S}, not {countdown!r}")
        self.countdown, self.reason = countdown, reason
        super().__init__(f"retry requested{': ' + reason if reason else ''}"
                         + (f" (in {countdown:g} s)" if countdown is not None else ""))

    def __reduce__(self) -> tuple[type[Retry], tuple[float | None, str]]:  # pickled as it was made
        return type(self), (self.countdown, self.reason)


class DurableError(EchoMQError, ValueError):
    """A durable step that cannot be: a name used twice in one run, a limit passed, a step replayed as another kind."""


class SignalTimeout(EchoMQError):
    """Raised inside a job by `wait_for_signal` when its timeout passed with no signal; the job may catch it."""


class SignalRefused(EchoMQError):
    """A signal that cannot be sent: its name was sent before, its wait is over, or the job has finished."""


class StepFailed(EchoMQError):
    """Raised inside a job by `fan_out` when one of its children failed for good: `child_id` names it."""

    def __init__(self, step: str, child_id: str, reason: str) -> None:
        self.step, self.child_id, self.reason = step, child_id, reason
        super().__init__(f"step {step!r}: child job {child_id} failed: {reason}")

    def __reduce__(self) -> tuple[type[StepFailed], tuple[str, str, str]]:  # pickled as it was made
        return type(self), (self.step, self.child_id, self.reason)


class SoftTimeLimitExceeded(EchoMQError):
    """Raised inside a job that ran past its soft time limit; the job may catch it and clean up.

    On the processes pool it is raised wherever the job is (a signal); on the
    threads pool at the job's next check (Job.check), once.
    """


class TimeLimitExceeded(EchoMQError):
    """Raised at the next check inside a thread whose job ran past its hard time limit.

    The attempt has already failed by then and the worker has moved on: a
    thread cannot be killed, so this only stops a job that checks.
    """


def fail_for_good(error: BaseException) -> BaseException:
    """Mark `error`, about to be raised by a handler, to fail its job for good, as UnrecoverableError does.

    The job records the error's own class and trace; use it where the class
    matters to the reader (a TypeError for a return value that is not JSON).
    """
    error.echomq_final = True  # type: ignore[attr-defined]
    return error


def is_final(error: BaseException) -> bool:
    """Whether a handler's error ends its job whatever attempts are left."""
    return (isinstance(error, (UnrecoverableError, PayloadError, JobCancelled))
            or getattr(error, "echomq_final", False) is True)


class NotConfirmedError(EchoMQError):
    """Jobs were added, but fewer replicas than asked confirmed them in time.

    They are in the queue on the primary; only a failover before they reach
    a replica could lose them. `job_ids` names them, so a caller that gave
    its own ids can add them again safely.
    """

    def __init__(self, message: str, job_ids: list[str]) -> None:
        super().__init__(message)
        self.job_ids = job_ids


class RedisURLError(EchoMQError, ValueError):
    """A Redis URL that names no server this package can connect to."""


class WorkflowError(EchoMQError, ValueError):
    """A workflow that cannot be added as given (empty, too deep, too large, an unknown job), or has no result."""


class ScheduleError(EchoMQError, ValueError):
    """A schedule that cannot be: a bad cron expression, interval, time zone or name."""
