"""`manage.py echomq_sweep`: run the two-phase stalled-job sweep."""

import signal
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import ConnectionError as RedisConnectionError

from echomq_django.conf import echomq_setting
from echomq_django.core import InvalidNameError, QueueStateError, Sweeper, connect
from echomq_django.core.sweeper import DEFAULT_INTERVAL_MS, DEFAULT_MAX_STALLED_COUNT


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


class Command(BaseCommand):
    help = (
        "Mark active jobs whose lock is gone, and recover (to wait, or to failed past their "
        "ceiling) those marked by an earlier sweep that are still lockless."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue", action="append", dest="queues", metavar="NAME",
            help="Queue to sweep; repeat for several (default: the configured queues).",
        )
        parser.add_argument("--once", action="store_true", help="Sweep each queue once, then exit.")
        parser.add_argument(
            "--interval", type=positive_seconds, default=DEFAULT_INTERVAL_MS / 1000,
            metavar="SECONDS",
            help="Seconds between sweeps, and how long the gate stays closed (default: %(default)r).",
        )
        parser.add_argument(
            "--force", action="store_true",
            help="Ignore the gate: sweep even if another sweeper ran within the interval.",
        )
        parser.add_argument(
            "--max-stalled-count", type=non_negative_int, default=DEFAULT_MAX_STALLED_COUNT,
            metavar="N", help="Stalls a job may survive before it is failed (default: %(default)r).",
        )

    def handle(
        self, *, queues: list[str] | None, once: bool, interval: float, force: bool,
        max_stalled_count: int, **options: Any,
    ) -> None:
        names = queues or list(echomq_setting("QUEUES"))
        client = connect(echomq_setting("REDIS_URL"))
        try:
            sweeper = Sweeper(
                client, names, prefix=echomq_setting("PREFIX"),
                interval_ms=max(1, round(interval * 1000)), max_stalled_count=max_stalled_count,
            )
        except InvalidNameError as error:
            raise CommandError(str(error)) from None
        try:
            if once:
                for report in sweeper.sweep_all(force=force):
                    self.stdout.write(report.summary())
                return
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: sweeper.stop())
            sweeper.run(lambda report: self.stdout.write(report.summary()), force=force)
        except RedisConnectionError as error:
            raise CommandError(f"cannot reach Redis at {echomq_setting('REDIS_URL')}: {error}") from None
        except QueueStateError as error:
            raise CommandError(str(error)) from None
