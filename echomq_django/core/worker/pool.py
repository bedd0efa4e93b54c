"""Where a worker's jobs run: on the worker's own threads, or in child processes it keeps.

The worker (worker.py) does all the Redis work and hands each job to a slot,
one job at a time per slot. A slot returns the end of the attempt (a Finish)
and never raises for the job's sake:

- ThreadSlot (thread_slot.py) runs the handler on the slot's thread. A job
  with a time limit runs on a thread of its own, which the slot watches: past
  the soft limit the job is asked to raise SoftTimeLimitExceeded at its next
  check (Job.check); past the hard limit the attempt fails, and the thread,
  which cannot be killed, runs on: it counts among the AbandonedThreads, and
  keeps a slot of the worker taken until it ends.
- ProcessSlot (process_slot.py) keeps one child process, started once and
  reused, and sends it one job at a time over a pipe. The child
  (child_side.py) only runs the handler; its progress and log reports come
  back through the pipe, and a thread of the slot writes them (reports.py),
  so that a write waiting for Redis never holds off a time limit. A soft
  limit is a SIGUSR1 that raises SoftTimeLimitExceeded wherever the job is; a
  hard limit, a cancel or a child that dies ends the attempt at once, and the
  next job gets a new child.

This module holds what both share: the handler's type, running it to a
Finish, and the Finish of an attempt that the pool ended.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable
from typing import Any

from ..errors import (
    JobCancelled,
    LockLostError,
    PayloadError,
    Postponed,
    RateLimited,
    Retry,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
    is_final,
)
from ..producing.tracing import run_traced
from ..protocol.codec import encode_json
from ..protocol.job import Job
from ..protocol.scripts import Finish
from ..protocol.times import now_ms, seconds_text
from .durable import Suspended

Handler = Callable[[Job], Any]
POOLS = ("threads", "processes")


def class_path(error: BaseException) -> str:
    """The dotted path of an exception's class, as the job hash records it (`errc`)."""
    return f"{type(error).__module__}.{type(error).__qualname__}"


def run_handler(handler: Handler, job: Job) -> Finish:
    """Run the handler; returns the end of the attempt (the job's own errors become a failed Finish)."""
    token = job.token or ""
    try:
        result = run_traced(job, handler)
        value = encode_json(result, f"return value of job {job.id}")
    except RateLimited as limited:  # not a failure: the job waits its turn again
        return Finish(job.id, token, completed=False, value=str(limited), rate_limited=True,
                      backoff_ms=math.ceil(limited.retry_after * 1000))
    except Suspended as suspended:  # a durable sleep or signal wait: the job waits without a slot
        return suspended_finish(job, suspended)
    except Postponed as postponed:  # not a failure either: it waits, and the queue's other jobs go on
        return Finish(job.id, token, completed=False, value=str(postponed), postponed=True,
                      backoff_ms=math.ceil(postponed.countdown * 1000))
    except Retry as retry:  # a failed attempt the job asked for, after its own countdown
        backoff_ms = (job.opts.backoff.delay_before(job.attempts_made + 1) if retry.countdown is None
                      else math.ceil(retry.countdown * 1000))
        return Finish(job.id, token, completed=False, value=f"Retry: {retry}", backoff_ms=backoff_ms,
                      error_class=class_path(retry))
    except BaseException as error:  # the job's own failure (SystemExit too): recorded on the job, not raised
        return Finish(
            job.id, token, completed=False, value=f"{type(error).__name__}: {error}",
            stacktrace="" if isinstance(error, PayloadError) else "".join(traceback.format_exception(error)),
            backoff_ms=job.opts.backoff.delay_before(job.attempts_made + 1),
            final=is_final(error),
            error_class=class_path(error),
        )
    return Finish(job.id, token, completed=True, value=value)


def suspended_finish(job: Job, suspended: Suspended) -> Finish:
    """The end of an attempt that sleeps (to delayed) or waits for a signal (to parked), no attempt used."""
    if suspended.parked:
        return Finish(job.id, job.token or "", completed=False, value=suspended.step, parked=True,
                      backoff_ms=suspended.until_ms)
    return Finish(job.id, job.token or "", completed=False, value=f"sleep {suspended.step}", postponed=True,
                  backoff_ms=max(suspended.until_ms - now_ms(), 0))


def ended(job: Job, reason: str, error: type[BaseException] | None = None, *, final: bool = False) -> Finish:
    """A failed attempt that the pool ended (time limit, cancel, a dead child), retried per the job's options.

    There is no traceback from inside the job: the stack trace entry says what ended it.
    """
    return Finish(job.id, job.token or "", completed=False, value=reason, final=final,
                  backoff_ms=0 if final else job.opts.backoff.delay_before(job.attempts_made + 1),
                  stacktrace=f"{error.__qualname__ if error else 'Ended by the worker'}: {reason}\n",
                  error_class=f"{error.__module__}.{error.__qualname__}" if error else "")


def cancelled(job: Job) -> Finish:
    """The end of a cancelled attempt (moveToFinished records the cancel's own reason)."""
    return ended(job, "cancelled", JobCancelled, final=True)


def soft_limit_exceeded(soft_ms: int) -> SoftTimeLimitExceeded:
    """What a job past its soft limit gets, the same on both pools."""
    return SoftTimeLimitExceeded(f"soft time limit of {seconds_text(soft_ms)} s exceeded")


def over_limit(job: Job, hard_ms: int) -> Finish:
    return ended(job, f"time limit of {seconds_text(hard_ms)} s exceeded", TimeLimitExceeded)


def stopped(job: Job) -> Finish | None:
    """The end of an attempt the worker stopped (a cancel, a lost lock), or None when it was not stopped."""
    if isinstance(job._interrupt, JobCancelled):
        return cancelled(job)
    if isinstance(job._interrupt, LockLostError):  # the sweeper recovered it: its result is refused anyway
        return ended(job, "stopped: this attempt lost its lock", LockLostError)
    return None
