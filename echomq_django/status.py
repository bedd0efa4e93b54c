"""What `echomq_status` and the admin's dashboard show of a queue, read the same way for both."""

from __future__ import annotations

import math
import time
from typing import Any

from redis.exceptions import ResponseError

from .core import QueueStateError, last_sweep
from .queues import get_queue


def queue_status(name: str) -> dict[str, Any]:
    """Everything the status shows for one queue, as plain data; `error` instead when a key is broken."""
    queue = get_queue(name)
    try:
        return {"queue": name, "paused": queue.is_paused(), "counts": queue.counts(),
                "last_sweep": last_sweep(queue.client, queue.keys)}
    except (QueueStateError, ResponseError) as error:  # a key another client gave another Redis type
        return {"queue": name, "error": str(error)}


def describe_sweep(sweep: Any) -> str:
    """The last sweep report in one line."""
    if not sweep:
        return "never"
    # The report is JSON any client may have written: a field missing or of
    # another type makes it unreadable, not the status.
    try:
        return (f"{seconds_since(sweep):.0f} s ago on {sweep['host']}: marked {sweep['marked']}, "
                f"recovered {sweep['recovered']}, failed {sweep['failed']}")
    except (KeyError, TypeError, ValueError):
        return "unreadable report"


def seconds_since(sweep: dict[str, Any]) -> float:
    """Seconds since a sweep report's sweep ended; ValueError, KeyError or TypeError when it says no time."""
    finished_s = float(sweep["finished_at_ms"]) / 1000
    if not math.isfinite(finished_s):
        raise ValueError(finished_s)
    return max(0.0, time.time() - finished_s)
