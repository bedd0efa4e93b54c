"""Jobs as typed Python objects, and the codec to and from the Redis job hash."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from .. import defaults
from ..errors import InvalidNameError, PayloadError, Retry, SoftTimeLimitExceeded
from .keys import validate_name

# The bounds of the numbers a job may carry. The Lua scripts get them from
# here (core/protocol/lua.py's generated include "constants"), so a value one side refuses
# is never used by the other.
MAX_ATTEMPTS = 1_000_000
MIN_PRIORITY, MAX_PRIORITY = -100, 100  # higher runs first
MAX_DELAY_MS = 10 * 365 * 86_400_000  # ten years: any delay or backoff, exact in a double
# The latest creation time a producer may give a job: it plus the longest delay is still exact in a double.
MAX_TIMESTAMP_MS = 2**53 - 1 - MAX_DELAY_MS
# A counter field of a job hash (atm, stc) counts only as plain decimal digits
# of at most this many characters: exact in a Lua number, and what HINCRBY takes.
MAX_COUNTER_CHARS = 15
# Deeper JSON than this is refused at enqueue: SQLite's JSON functions (the
# admin's mirror) stop at 1,000 levels, Python's decoder near its recursion
# limit, and no real payload comes close.
MAX_JSON_DEPTH = 100
# A job's progress is a small report (a number, a few fields), and a log line
# a line: these bound what a chatty job can put in Redis.
MAX_PROGRESS_BYTES = 64 * 1024
MAX_LOG_LINE_CHARS = 10_000
# What a reader keeps of a field nested deeper than MAX_JSON_DEPTH, which only
# another client can have written: its text, cut here (see TooDeep).
TOO_DEEP_CHARS = 10_000


def whole_number(value: Any, what: str, low: int, high: int) -> int:
    """`value` if it is a whole number from `low` to `high` (an integral float counts), else PayloadError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PayloadError(f"{what} must be a whole number from {low} to {high}, not {value!r}")
    return value


@dataclass(frozen=True)
class Backoff:
    """How long to wait before retrying a failed attempt."""

    kind: str = "fixed"  # "fixed" or "exponential"
    delay_ms: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "exponential"):
            raise PayloadError(f"backoff type must be 'fixed' or 'exponential', not {self.kind!r}")
        object.__setattr__(self, "delay_ms", whole_number(self.delay_ms, "backoff delay (ms)", 0, MAX_DELAY_MS))

    def delay_before(self, attempts_made: int) -> int:
        """The wait (ms) before the next attempt, after `attempts_made` attempts (at most MAX_DELAY_MS)."""
        if self.kind == "exponential":
            # The exponent is capped first: 2 ** (a huge attempt count) would hold the interpreter.
            factor: int = 2 ** min(max(attempts_made - 1, 0), 64)
            return min(self.delay_ms * factor, MAX_DELAY_MS)
        return self.delay_ms

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "delay": self.delay_ms}

    @classmethod
    def from_json(cls, value: Any) -> Backoff:
        if value is None:
            return cls()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return cls("fixed", value)  # type: ignore[arg-type]  # an integral float is made whole
        if isinstance(value, Mapping):
            return cls(str(value.get("type", "fixed")), value.get("delay", 0))
        raise PayloadError(f"backoff must be a number of ms or {{type, delay}}, not {value!r}")


