"""A job's options (attempts, backoff, delay, priority, retention, time limits...) and the bounds of its numbers.

The Lua scripts get the bounds from here (core/protocol/lua.py's generated include "constants"), so a value one
side refuses is never used by the other.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import defaults
from ..errors import InvalidNameError, PayloadError
from .codec import encode_json
from .keys import validate_name

# The bounds of the numbers a job may carry. The Lua scripts get them from
# here (core/protocol/lua.py's generated include "constants"), so a value one side refuses
# is never used by the other.
MAX_ATTEMPTS = 1_000_000
MIN_PRIORITY, MAX_PRIORITY = -100, 100  # higher runs first


MAX_DELAY_MS = 10 * 365 * 86_400_000  # ten years: any delay or backoff, exact in a double


# The latest creation time a producer may give a job: it plus the longest delay is still exact in a double.
MAX_TIMESTAMP_MS = 2**53 - 1 - MAX_DELAY_MS


def whole_number(value: Any, what: str, low: int, high: int) -> int:
    """`value` if it is a whole number from `low` to `high` (an integral float counts), else PayloadError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PayloadError(f"{what} must be a whole number from {low} to {high}, not {value!r}")
    return value


@dataclass(frozen=True)
class Backoff:
    """How long to wait before retrying a failed attempt.

    `max_ms` caps an exponential wait (0: MAX_DELAY_MS), and `jitter` picks the wait at random
    from 0 to that wait, as Celery's retry_jitter does, so that jobs failing together do not
    all come back at the same moment.
    """

    kind: str = "fixed"  # "fixed" or "exponential"
    delay_ms: int = 0
    max_ms: int = 0
    jitter: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "exponential"):
            raise PayloadError(f"backoff type must be 'fixed' or 'exponential', not {self.kind!r}")
        object.__setattr__(self, "delay_ms", whole_number(self.delay_ms, "backoff delay (ms)", 0, MAX_DELAY_MS))
        object.__setattr__(self, "max_ms", whole_number(self.max_ms, "backoff max (ms)", 0, MAX_DELAY_MS))
        if not isinstance(self.jitter, bool):
            raise PayloadError(f"backoff jitter is True or False, not {self.jitter!r}")

    def delay_before(self, attempts_made: int) -> int:
        """The wait (ms) before the next attempt, after `attempts_made` attempts (at most MAX_DELAY_MS)."""
        wait = self.delay_ms
        if self.kind == "exponential":
            # The exponent is capped first: 2 ** (a huge attempt count) would hold the interpreter.
            factor: int = 2 ** min(max(attempts_made - 1, 0), 64)
            wait = min(self.delay_ms * factor, self.max_ms or MAX_DELAY_MS)
        return random.randint(0, wait) if self.jitter else wait

    def to_json(self) -> dict[str, Any]:
        shape: dict[str, Any] = {"type": self.kind, "delay": self.delay_ms}
        if self.max_ms:
            shape["max"] = self.max_ms
        if self.jitter:
            shape["jitter"] = True
        return shape

    @classmethod
    def from_json(cls, value: Any) -> Backoff:
        if value is None:
            return cls()
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return cls("fixed", value)  # type: ignore[arg-type]  # an integral float is made whole
        if isinstance(value, Mapping):
            return cls(str(value.get("type", "fixed")), value.get("delay", 0), value.get("max", 0),
                       value.get("jitter", False))
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


def options_from_json(value: Any) -> JobOptions:
    """JobOptions from decoded `opts` JSON; the defaults when it is malformed."""
    try:
        return JobOptions.from_json(value if isinstance(value, Mapping) else {})
    except PayloadError:
        return JobOptions()


# (A delay other than 0 makes options of their own: the cache holds the latest few hundred.)
# typed: True and 1 hash alike, but only 1 is a number of attempts (the options check each anew).
_overridden = functools.lru_cache(maxsize=512, typed=True)(JobOptions._override)


@functools.lru_cache(maxsize=256)
def _encoded_options(options: JobOptions) -> str:
    return encode_json(options.to_json(), "opts")
