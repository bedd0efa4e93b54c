"""Durable steps in a job: `step`, `sleep`, `wait_for_signal`, `atomic_step` and `fan_out` (docs/durable.md).

A job that uses them resumes after its last finished step: each step's
result is recorded once, by a script that checks the attempt's lock token,
and every later run of the job (a retry, a recovery after its worker died, a
resume after a sleep or a signal) replays the recorded result instead of
running the step again. Code between steps runs again on every run, so it
must take the same steps in the same order: keep it deterministic.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, router, transaction

from .conf import get_settings
from .core import (
    MAX_WAIT_S,
    DurableError,
    Job,
    JobNotFoundError,
    Plan,
    SignalRefused,
    SignalTimeout,
    StepFailed,
    WorkflowHandle,
    jobs_gone,
)
from .core import durable as core
from .jobs import job
from .queues import get_queue
from .registry import current_job
from .signatures import expand_links
from .workflows import chord, group

__all__ = ["AtomicStep", "DurableError", "SignalRefused", "SignalTimeout", "StepFailed", "atomic_step", "fan_out",
           "forget_rows", "sleep", "step", "wait_for_signal"]


def _running(what: str) -> Job:
    found = current_job()
    if found is None:
        raise DurableError(f"{what} runs inside a job: call it from a job function that a worker runs")
    return found


def step(name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """Run `fn(*args, **kwargs)` and record its JSON result; on every later run of the job, return it unrun.

    A step that raises is not recorded: the job's own retry runs it again.
    """
    return core.run_step(_running(f"step({name!r})"), name, fn, args, kwargs)


def sleep(name: str, duration_or_until: timedelta | datetime | float) -> None:
    """Have the job wait without a worker until a time: it goes to `delayed`, its slot free, no attempt used.

    Seconds, a timedelta, or an aware datetime to sleep until. The end is
    recorded at the first run, so a re-run keeps it.
    """
    job_record = _running(f"sleep({name!r})")
    if isinstance(duration_or_until, datetime):
        if duration_or_until.tzinfo is None:
            raise DurableError(f"sleep({name!r}) takes an aware datetime (with a time zone), not a naive one")
        until_ms = int(duration_or_until.timestamp() * 1000)
        if until_ms - core.now_ms() > MAX_WAIT_S * 1000:
            raise DurableError(f"sleep({name!r}) sleeps at most {MAX_WAIT_S:,} seconds, not until {duration_or_until}")
    else:
        seconds = (duration_or_until.total_seconds() if isinstance(duration_or_until, timedelta)
                   else duration_or_until)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= MAX_WAIT_S:
            raise DurableError(f"sleep({name!r}) takes 0 to {MAX_WAIT_S:,} seconds, a timedelta or an aware "
                               f"datetime, not {duration_or_until!r}")
        until_ms = core.now_ms() + int(seconds * 1000)
    core.sleep_until(job_record, name, until_ms)


def wait_for_signal(name: str, timeout: timedelta | float | None = None) -> Any:
    """Park the job, with no slot and no lock, until `handle.signal(name, payload)` comes; return the payload.

    A signal sent before the job got here is kept and returned at once. Past
    `timeout` (seconds or a timedelta; None: wait for good) this raises
    SignalTimeout in the job, which may catch it.
    """
    job_record = _running(f"wait_for_signal({name!r})")
    timeout_ms = None
    if timeout is not None:
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_WAIT_S:
            raise DurableError(f"wait_for_signal({name!r}): timeout is None (no timeout) or more than 0 and at "
                               f"most {MAX_WAIT_S:,} seconds, not {timeout!r}")
        timeout_ms = max(int(seconds * 1000), 1)
    return core.wait_signal(job_record, name, timeout_ms)


class AtomicStep:
    """What `atomic_step` yields: set `.result` inside the block; `.replayed` is True on a run after the first."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.result: Any = None
        self.replayed = False


class _Replayed(Exception):
    """Rolls back an atomic step's block on a replay: its row was committed by an earlier run."""


@contextlib.contextmanager
def atomic_step(name: str, *, using: str | None = None) -> Iterator[AtomicStep]:
    """A block whose database writes and the step's record commit together, in one `transaction.atomic()`.

    On a later run of the job the recorded row decides: the block runs again
    (a `with` cannot skip its body) but its writes are rolled back, an error
    it raises is dropped with them, and `.result` is the first run's. So the
    block's database effects happen exactly once, even when the worker dies
    between the commit and anything it tells Redis. Effects outside the
    database are not covered: check `.replayed` to skip them (and the work).
    """
    from .models import DurableStep

    job_record = _running(f"atomic_step({name!r})")
    steps = core.Steps.of(job_record)
    with core.step_traced(job_record, name, "atomic") as replayed:
        steps.claim(name, "atomic")  # (a Redis record is only for the page: the row decides)
        database = using or router.db_for_write(DurableStep)
        rows = DurableStep.objects.using(database)
        # The job's add time in the key: a job id used again later (a caller's id) is a new job's.
        key = {"queue": job_record.queue, "job_id": job_record.id, "job_timestamp": job_record.timestamp,
               "name": name}
        holder = AtomicStep(name)
        row = rows.filter(**key).first()
        if row is not None:
            holder.result, holder.replayed = row.result, True
        replayed(holder.replayed)
        try:
            with transaction.atomic(using=database):
                try:
                    yield holder
                except Exception:
                    if not holder.replayed:
                        raise
                    # A replay's writes roll back whatever they did: an error they met (a unique row the first run
                    # made, say) is theirs too.
                if holder.replayed:
                    raise _Replayed
                result = core.check_result(holder.result, name)
                try:
                    with transaction.atomic(using=database):
                        rows.create(**key, result=result)
                except IntegrityError:  # another run of the job committed it first: this one's writes roll back
                    raise _Replayed from None
        except _Replayed:
            row = rows.get(**key)
            holder.result, holder.replayed = row.result, True
            replayed(True)
        # The row decides; the Redis record only shows the step on the job's page, once the row is committed
        # (a block inside the job's own transaction commits with it, or never).
        text = core.record("done", "atomic", r=holder.result)
        transaction.on_commit(lambda: _show_atomic(steps, name, text), using=database)


