"""JSON and text as the protocol stores them: encoded once, bounded, and decoded without trusting the writer.

A job's fields may have been written by another client: every decode of stored JSON is here (a test keeps
bare json.loads out of the rest of the package), and each says how it fails: decode_stored raises only
ValueError, lenient_json never raises (a field is shown as what it holds), strict_json raises PayloadError
(a job that is about to run).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import PayloadError

# Deeper JSON than this is refused at enqueue: SQLite's JSON functions (the
# admin's mirror) stop at 1,000 levels, Python's decoder near its recursion
# limit, and no real payload comes close.
MAX_JSON_DEPTH = 100

# A log line is a line: this bounds what a chatty job can put in Redis (as MAX_PROGRESS_BYTES does, job.py).
MAX_LOG_LINE_CHARS = 10_000


# What a reader keeps of a field nested deeper than MAX_JSON_DEPTH, which only
# another client can have written: its text, cut here (see TooDeep).
TOO_DEEP_CHARS = 10_000


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


def lenient_json(value: str | None, default: Any) -> Any:
    """A stored field decoded for reading: `default` when empty, the text itself when not JSON, TooDeep when nested
    past MAX_JSON_DEPTH. Never raises: a job stays viewable, and removable, whatever another client wrote."""
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


def strict_json(value: str | None, what: str) -> Any:
    """Decoded JSON for a job that is about to run; PayloadError when it cannot be decoded."""
    if value in (None, ""):
        return None
    try:
        return json.loads(value)
    except RecursionError:
        raise PayloadError(f"{what} is nested too deeply to decode") from None
    except ValueError as error:
        raise PayloadError(f"{what} is not JSON: {error}") from None


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
