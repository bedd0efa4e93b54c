"""Argument types and start-up helpers shared by the echomq management commands."""

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator

from django.core.management.base import CommandError
from django.db import connections

from echomq_django.conf import get_settings
from echomq_django.core import UNREACHABLE, redacted_url
from echomq_django.queues import check_redis

MAX_SECONDS = 10 * 365 * 86_400  # ten years, as for delays: anything longer is a mistake
# How long a worker has after a second stop signal to write the results it holds before the command
# leaves without them (the beat and the sweeper have nothing to write: they leave at once).
SECOND_STOP_GRACE_S = 2.0


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


def run_stoppable(work: Callable[[], None], stop: Callable[[], None], *, second_stop_grace_s: float) -> None:
    """Run `work` on a thread of its own to its end, calling `stop` on every SIGINT and SIGTERM meanwhile.

    Two stages, as every long-running command has them: the first signal asks
    the work to finish what it is doing; after a second, the work has
    `second_stop_grace_s` to return, then SystemExit(0) leaves it behind (a
    call waiting out a Redis outage, or a frozen Redis, would hold the exit
    for minutes).

    Python runs signal handlers on the main thread, between two of its steps.
    A `stop` that sets an Event the main thread itself was waiting on can land
    while the interrupted wait holds the Event's lock, and then waits for it
    forever; so the main thread here only joins, and a signal that lands in
    the handler of another leaves its stop to that handler. What `work`
    raises is raised here. The work's database writes are its thread's own:
    outside a transaction the caller holds (a test's, say).
    """
    raised: list[BaseException] = []
    signals: list[float] = []  # time.monotonic() of each stop signal
    owed: list[None] = []  # stops asked for and not yet made

    def on_signal() -> None:
        signals.append(time.monotonic())
        owed.append(None)
        if len(owed) > 1:
            # This signal interrupted the handler of an earlier one inside `stop`, which may hold a
            # lock `stop` takes again: that handler makes this stop too, once its own returns.
            return
        while owed:
            stop()
            owed.pop()

    def target() -> None:
        try:
            work()
        except BaseException as error:  # raised on the main thread below
            raised.append(error)
        finally:
            connections.close_all()  # this thread's own (Django's connections are per thread)

    thread = threading.Thread(target=target, name="echomq-command", daemon=True)
    with on_stop_signals(on_signal):
        thread.start()
        while thread.is_alive():
            thread.join(0.1)
            if len(signals) > 1 and time.monotonic() - signals[1] > second_stop_grace_s:
                raise SystemExit(0)
    if raised:
        raise raised[0]