@dataclass(frozen=True)
class JobOptions:
    """Per-job options, stored as the job's `opts` JSON."""

    attempts: int = defaults.ATTEMPTS
    backoff: Backoff = field(default_factory=Backoff)
    delay_ms: int = 0
    priority: int = 0  # MIN_PRIORITY..MAX_PRIORITY; higher runs first
    # A job's own time limits (0: the worker's, from its queue's settings); see worker.py.
    time_limit_ms: int = 0
    soft_time_limit_ms: int = 0
    # The job's group (a tenant, a user): the queue's workers take groups in turn, and
    # GROUP_MAX_ACTIVE caps each group's running jobs. "" for none.
    group: str = ""
    # ms after the job's creation past which it never starts (0: never expires); moveToActive fails it "expired".
    expires_ms: int = 0
    # ms a completed job (its result) is kept at most (0: as its queue's retention says); moveToFinished.
    result_ttl_ms: int = 0

    def __post_init__(self) -> None:
        # Checked here, for every way options are made; an integral float (3.0, from JSON) becomes an int.
        object.__setattr__(self, "attempts", whole_number(self.attempts, "attempts", 1, MAX_ATTEMPTS))
        object.__setattr__(self, "priority", whole_number(self.priority, "priority", MIN_PRIORITY, MAX_PRIORITY))
        object.__setattr__(self, "delay_ms", whole_number(self.delay_ms, "delay (ms)", 0, MAX_DELAY_MS))
        object.__setattr__(self, "expires_ms", whole_number(self.expires_ms, "expiry (ms)", 0, MAX_DELAY_MS))
        object.__setattr__(self, "result_ttl_ms", whole_number(self.result_ttl_ms, "result TTL (ms)", 0, MAX_DELAY_MS))
        if self.expires_ms and self.expires_ms <= self.delay_ms:
            raise PayloadError(f"the job would expire ({self.expires_ms} ms after it is added) before it is due "
                               f"({self.delay_ms} ms after): it could never run")
        hard = whole_number(self.time_limit_ms, "time limit (ms)", 0, MAX_DELAY_MS)
        soft = whole_number(self.soft_time_limit_ms, "soft time limit (ms)", 0, MAX_DELAY_MS)
        if hard and soft >= hard:
            raise PayloadError(f"the soft time limit ({soft} ms) must be shorter than the time limit ({hard} ms): "
                               "it is the job's warning before the hard limit stops it")
        object.__setattr__(self, "time_limit_ms", hard)
        object.__setattr__(self, "soft_time_limit_ms", soft)
        if self.group:
            try:
                validate_name(self.group, "group")
            except InvalidNameError as error:
                raise PayloadError(str(error)) from None
            if self.priority:
                raise PayloadError("a job in a group cannot have a priority: the queue's workers take groups in "
                                   "turn, each group's jobs in the order they became ready")

    def overridden(self, *, attempts: int | None = None, backoff: Backoff | None = None,
                   delay_ms: int = 0, priority: int = 0,
                   time_limit_ms: int | None = None, soft_time_limit_ms: int | None = None,
                   group: str | None = None, expires_ms: int = 0, result_ttl_ms: int | None = None) -> JobOptions:
        """These options as defaults, with a job's own attempts, backoff and time limits where it has them.

        Every enqueue asks for its options, mostly the same ones: those are
        built (and checked, and encoded) once.
        """
        key = (attempts, backoff, delay_ms, priority, time_limit_ms, soft_time_limit_ms, group, expires_ms,
               result_ttl_ms)
        try:
            return _overridden(self, *key)
        except TypeError:  # an unhashable value, which the options refuse with their own message
            return self._override(*key)

    def _override(self, attempts: int | None, backoff: Backoff | None, delay_ms: int, priority: int,
                  time_limit_ms: int | None, soft_time_limit_ms: int | None, group: str | None,
                  expires_ms: int = 0, result_ttl_ms: int | None = None) -> JobOptions:
        return JobOptions(attempts=self.attempts if attempts is None else attempts,
                          backoff=backoff or self.backoff,
                          delay_ms=delay_ms, priority=priority,
                          time_limit_ms=self.time_limit_ms if time_limit_ms is None else time_limit_ms,
                          soft_time_limit_ms=(self.soft_time_limit_ms if soft_time_limit_ms is None
                                              else soft_time_limit_ms),
                          group=self.group if group is None else group, expires_ms=expires_ms,
                          result_ttl_ms=self.result_ttl_ms if result_ttl_ms is None else result_ttl_ms)

    def to_json(self) -> dict[str, Any]:
        """The options as stored; defaults other than `attempts` are left out, to keep jobs small."""
        value: dict[str, Any] = {"attempts": self.attempts}
        if self.backoff != Backoff():
            value["backoff"] = self.backoff.to_json()
        if self.delay_ms:
            value["delay"] = self.delay_ms
        if self.priority:
            value["priority"] = self.priority
        if self.time_limit_ms:
            value["timeLimit"] = self.time_limit_ms
        if self.soft_time_limit_ms:
            value["softTimeLimit"] = self.soft_time_limit_ms
        if self.group:
            value["group"] = self.group
        if self.expires_ms:
            value["expires"] = self.expires_ms
        if self.result_ttl_ms:
            value["resultTtl"] = self.result_ttl_ms
        return value

    def encoded(self) -> str:
        """`to_json` as JSON text, worked out once per options object."""
        return _encoded_options(self)

    @classmethod
    def from_json(cls, value: Any) -> JobOptions:
        """Options from decoded `opts` JSON; PayloadError saying what is wrong when they are malformed."""
        if not isinstance(value, Mapping):
            raise PayloadError(f"opts must be a JSON object, not {type(value).__name__}")
        return cls(attempts=value.get("attempts", defaults.ATTEMPTS), backoff=Backoff.from_json(value.get("backoff")),
                   delay_ms=value.get("delay", 0), priority=value.get("priority", 0),
                   time_limit_ms=value.get("timeLimit", 0), soft_time_limit_ms=value.get("softTimeLimit", 0),
                   group=value.get("group", ""), expires_ms=value.get("expires", 0),
                   result_ttl_ms=value.get("resultTtl", 0))


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


