"""Argument types and start-up helpers shared by the echomq management commands."""

import contextlib
import math
import signal
from collections.abc import Callable, Iterator

from django.core.management.base import CommandError

from echomq_django.conf import get_settings
from echomq_django.core import UNREACHABLE, redacted_url
from echomq_django.queues import check_redis

MAX_SECONDS = 10 * 365 * 86_400  # ten years, as for delays: anything longer is a mistake


def positive_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= MAX_SECONDS or not math.isfinite(value):
        raise ValueError(text)
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def connect_or_fail(warn: Callable[[str], None]) -> None:
    """Check Redis before a long-running command starts: a clear error, or its warnings."""
    url = get_settings().redis_url
    try:
        warnings = check_redis()
    except UNREACHABLE as error:
        raise CommandError(f"cannot reach Redis at {redacted_url(url)}: {error}") from None
    for warning in warnings:
        warn(f"WARNING: {warning}")


@contextlib.contextmanager
def on_stop_signals(stop: Callable[[], None]) -> Iterator[None]:
    """Inside the block, call `stop` on every SIGINT and SIGTERM (the callee counts them: two stages).

    The handlers from before come back when the block ends, so a command run
    with call_command leaves the process's own signal handling as it was.
    """
    signals = (signal.SIGINT, signal.SIGTERM)
    before = [signal.getsignal(signum) for signum in signals]
    for signum in signals:
        signal.signal(signum, lambda *_: stop())
    try:
        yield
    finally:
        for signum, handler in zip(signals, before):
            signal.signal(signum, handler)
