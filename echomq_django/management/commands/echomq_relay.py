"""`manage.py echomq_relay`: send the outbox's rows that their committing process did not (see outbox/)."""

import contextlib
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from echomq_django.command_output import echomq_logs_shown
from echomq_django.core import RecordedSignals, run_until_signalled
from echomq_django.outbox import RELAY_AFTER_S, RELAY_INTERVAL_S, Relay, relayed

from ._options import CommandRunner, connect_or_fail, non_negative_seconds, positive_seconds


class Command(BaseCommand):
    help = (
        "Relay the transactional outbox: send to Redis the jobs committed with their transaction whose "
        "process did not send them (Redis was away, the process died). echomq_sweep does the same unless "
        "run with --no-relay; any number of relays may run at once."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true", help="Relay what is there, then exit.")
        parser.add_argument(
            "--interval", type=positive_seconds, default=RELAY_INTERVAL_S, metavar="SECONDS",
            help=f"Seconds between passes (default {RELAY_INTERVAL_S:g}).",
        )
        parser.add_argument(
            "--after", type=non_negative_seconds, default=RELAY_AFTER_S, metavar="SECONDS",
            help=f"Relay rows at least this old; younger ones are their process's to send "
                 f"(default {RELAY_AFTER_S:g}; 0: every row now, a row its process is sending too, "
                 f"which adds its job once).",
        )

    def handle(self, *, once: bool, interval: float, after: float, verbosity: int, **options: Any) -> None:
        with contextlib.nullcontext() if once else RecordedSignals() as recorded:
            connect_or_fail(lambda message: self.stderr.write(self.style.WARNING(message)))
            relay = Relay(interval_s=interval, after_s=after)
            with echomq_logs_shown(self, verbosity):
                if once:
                    relayed(self, relay.run_once(), verbosity)
                    return
                if verbosity >= 1:
                    self.stdout.write(f"relaying the outbox every {interval:g} s (rows older than {after:g} s)")
                run_until_signalled(CommandRunner(relay.run, relay), grace_s=0, recorded=recorded)
