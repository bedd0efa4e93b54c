"""What a producer hands the queue: a job to add (NewJob), how it is deduplicated (Dedupe), and the job checked
and encoded as addJob takes it (EncodedJob, what an outbox row stores)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import PayloadError
from ..protocol.options import MAX_DELAY_MS, JobOptions, whole_number

# The longest dedupe key (it becomes part of a Redis key, dedupe:<key>).
MAX_DEDUPE_KEY = 200


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _encodable(text: str) -> bool:
    """Whether `text` is valid Unicode (a lone surrogate is not: redis-py could not send it)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Dedupe:
    """How an add is deduplicated by `key` (lua/includes/dedupe.lua).

    By default, while a job added with the key is waiting, delayed or active, an add with the key adds
    nothing and answers with that job's id. `ttl_ms`: the key holds that long whatever the job does (a
    throttle). `debounce_ms`: the job waits that window, and an add within it pushes its start back to a
    window from then, with the new data (`keep_first`: the first data stays).
    """

    key: str
    ttl_ms: int = 0
    debounce_ms: int = 0
    keep_first: bool = False

    def __post_init__(self) -> None:
        if (not isinstance(self.key, str) or not 1 <= len(self.key) <= MAX_DEDUPE_KEY or _CONTROL.search(self.key)
                or not _encodable(self.key)):
            raise PayloadError(f"a dedupe key is text of 1 to {MAX_DEDUPE_KEY} characters without control "
                               f"characters, not {self.key!r:.80}")
        whole_number(self.ttl_ms, "dedupe TTL (ms)", 0, MAX_DELAY_MS)
        whole_number(self.debounce_ms, "debounce window (ms)", 0, MAX_DELAY_MS)
        if self.ttl_ms and self.debounce_ms:
            raise PayloadError("a dedupe key is held until the job ends, for a TTL, or for a debounce window: "
                               "give a TTL or a debounce window, not both")
        if self.keep_first and not self.debounce_ms:
            raise PayloadError("keep_first is for a debounce (debounce_ms)")

    @property
    def mode(self) -> str:
        if self.ttl_ms:
            return "ttl"
        if self.debounce_ms:
            return "debounce-keep" if self.keep_first else "debounce"
        return ""


@dataclass(frozen=True)
class NewJob:
    """One job to add with `Queue.add_bulk`."""

    name: str
    data: Any = None
    opts: JobOptions | None = None
    job_id: str | None = None
    dedupe: Dedupe | None = None


class EncodedJob(NamedTuple):
    """A job validated and encoded as addJob takes it, its fields in the order of its ARGV (Queue.encode)."""

    job_id: str  # "" for an id Redis generates
    name: str
    data: str  # JSON
    opts: str  # JSON
    delay_ms: int
    priority: int
    group: str
    expires_ms: int = 0  # 0: never expires
    dedupe: str = ""  # the dedupe key ("": none), its mode and its ms (see Dedupe)
    dedupe_mode: str = ""
    dedupe_ms: int = 0
