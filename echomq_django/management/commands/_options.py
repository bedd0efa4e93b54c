"""Argument types and start-up helpers shared by the echomq management commands."""

import signal
from collections.abc import Callable

from django.core.management.base import CommandError

from echomq_django.conf import get_settings
from echomq_django.core import UNREACHABLE
from echomq_django.queues import check_redis


def positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
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
        raise CommandError(f"cannot reach Redis at {url}: {error}") from None
    for warning in warnings:
        warn(f"WARNING: {warning}")


def on_stop_signals(stop: Callable[[], None]) -> None:
    """Call `stop` on every SIGINT and SIGTERM (the callee counts them: two stages)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop())
