"""A job's own options as a call gives them (an eta, expires, time limits in seconds), checked and put in ms.

Shared by @job's enqueue (jobs.py), the Tasks backend and the schedules; each raises PayloadError for a value
that cannot be, before anything is sent.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, tzinfo
from typing import Any

from django.conf import settings
from django.utils import timezone

from .core import MAX_DELAY_MS, JobOptions, PayloadError, delay_until
from .settings_values import MAX_SECONDS

_NO_TIME_LIMITS: dict[str, int | None] = {"time_limit_ms": None, "soft_time_limit_ms": None}


def time_limits_ms(time_limit: Any, soft_time_limit: Any) -> dict[str, int | None]:
    """A job's own time limits, given in seconds, as JobOptions.overridden takes them (None: the queue's).

    PayloadError for a limit that is not a positive number of seconds up to ten
    years, or a soft limit not shorter than the hard one.
    """
    if time_limit is None and soft_time_limit is None:
        return _NO_TIME_LIMITS  # most jobs: nothing to check (callers only unpack it)
    limits: dict[str, int | None] = {}
    for key, what, seconds in (("time_limit_ms", "time_limit", time_limit),
                               ("soft_time_limit_ms", "soft_time_limit", soft_time_limit)):
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not 0 < seconds <= MAX_DELAY_MS / 1000 or not math.isfinite(seconds)):
            raise PayloadError(f"{what} must be a positive number of seconds up to ten years, or None, "
                               f"not {seconds!r}")
        limits[key] = None if seconds is None else max(1, round(seconds * 1000))
    JobOptions(time_limit_ms=limits["time_limit_ms"] or 0,
               soft_time_limit_ms=limits["soft_time_limit_ms"] or 0)  # the soft limit is the shorter
    return limits


def own_time_limits_ms(target: Any) -> dict[str, int | None]:
    """The time limits (ms, for JobOptions.overridden) a @job function or an EchoMQTask sets for its jobs."""
    return time_limits_ms(getattr(target, "time_limit", None), getattr(target, "soft_time_limit", None))


def naive_zone() -> tzinfo | None:
    """The zone a naive datetime (an eta, a run_after) is in, for core.delay_until: TIME_ZONE when USE_TZ is
    False, as Django reads one; None (it is refused) with USE_TZ, where a naive datetime is a mistake."""
    return None if settings.USE_TZ else timezone.get_current_timezone()


def expiry_ms(expires: float | timedelta | datetime | None, from_ms: int) -> int:
    """ms from `from_ms` (the job's creation) past which it never starts: `expires` in seconds, a timedelta, or a
    datetime (as for an eta); 0 for None. PayloadError for anything not ahead of `from_ms`."""
    if expires is None:
        return 0
    if isinstance(expires, datetime):
        ms = delay_until(expires, from_ms, naive_zone())
        if ms <= 0:
            raise PayloadError(f"expires {expires.isoformat()} is in the past: the job could never run")
        return ms
    seconds = expires.total_seconds() if isinstance(expires, timedelta) else expires
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS:
        raise PayloadError(f"expires is a positive number of seconds (up to ten years), a timedelta or a datetime, "
                           f"not {expires!r}")
    return math.ceil(seconds * 1000)
