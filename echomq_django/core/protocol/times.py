"""Time as the protocol writes it: milliseconds since the epoch, and the conversions to and from datetimes."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, tzinfo

from ..errors import PayloadError


def now_ms() -> int:
    """This host's clock, in the protocol's unit (ms since the epoch)."""
    return int(time.time() * 1000)


def seconds_text(ms: int) -> str:
    """ms as seconds, as written in settings: "0.25", "30", "31536000" (never an exponent)."""
    return f"{ms / 1000:.3f}".rstrip("0").rstrip(".")


def delay_until(moment: datetime | None, from_ms: int, naive_zone: tzinfo | None = None) -> int:
    """The delay (ms) from `from_ms` to `moment` (a run-after, an eta); 0 without one or once it has passed.

    A naive datetime is taken in `naive_zone` when one is given (Django's TIME_ZONE, when USE_TZ is False);
    without one it is refused (PayloadError): which zone it means is a guess, and a wrong guess is hours.
    """
    if moment is None:
        return 0
    if not isinstance(moment, datetime):
        raise PayloadError(f"a time to run at is a datetime, not {moment!r}")
    if naive_zone is not None and (moment.tzinfo is None or moment.utcoffset() is None):
        moment = moment.replace(tzinfo=naive_zone)
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise PayloadError(f"a time to run at needs a time zone (an aware datetime), not {moment.isoformat()}")
    return max(0, math.ceil(moment.timestamp() * 1000) - from_ms)


def datetime_from_ms(ms: int | None) -> datetime | None:
    """An aware UTC datetime from a protocol timestamp (ms), or None."""
    if not ms:
        return None
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):  # out of datetime's range: a hash another client wrote
        return None