def options_from_json(value: Any) -> JobOptions:
    """JobOptions from decoded `opts` JSON; the defaults when it is malformed."""
    try:
        return JobOptions.from_json(value if isinstance(value, Mapping) else {})
    except PayloadError:
        return JobOptions()


@functools.lru_cache(maxsize=256)
def _options_from_text(text: str | None) -> JobOptions:
    """The options in an `opts` field; jobs of one kind share the text, so each text is decoded once."""
    return options_from_json(_json(text, {}))


class TooDeep(str):
    """A job field nested deeper than MAX_JSON_DEPTH (another client's), kept as the start of its JSON text.

    Decoded, it would break whatever walks it (json.dumps, the mirror's copy,
    the database's JSON checks, Python's recursion limit) on the admin's
    pages and in the mirror; as text it is flat, and cut at TOO_DEEP_CHARS.
    """

    note = (f"nested more than {MAX_JSON_DEPTH} levels deep, so it is not decoded: "
            f"its JSON text is shown instead (at most {TOO_DEEP_CHARS:,} characters)")

    @classmethod
    def of(cls, text: str) -> TooDeep:
        """`text`, cut at TOO_DEEP_CHARS."""
        return cls(text if len(text) <= TOO_DEEP_CHARS else text[:TOO_DEEP_CHARS - 1] + "…")


def _trace_of(opts: str | None) -> dict[str, str] | None:
    """The trace context in an `opts` field (its `trace`, strings only), or None (core/producing/tracing.py)."""
    if not opts or '"trace"' not in opts:
        return None
    value = _json(opts, None)
    trace = value.get("trace") if isinstance(value, dict) else None
    if not isinstance(trace, dict):
        return None
    return {key: text for key, text in trace.items() if isinstance(key, str) and isinstance(text, str)} or None


