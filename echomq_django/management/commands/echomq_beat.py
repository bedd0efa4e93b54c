"""`manage.py echomq_beat`: the scheduler, which adds each tick of each schedule as one job."""

import contextlib
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connections

from echomq_django.command_output import echomq_logs_shown
from echomq_django.conf import get_settings
from echomq_django.core import Beat, Firing, RecordedSignals, run_until_signalled, transient
from echomq_django.jobs import discover_jobs
from echomq_django.queues import SCHEDULER_CALL_TIMEOUT_S, scheduler_client
from echomq_django.schedules import load_schedules

from ._options import CommandRunner, connect_or_fail, positive_seconds


class Command(BaseCommand):
    help = (
        "Fire the schedules of ECHOMQ['SCHEDULES'] and of the admin: each tick becomes one job, however many "
        "echomq_beat processes run, on however many hosts."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--once", action="store_true",
                            help="Fire what is due now (the newest tick of each schedule, once), then exit.")
        parser.add_argument(
            "--interval", type=positive_seconds, default=5.0, metavar="SECONDS",
            help="Seconds between readings of the schedules: a change in the admin takes effect within this "
                 "(default: %(default)g).")

    def handle(self, *, once: bool, **options: Any) -> None:
        # The loop's signals are recorded from here on: one during start-up stops it as soon as it runs.
        with contextlib.nullcontext() if once else RecordedSignals() as recorded:
            self.fire(recorded, once=once, **options)

    def fire(self, recorded: RecordedSignals | None, *, once: bool, interval: float, verbosity: int,
             **options: Any) -> None:
        discover_jobs()  # the @job functions schedules name, as the worker imports them
        settings = get_settings()
        client, scripts = scheduler_client()
        beat = Beat(client, load_schedules, prefix=settings.prefix, scripts=scripts,
                    reload_interval_ms=max(1, round(interval * 1000)), max_payload_bytes=settings.max_payload_bytes,
                    call_timeout_ms=round(SCHEDULER_CALL_TIMEOUT_S * 1000), close_reader=connections.close_all,
                    queues=settings.queues)  # where a schedule moved from may have its record
        connect_or_fail(lambda message: self.stderr.write(self.style.WARNING(message)))

        def report(firing: Firing) -> None:
            # A tick another scheduler decided is routine when several run; news at -v 2.
            if verbosity >= 2 or (verbosity >= 1 and (firing.decided or once)):
                self.stdout.write(firing.summary())

        with echomq_logs_shown(self, verbosity):
            try:
                beat.reload()
            except DatabaseError as error:
                raise CommandError(f"cannot read the schedules in the database ({error}); "
                                   "has `manage.py migrate` run?") from None
            if verbosity >= 1:
                self.stdout.write(f"{len(beat.schedules)} schedule(s): " + (", ".join(
                    f"{schedule.name} ({schedule.describe()} -> {schedule.queue})"
                    for schedule in beat.schedules.values()) or "none (add ECHOMQ['SCHEDULES'] or rows in the "
                                                                "admin)"))
            if once:
                try:
                    for firing in beat.fire_due():
                        report(firing)
                except Exception as error:
                    if not transient(error):
                        raise
                    raise CommandError(f"cannot reach Redis: {error}") from None
                return
            run_until_signalled(CommandRunner(lambda: beat.run(report), beat), grace_s=0, recorded=recorded)
