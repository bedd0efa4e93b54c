"""Jobs as typed Python objects, and the codec to and from the Redis job hash."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from .errors import PayloadError

DEFAULT_ATTEMPTS = 3


@dataclass(frozen=True)
class Backoff:
    """How long to wait before retrying a failed attempt."""

    kind: str = "fixed"  # "fixed" or "exponential"
    delay_ms: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "exponential"):
            raise PayloadError(f"backoff type must be 'fixed' or 'exponential', not {self.kind!r}")
        if not isinstance(self.delay_ms, int) or self.delay_ms < 0:
            raise PayloadError(f"backoff delay must be a whole number of ms >= 0, not {self.delay_ms!r}")

    def delay_before(self, attempts_made: int) -> int:
        """The wait (ms) before the next attempt, after `attempts_made` attempts."""
        if self.kind == "exponential":
            return self.delay_ms * 2 ** max(attempts_made - 1, 0)
        return self.delay_ms

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, "delay": self.delay_ms}

    @classmethod
    def from_json(cls, value: Any) -> Backoff:
        if value is None:
            return cls()
        if isinstance(value, int):
            return cls("fixed", value)
        if isinstance(value, Mapping):
            return cls(str(value.get("type", "fixed")), value.get("delay", 0))
        raise PayloadError(f"backoff must be a number of ms or {{type, delay}}, not {value!r}")


@dataclass(frozen=True)
class JobOptions:
    """Per-job options, stored as the job's `opts` JSON."""

    attempts: int = DEFAULT_ATTEMPTS
    backoff: Backoff = field(default_factory=Backoff)
    delay_ms: int = 0
    priority: int = 0  # -100..100; higher runs first

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or self.attempts < 1:
            raise PayloadError(f"attempts must be a whole number >= 1, not {self.attempts!r}")
        if not isinstance(self.priority, int) or not -100 <= self.priority <= 100:
            raise PayloadError(f"priority must be a whole number from -100 to 100, not {self.priority!r}")
        if not isinstance(self.delay_ms, int) or self.delay_ms < 0:
            raise PayloadError(f"delay must be a whole number of ms >= 0, not {self.delay_ms!r}")

    def overridden(self, *, attempts: int | None = None, backoff: Backoff | None = None,
                   delay_ms: int = 0, priority: int = 0) -> JobOptions:
        """These options as defaults, with a job's own attempts and backoff where it has them."""
        return JobOptions(attempts=attempts or self.attempts, backoff=backoff or self.backoff,
                          delay_ms=delay_ms, priority=priority)

    def to_json(self) -> dict[str, Any]:
        """The options as stored; defaults other than `attempts` are left out, to keep jobs small."""
        value: dict[str, Any] = {"attempts": self.attempts}
        if self.backoff != Backoff():
            value["backoff"] = self.backoff.to_json()
        if self.delay_ms:
            value["delay"] = self.delay_ms
        if self.priority:
            value["priority"] = self.priority
        return value

    def encoded(self) -> str:
        """`to_json` as JSON text, worked out once per options object."""
        return _encoded_options(self)

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> JobOptions:
        return cls(
            attempts=int(value.get("attempts", DEFAULT_ATTEMPTS)),
            backoff=Backoff.from_json(value.get("backoff")),
            delay_ms=int(value.get("delay", 0)),
            priority=int(value.get("priority", 0)),
        )


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
    except (TypeError, ValueError):
        return JobOptions()


@functools.lru_cache(maxsize=256)
def _options_from_text(text: str | None) -> JobOptions:
    """The options in an `opts` field; jobs of one kind share the text, so each text is decoded once."""
    return options_from_json(_json(text, {}))


def _json(value: str | None, default: Any) -> Any:
    if value in (None, ""):
        return default
    try:
        return json.loads(value)
    except ValueError:
        return value  # not JSON: shown as the text it is


@dataclass
class Job:
    """One job, as read from its hash. Redis stays the source of truth."""

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

    @classmethod
    def from_hash(cls, queue: str, job_id: str, fields: Mapping[str, str]) -> Job:
        """Decode a job hash (as HGETALL returns it, strings) into a Job."""
        return cls(
            queue=queue,
            id=job_id,
            name=fields.get("name", ""),
            data=_json(fields.get("data"), None),
            opts=_options_from_text(fields.get("opts")),
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
        )

    @classmethod
    def from_flat(cls, queue: str, job_id: str, flat: list[str]) -> Job:
        """Decode the flat field/value list a script returns."""
        return cls.from_hash(queue, job_id, dict(zip(flat[::2], flat[1::2])))


def datetime_from_ms(ms: int | None) -> datetime | None:
    """An aware UTC datetime from a protocol timestamp (ms), or None."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc) if ms else None


@functools.lru_cache(maxsize=256)
def _encoded_options(options: JobOptions) -> str:
    return encode_json(options.to_json(), "opts")


def encode_json(value: Any, what: str, max_bytes: int | None = None) -> str:
    """Serialize `value` as compact JSON, or raise PayloadError saying why not."""
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise PayloadError(f"{what} must be JSON-serializable: {error}") from None
    if max_bytes is not None and len(text.encode()) > max_bytes:
        raise PayloadError(
            f"{what} is {len(text.encode())} bytes of JSON; the limit is {max_bytes}"
        )
    return text
