"""Every Redis key name of the protocol is built here and nowhere else."""

import re
from dataclasses import dataclass

from .errors import InvalidNameError

MAX_NAME_LENGTH = 128

# Printable, no whitespace, no control characters, and none of "{", "}" (the
# cluster hash tag) or ":" (the key separator).
_NAME = re.compile(r"[^\s{}:\x00-\x1f\x7f]+")

# Job hashes live beside the queue's own keys (emq:{q}:<id>), so a caller's id
# may not be one of these names. Digit-only ids are reserved for generated ids.
RESERVED_IDS = frozenset(
    {"wait", "paused", "active", "stalled", "failed", "completed", "delayed", "prioritized",
     "stalled-check", "meta", "marker", "id", "events", "locks"}
)


def validate_name(value: object, what: str) -> str:
    """Return `value` if it may be part of a key, else raise InvalidNameError."""
    if not isinstance(value, str):
        raise InvalidNameError(f"{what} must be a string, not {type(value).__name__}")
    if not value:
        raise InvalidNameError(f"{what} must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidNameError(
            f"{what} is {len(value)} characters long; the limit is {MAX_NAME_LENGTH}"
        )
    if not _NAME.fullmatch(value):
        raise InvalidNameError(
            f"{what} {value!r} may not contain '{{', '}}', ':', whitespace or control characters"
        )
    return value


def validate_job_id(job_id: object) -> str:
    """Return a caller-chosen job id if it is valid, else raise InvalidNameError."""
    job_id = validate_name(job_id, "job id")
    if job_id in RESERVED_IDS:
        raise InvalidNameError(f"job id {job_id!r} is reserved for a queue key")
    if job_id.isdigit():
        raise InvalidNameError(
            f"job id {job_id!r} is all digits; such ids are reserved for generated ids"
        )
    return job_id


@dataclass(frozen=True)
class QueueKeys:
    """The key names of one queue; all share the `{queue}` hash tag (one cluster slot)."""

    queue: str
    prefix: str = "emq"

    def __post_init__(self) -> None:
        validate_name(self.queue, "queue name")
        validate_name(self.prefix, "key prefix")

    @property
    def base(self) -> str:
        """The common start of every key of this queue, as scripts receive it."""
        return f"{self.prefix}:{{{self.queue}}}:"

    @property
    def wait(self) -> str:
        return self.base + "wait"

    @property
    def paused(self) -> str:
        return self.base + "paused"

    @property
    def active(self) -> str:
        return self.base + "active"

    @property
    def stalled(self) -> str:
        return self.base + "stalled"

    @property
    def failed(self) -> str:
        return self.base + "failed"

    @property
    def completed(self) -> str:
        return self.base + "completed"

    @property
    def delayed(self) -> str:
        return self.base + "delayed"

    @property
    def prioritized(self) -> str:
        return self.base + "prioritized"

    @property
    def locks(self) -> str:
        """The lock index: each active id scored by when its lock lapses unless renewed."""
        return self.base + "locks"

    @property
    def stalled_check(self) -> str:
        return self.base + "stalled-check"

    @property
    def meta(self) -> str:
        return self.base + "meta"

    @property
    def marker(self) -> str:
        return self.base + "marker"

    @property
    def id_counter(self) -> str:
        return self.base + "id"

    @property
    def events(self) -> str:
        return self.base + "events"

    def job(self, job_id: str) -> str:
        return self.base + job_id

    def lock(self, job_id: str) -> str:
        return self.base + job_id + ":lock"