def _show_atomic(steps: Any, name: str, text: str) -> None:
    with contextlib.suppress(Exception):  # (the job goes on: its row holds)
        steps.write(name, "atomic", text)


def fan_out(name: str, signatures: Iterable[Any]) -> list[Any]:
    """Run these signatures as child jobs at once and park the job, with no slot, until every child ended.

    Returns their results in order (an empty list for no signatures), or raises
    StepFailed naming the child that failed for good. The children are a
    workflow (a chord whose callback signals this job), added again by every
    run until one began to wait: each re-sent add adds only what is missing.
    """
    job_record = _running(f"fan_out({name!r})")
    members = list(signatures)
    steps = core.Steps.of(job_record)
    with core.step_traced(job_record, name, "fan-out") as replayed:
        found = steps.claim(name, "fan-out")
        replayed(found is not None)
        if found is None and not members:
            found = steps.write(name, "fan-out", core.record("done", "fan-out", r={"results": []}))
        if found is None:
            found = _fan_out_wait(job_record, steps, name, members)
        outcome = found.get("r")
        if isinstance(outcome, dict) and "failed" in outcome:
            raise StepFailed(name, str(outcome["failed"]), str(outcome.get("reason", "")))
        if not isinstance(outcome, dict) or not isinstance(outcome.get("results"), list):
            raise DurableError(f"job {job_record.id}: the record of fan-out {name!r} holds no results")
        return outcome["results"]


def _fan_out_wait(job_record: Job, steps: Any, name: str, members: list[Any]) -> dict[str, Any]:
    """Add the fan-out's workflow unless a run began to wait for it, then wait: its final record, or park."""
    # The job's add time in the id: a job id used again later (a caller's id) fans out anew.
    digest = hashlib.sha256(f"{job_record.queue}\0{job_record.id}\0{job_record.timestamp}\0{name}".encode())
    queue = get_queue(job_record.queue)
    workflow = WorkflowHandle(queue, "fan" + digest.hexdigest()[:32])
    own = (job_record.queue, job_record.id, name)
    if name not in steps.waiting:  # no run finished the add: send it (again); what exists is not added twice
        canvas = chord(group(*members), _fan_in.s(*own).set(queue=job_record.queue),
                       on_error=_fan_failed.s(*own).set(queue=job_record.queue))
        Plan.of(expand_links(canvas), ttl_ms=get_settings().workflow_ttl_ms, workflow_id=workflow.id).add()
    elif (status := workflow.status) in ("succeeded", "failed"):
        # It ended while this job could not take its hand-off (cancelled then, and retried since): take it now.
        _hand_over(*own, workflow.results() if status == "succeeded" else {"failed": "", "reason": workflow.reason})
    decided = steps.wait(name, "fan-out", 0)
    if isinstance(decided, int):
        raise core.Suspended(name, parked=True, until_ms=0)
    return decided


@job(name="echomq.fan_in")
def _fan_in(results: list[Any], queue: str, job_id: str, name: str) -> dict[str, Any]:
    """A fan-out's chord callback: hand the children's results to the parked job, as its signal (and keep them
    as the workflow's result, for a job that could not take them then)."""
    payload = {"results": results}
    _hand_over(queue, job_id, name, payload)
    return payload


@job(name="echomq.fan_failed")
def _fan_failed(member_id: str, reason: str, queue: str, job_id: str, name: str) -> None:
    """A fan-out's error handler: tell the parked job which child failed for good."""
    _hand_over(queue, job_id, name, {"failed": member_id, "reason": reason})


def _hand_over(queue: str, job_id: str, name: str, payload: dict[str, Any]) -> None:
    # Refused: sent before (a re-run of this job), or the job finished or is gone (cancelled, removed): a retried
    # job takes it from the workflow's record.
    with contextlib.suppress(SignalRefused, JobNotFoundError):
        get_queue(queue).signal(job_id, name, payload)


def forget_rows(queue_name: str, *, batch: int = 500) -> int:
    """Delete the `DurableStep` rows of the queue's jobs that are gone from Redis, looking at `batch` rows a call;
    how many were deleted.

    A job no longer in Redis never runs again, so its rows decide nothing
    (and a caller's id used again later must not find them). The sweeper
    calls this after each sweep; each call goes on from where the last one
    of this process stopped, and starts over at the end of the table.
    """
    from .models import DurableStep

    rows = DurableStep.objects.filter(queue=queue_name)
    seen = list(rows.filter(pk__gt=_forget_cursor.get(queue_name, 0)).order_by("pk").values_list("pk", "job_id")[
        :batch])
    _forget_cursor[queue_name] = seen[-1][0] if len(seen) == batch else 0
    if not seen:
        return 0
    gone = jobs_gone(get_queue(queue_name), list(dict.fromkeys(job_id for _, job_id in seen)))
    return rows.filter(job_id__in=gone).delete()[0] if gone else 0


_forget_cursor: dict[str, int] = {}  # per queue: the last row forget_rows looked at (a batch's end)
