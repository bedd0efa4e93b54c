"""Durable steps: a running job's checkpoints, sleeps and signal waits, recorded in Redis (docs/durable.md).

Each step is recorded under the job (`<id>:steps`) by recordStep, for the
attempt that owns the job only, and once: a later attempt replays the
record instead of running the step again. A sleep or a signal wait ends the
attempt without using one (Suspended, turned into a Finish by the pool):
the job waits in `delayed` or `parked`, holding no slot and no lock.

The running job reaches Redis through its worker (the Reporter the worker
attached: on the processes pool, over the child's pipe), as its progress does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ..defaults import MAX_RESULT_BYTES, MAX_STEPS
from ..errors import DurableError, JobNotFoundError, LockLostError, SignalTimeout
from ..producing.tracing import step_traced as step_traced  # also for echomq_django.durable
from ..protocol.codec import encode_json, strict_json
from ..protocol.job import Job
from ..protocol.keys import validate_name

FINAL = ("done", "timeout")  # a record in one of these states is never replaced
# The kinds of step, as the job page shows them.
KINDS = ("step", "sleep", "signal", "atomic", "fan-out")


class Suspended(BaseException):
    """Ends the attempt without using one: a sleep (to `delayed` until `until_ms`) or a signal wait (`parked`).

    A BaseException, as GeneratorExit is, so that a job's own `except
    Exception:` around a step does not swallow it.
    """

    def __init__(self, step: str, *, parked: bool, until_ms: int) -> None:
        super().__init__(step, parked, until_ms)
        self.step = step
        self.parked = parked  # a signal wait: to `parked`, else a sleep: to `delayed`
        self.until_ms = until_ms  # the sleep's end, or the wait's deadline (0: none)

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (from a pool's child) as it was made
        return _suspended, (self.step, self.parked, self.until_ms)

    def __str__(self) -> str:
        what = "waits for its signal" if self.parked else "sleeps"
        return f"step {self.step!r} {what}" + (f" until {self.until_ms}" if self.until_ms else "")


def _suspended(step: str, parked: bool, until_ms: int) -> Suspended:
    return Suspended(step, parked=parked, until_ms=until_ms)


def record(state: str, kind: str, **fields: Any) -> str:
    """A step's record as recordStep stores it: compact JSON, its state first (the script reads the state there)."""
    return encode_json({"s": state, "k": kind, "at": now_ms(), **fields}, "a step's record")


def now_ms() -> int:
    return int(time.time() * 1000)


class Steps:
    """The durable steps of one running attempt: the names it used, and its calls through the job's worker."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.used: set[str] = set()
        self.waiting: set[str] = set()  # the names claimed whose record says an earlier run began to wait

    @classmethod
    def of(cls, job: Job) -> Steps:
        """The attempt's Steps, made at its first step (kept on the job object, which lives as long as the attempt)."""
        steps = job.__dict__.get("_durable_steps")
        if steps is None:
            steps = job.__dict__["_durable_steps"] = cls(job)
        return steps

    def claim(self, name: str, kind: str) -> dict[str, Any] | None:
        """Check the name and take it for this run; the step's final record from an earlier run, or None."""
        validate_name(name, "a step's name")
        if name in self.used:
            raise DurableError(f"job {self.job.id}: step name {name!r} is used twice; each step of a job needs a "
                               "name of its own")
        self.used.add(name)
        self.job.check()  # a cancelled job or one past its hard limit stops here
        found = self._reporter().step(self.job, "read", name, kind, "", 0)
        final = self._final(name, kind, found)
        if final is None and found and found.startswith('{"s":"waiting"'):
            self.waiting.add(name)
        return final

    def write(self, name: str, kind: str, text: str) -> dict[str, Any]:
        """Record a finished step (first write wins): the record that holds, this one or an earlier attempt's."""
        reply = self._reporter().step(self.job, "write", name, kind, text, 0)
        return self._answer(name, kind, reply)

    def write_failed(self, name: str, kind: str, error: BaseException) -> None:
        """Record the step's latest error (not final: a later run replaces it); shown on the job page only."""
        text = record("failed", kind, e=f"{type(error).__name__}: {error}"[:2000])
        try:
            self._reporter().step(self.job, "write", name, kind, text, 0)
        except Exception:  # the job's own error is what matters; this record is only for the page
            return

    def wait(self, name: str, kind: str, deadline_ms: int) -> dict[str, Any] | int:
        """A signal wait decided by recordStep: its final record, or the deadline to park until (0: none)."""
        reply = self._reporter().step(self.job, "wait", name, kind, "", deadline_ms)
        if reply[0] == 2:
            return int(reply[1])
        return self._answer(name, kind, reply)

    def _reporter(self) -> Any:
        return self.job._running("record durable steps")

    def _answer(self, name: str, kind: str, reply: list[Any]) -> dict[str, Any]:
        code = int(reply[0])
        if code == -1:
            raise JobNotFoundError(f"job {self.job.id!r} of queue {self.job.queue!r} does not exist")
        if code == -2:
            raise LockLostError(f"job {self.job.id!r} of queue {self.job.queue!r} is no longer owned by this "
                                f"attempt; its step {name!r} was not recorded")
        if code == -4:
            raise DurableError(f"job {self.job.id}: step {name!r} is one too many; a job records at most "
                               f"{MAX_STEPS:,} steps")
        found = self._final(name, kind, reply[1])
        assert found is not None, reply
        return found

    def _final(self, name: str, kind: str, text: str | None) -> dict[str, Any] | None:
        if not text:
            return None
        found = strict_json(text, f"the record of step {name!r}")
        if not isinstance(found, dict) or found.get("s") not in (*FINAL, "failed", "waiting"):
            raise DurableError(f"job {self.job.id}: the record of step {name!r} is not one this package writes")
        if found.get("k") != kind:
            raise DurableError(f"job {self.job.id}: step {name!r} was recorded as a {found.get('k')}, and is now "
                               f"a {kind}: a job must take the same steps, in the same order, on every run")
        return found if found["s"] in FINAL else None


def run_step(job: Job, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             kind: str = "step") -> Any:
    """`fn(*args, **kwargs)` once for the job: its recorded result on every later run (see `step`)."""
    steps = Steps.of(job)
    with step_traced(job, name, kind) as replayed:
        found = steps.claim(name, kind)
        replayed(found is not None)
        if found is not None:
            return found.get("r")
        try:
            result = fn(*args, **kwargs)
        except Exception as error:
            steps.write_failed(name, kind, error)
            raise
        text = record("done", kind, r=check_result(result, name))
        return steps.write(name, kind, text).get("r")


def sleep_until(job: Job, name: str, until_ms: int) -> None:
    """End the attempt until `until_ms` (recorded once, so a re-run keeps the first end); return once it passed."""
    steps = Steps.of(job)
    with step_traced(job, name, "sleep") as replayed:
        found = steps.claim(name, "sleep")
        replayed(found is not None)
        if found is None:
            found = steps.write(name, "sleep", record("done", "sleep", until=int(until_ms)))
        until = int(found.get("until") or 0)
        if now_ms() < until:
            raise Suspended(name, parked=False, until_ms=until)


def wait_signal(job: Job, name: str, timeout_ms: int | None, kind: str = "signal") -> Any:
    """The payload of the job's signal `name`, parking the job until it comes; SignalTimeout past the timeout."""
    steps = Steps.of(job)
    with step_traced(job, name, kind) as replayed:
        found = steps.claim(name, kind)
        replayed(found is not None)
        if found is None:
            deadline = 0 if timeout_ms is None else now_ms() + timeout_ms
            decided = steps.wait(name, kind, deadline)
            if isinstance(decided, int):
                raise Suspended(name, parked=True, until_ms=decided)
            found = decided
        if found["s"] == "timeout":
            raise SignalTimeout(f"job {job.id}: no signal {name!r} came before the wait's deadline")
        return found.get("r")


def check_result(value: Any, name: str) -> Any:
    """`value` checked to be JSON of at most MAX_RESULT_BYTES (PayloadError otherwise), as it will be replayed."""
    return strict_json(encode_json(value, f"the result of step {name!r}", MAX_RESULT_BYTES), "a step's result")
