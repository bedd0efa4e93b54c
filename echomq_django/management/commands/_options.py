"""Argument types and start-up helpers shared by the echomq management commands."""

import math
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError
from django.db import connections

from echomq_django.conf import get_settings
from echomq_django.core import UNREACHABLE, Runner, redacted_url
from echomq_django.queues import check_redis

MAX_SECONDS = 10 * 365 * 86_400  # ten years, as for delays: anything longer is a mistake


def positive_seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= MAX_SECONDS or not math.isfinite(value):
        raise ValueError(text)
    return value


def non_negative_seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value <= MAX_SECONDS or not math.isfinite(value):
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


class CommandRunner:
    """A runner for run_until_signalled (core/worker/signals.py): `run` on a thread of its own, the stop and abort.

    That thread's Django database connections are its own: they are closed when
    `run` ends (outside a transaction the caller holds, a test's, say).
    """

    def __init__(self, run: Callable[[], Any], runner: Runner) -> None:
        self._run, self.stop, self.abort = run, runner.stop, runner.abort

    def run(self) -> Any:
        try:
            return self._run()
        finally:
            connections.close_all()
