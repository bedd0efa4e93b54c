"""Jobs as typed Python objects, read from and written to the Redis job hash."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from ..errors import Retry, SoftTimeLimitExceeded
from .codec import encode_json, lenient_json, log_line, strict_json
from .options import JobOptions, options_from_json

# A counter field of a job hash (atm, stc) counts only as plain decimal digits
# of at most this many characters: exact in a Lua number, and what HINCRBY takes.
MAX_COUNTER_CHARS = 15
# A job's progress is a small report (a number, a few fields), and a log line
# a line: these bound what a chatty job can put in Redis.
MAX_PROGRESS_BYTES = 64 * 1024


# The readers below never raise: a hash written by another client may hold
# anything, and a job must stay viewable (and removable) whatever it holds.

def _int(value: str | None) -> int:
    return _optional_int(value) or 0


def _optional_int(value: str | None) -> int | None:
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return int(float(value))  # "1.5e3" and the like, written by other clients
    except (ValueError, OverflowError):
        return None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


@functools.lru_cache(maxsize=256)
def _options_from_text(text: str | None) -> JobOptions:
    """The options in an `opts` field; jobs of one kind share the text, so each text is decoded once."""
    return options_from_json(lenient_json(text, {}))


def _trace_of(opts: str | None) -> dict[str, str] | None:
    """The trace context in an `opts` field (its `trace`, strings only), or None (core/producing/tracing.py)."""
    if not opts or '"trace"' not in opts:
        return None
    value = lenient_json(opts, None)
    trace = value.get("trace") if isinstance(value, dict) else None
    if not isinstance(trace, dict):
        return None
    return {key: text for key, text in trace.items() if isinstance(key, str) and isinstance(text, str)} or None


@functools.lru_cache(maxsize=256)
def _strict_options(text: str | None) -> JobOptions:
    """The options in an `opts` field, or PayloadError (jobs of one kind share the text)."""
    return JobOptions.from_json(strict_json(text, "the job's opts") or {})


class Reporter(Protocol):
    """What a worker attaches to a job it runs, so the job can report on itself (see worker.py)."""

    def progress(self, job: Job, progress_json: str) -> bool: ...

    def log(self, job: Job, line: str) -> bool: ...

    def step(self, job: Job, op: str, name: str, kind: str, text: str, deadline: int) -> Any:
        """A durable step's read ("read": its record or None) or write ("write", "wait": recordStep's reply)."""
        ...


@dataclass
class Job:
    """One job, as read from its hash. Redis stays the source of truth.

    While a worker runs it, `update_progress` and `log` write to Redis for
    the running attempt only.
    """

    queue: str
    id: str
    name: str
    data: Any
    opts: JobOptions
    timestamp: int = 0
    attempts_made: int = 0
    attempts_started: int = 0
    stall_count: int = 0
    processed_on: int | None = None
    finished_on: int | None = None
    failed_reason: str | None = None
    stacktrace: list[str] = field(default_factory=list)
    returnvalue: Any = None
    worker_id: str | None = None
    token: str | None = None
    worker_ids: list[str] = field(default_factory=list)  # one per attempt started
    started_on: int | None = None  # when the first attempt started
    error_classes: list[str] = field(default_factory=list)  # beside `stacktrace`, one per failure
    progress: Any = None  # what the job last reported (update_progress)
    logs: list[str] = field(default_factory=list)  # its newest log lines, oldest first (read by Queue.get_job)
    log_count: int = 0  # how many log lines it keeps (Queue.get_job may read fewer)
    cancel_reason: str | None = None  # set when it was cancelled (Queue.cancel), also while it still runs
    workflow_id: str | None = None  # the workflow it is a step of (core/producing/workflow.py), and its home queue
    workflow_queue: str | None = None
    inputs_mode: str = ""  # "1": its workflow inputs come before its own arguments; "2": an error handler's
    workflow_args: list[Any] = field(default_factory=list)  # those arguments, read by the worker before it runs
    next_steps: str | None = None  # its workflow edges (`nxt`, JSON), read where it ends
    # OpenTelemetry (core/producing/tracing.py): the W3C context of the span that sent it (opts `trace`), and, while a
    # worker runs it, that of its attempt's process span, in which the handler runs (sent to a pool's child).
    trace: dict[str, str] | None = None
    running_trace: dict[str, str] | None = None
    _reporter: Reporter | None = field(default=None, init=False, repr=False, compare=False)
    # What the running job is to raise at its next check (a cancel, a time limit); see check().
    _interrupt: BaseException | None = field(default=None, init=False, repr=False, compare=False)

    def attach(self, reporter: Reporter) -> None:
        """Let this job report progress and log lines through `reporter` (the worker running it)."""
        self._reporter = reporter

    def interrupt(self, error: BaseException) -> None:
        """Have the running job raise `error` at its next check (the worker's way to stop a thread).

        A pending stop (a cancel, a lost lock, the hard limit) is not replaced by a soft limit's warning.
        """
        if self._interrupt is None or isinstance(self._interrupt, SoftTimeLimitExceeded):
            self._interrupt = error

    def check(self) -> None:
        """Raise what the worker asked this job to stop with, if anything.

        `current_job()`, `update_progress` and `log` call this, so a job that
        reports is stopped there: SoftTimeLimitExceeded once when it ran past
        its soft limit; at every check, JobCancelled when it was cancelled,
        LockLostError when the sweeper recovered it, TimeLimitExceeded after its
        hard limit (the attempt has failed already).
        """
        error = self._interrupt
        if error is not None:
            if isinstance(error, SoftTimeLimitExceeded):
                self._interrupt = None
            raise error

    def _running(self, what: str) -> Reporter:
        if self._reporter is None:
            raise RuntimeError(f"job {self.id} can {what} only while a worker runs it (inside its job function)")
        return self._reporter

    def retry(self, countdown: float | None = None, reason: str = "") -> NoReturn:
        """End this attempt and run the job again after `countdown` seconds (its backoff by default): raises Retry.

        It counts an attempt; with none left the job fails for good.
        """
        raise Retry(countdown, reason)

    def update_progress(self, value: Any) -> bool:
        """Record how far the job got: a number or any JSON (emits a "progress" event).

        Returns False, writing nothing, when this attempt no longer owns the job
        (its lock lapsed and the sweeper recovered it), or when Redis could not
        take the write (the worker logs a warning; the job goes on).
        """
        reporter = self._running("report progress")
        self.check()
        written = reporter.progress(self, encode_json(value, f"progress of job {self.id}", MAX_PROGRESS_BYTES))
        if written:
            self.progress = value
        return written

    def log(self, message: Any) -> bool:
        """Append one line (str() of `message`, cut at MAX_LOG_LINE_CHARS) to the job's log.

        The job keeps its newest lines up to the worker's cap. Returns False,
        writing nothing, when this attempt no longer owns the job or Redis could
        not take the write.
        """
        reporter = self._running("log")
        self.check()
        return reporter.log(self, log_line(message))

    @classmethod
    def from_hash(cls, queue: str, job_id: str, fields: Mapping[str, str], *, strict: bool = False) -> Job:
        """Decode a job hash (as HGETALL returns it, strings) into a Job.

        Data that is not JSON is kept as its text and malformed opts read as
        the defaults, so any job can be shown. `strict` (a job about to run)
        raises PayloadError for those instead: such a job must fail with the
        reason, not run on the text or on default options.
        """
        data, opts = fields.get("data"), fields.get("opts")
        return cls(
            queue=queue,
            id=job_id,
            name=fields.get("name", ""),
            data=strict_json(data, "the job's data") if strict else lenient_json(data, None),
            opts=_strict_options(opts) if strict else _options_from_text(opts),
            timestamp=_int(fields.get("timestamp")),
            attempts_made=_int(fields.get("atm")),
            attempts_started=_int(fields.get("ats")),
            stall_count=_int(fields.get("stc")),
            processed_on=_optional_int(fields.get("processedOn")),
            finished_on=_optional_int(fields.get("finishedOn")),
            failed_reason=fields.get("failedReason"),
            stacktrace=_list(lenient_json(fields.get("stacktrace"), [])),
            returnvalue=lenient_json(fields.get("returnvalue"), None),
            worker_id=fields.get("wid"),
            token=fields.get("tok"),
            worker_ids=_list(lenient_json(fields.get("wids"), [])),
            started_on=_optional_int(fields.get("startedOn")),
            error_classes=_list(lenient_json(fields.get("errc"), [])),
            progress=lenient_json(fields.get("progress"), None),
            cancel_reason=fields.get("cxl"),
            workflow_id=fields.get("wf"),
            workflow_queue=fields.get("wfq"),
            inputs_mode=fields.get("inp", ""),
            next_steps=fields.get("nxt"),
            trace=_trace_of(opts),
        )

    @classmethod
    def from_flat(cls, queue: str, job_id: str, flat: list[str], *, strict: bool = False) -> Job:
        """Decode the flat field/value list a script returns (`strict` as for `from_hash`)."""
        return cls.from_hash(queue, job_id, dict(zip(flat[::2], flat[1::2])), strict=strict)