def decode_stored(text: str | bytes) -> Any:
    """JSON read back from Redis or a database row, which another client may have written: every text that does
    not decode raises ValueError, one nested too deep for Python's decoder (its RecursionError) too, so a
    caller's `except ValueError` covers every kind (tests/unit/test_structure.py keeps bare json.loads out).
    NaN and Infinity are refused too: what is read may be printed as JSON again (echomq_status --json)."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply to decode") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (none of ours writes it)")


def _json(value: str | None, default: Any) -> Any:
    if value in (None, ""):
        return default
    try:
        decoded = json.loads(value)
    except RecursionError:
        return TooDeep.of(value)
    except ValueError:
        return value  # not JSON: shown as the text it is
    # Only a text with many brackets can be too deep, and only that one is walked.
    if value.count("[") + value.count("{") > MAX_JSON_DEPTH and deeper_than(decoded, MAX_JSON_DEPTH):
        return TooDeep.of(value)
    return decoded


@functools.lru_cache(maxsize=256)
def _strict_options(text: str | None) -> JobOptions:
    """The options in an `opts` field, or PayloadError (jobs of one kind share the text)."""
    return JobOptions.from_json(_strict_json(text, "the job's opts") or {})


def _strict_json(value: str | None, what: str) -> Any:
    """Decoded JSON for a job that is about to run; PayloadError when it cannot be decoded."""
    if value in (None, ""):
        return None
    try:
        return json.loads(value)
    except RecursionError:
        raise PayloadError(f"{what} is nested too deeply to decode") from None
    except ValueError as error:
        raise PayloadError(f"{what} is not JSON: {error}") from None


class Reporter(Protocol):
    """What a worker attaches to a job it runs, so the job can report on itself (see worker.py)."""

    def progress(self, job: Job, progress_json: str) -> bool: ...

    def log(self, job: Job, line: str) -> bool: ...


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
            data=_strict_json(data, "the job's data") if strict else _json(data, None),
            opts=_strict_options(opts) if strict else _options_from_text(opts),
            timestamp=_int(fields.get("timestamp")),
            attempts_made=_int(fields.get("atm")),
            attempts_started=_int(fields.get("ats")),
            stall_count=_int(fields.get("stc")),
            processed_on=_optional_int(fields.get("processedOn")),
            finished_on=_optional_int(fields.get("finishedOn")),
            failed_reason=fields.get("failedReason"),
            stacktrace=_list(_json(fields.get("stacktrace"), [])),
            returnvalue=_json(fields.get("returnvalue"), None),
            worker_id=fields.get("wid"),
            token=fields.get("tok"),
            worker_ids=_list(_json(fields.get("wids"), [])),
            started_on=_optional_int(fields.get("startedOn")),
            error_classes=_list(_json(fields.get("errc"), [])),
            progress=_json(fields.get("progress"), None),
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


def log_line(message: Any) -> str:
    """str() of `message` as a job's log keeps it: cut at MAX_LOG_LINE_CHARS, a lone surrogate as its escape.

    Job.log writes lines so; the admin's job page shows each line read so too,
    since another client may have written any length straight into Redis.
    """
    line = str(message)
    if not line.isascii():  # a lone surrogate (a file name os.listdir decoded) as its escape, not an error
        line = line.encode("utf-8", "backslashreplace").decode("utf-8")
    return line if len(line) <= MAX_LOG_LINE_CHARS else line[:MAX_LOG_LINE_CHARS - 1] + "…"


def cut_text(text: str, limit: int) -> str:
    """`text` cut to `limit` bytes of UTF-8 at a character's start, saying how long it was (as includes/workflow.lua's
    cutText cuts a failure reason)."""
    encoded = text.encode("utf-8", "backslashreplace")
    if len(encoded) <= limit:
        return text
    return encoded[:limit].decode("utf-8", "ignore") + f" [cut: {len(encoded)} bytes]"


# (A delay other than 0 makes options of their own: the cache holds the latest few hundred.)
# typed: True and 1 hash alike, but only 1 is a number of attempts (the options check each anew).
_overridden = functools.lru_cache(maxsize=512, typed=True)(JobOptions._override)


@functools.lru_cache(maxsize=256)
def _encoded_options(options: JobOptions) -> str:
    return encode_json(options.to_json(), "opts")


# Built once: json.dumps with any non-default option builds an encoder per call.
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def encode_json(value: Any, what: str, max_bytes: int | None = None) -> str:
    """Serialize `value` as compact JSON, or raise PayloadError saying why not.

    Refused besides what JSON cannot hold: nesting deeper than MAX_JSON_DEPTH
    and strings that are not valid Unicode (lone surrogates), which Redis and
    the database could not store either.
    """
    too_deep = f"{what} is nested more than {MAX_JSON_DEPTH} levels deep"
    try:
        text = _JSON.encode(value)
    except RecursionError:
        raise PayloadError(too_deep) from None
    except (TypeError, ValueError) as error:
        raise PayloadError(f"{what} must be JSON-serializable: {error}") from None
    # Counting brackets is cheap and bounds the depth from above; only a text
    # with many of them is walked.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and deeper_than(value, MAX_JSON_DEPTH):
        raise PayloadError(too_deep)
    size = len(text)
    if not text.isascii():
        try:
            size = len(text.encode())
        except UnicodeEncodeError as error:
            raise PayloadError(f"{what} is not valid Unicode: {error.reason} at {error.start}") from None
    if max_bytes is not None and size > max_bytes:
        raise PayloadError(f"{what} is {size} bytes of JSON; the limit is {max_bytes}")
    return text


def deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and dicts nest more than `limit` levels in `value` (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, (list, tuple)) else ()
        for child in children:
            if isinstance(child, (dict, list, tuple)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False
