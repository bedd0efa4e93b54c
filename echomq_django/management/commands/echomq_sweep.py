"""`manage.py echomq_sweep`: run the two-phase stalled-job sweep."""

import contextlib
import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, close_old_connections

from echomq_django.command_output import echomq_logs_shown
from echomq_django.core import (
    UNREACHABLE,
    InvalidNameError,
    QueueStateError,
    RecordedSignals,
    SweepReport,
    last_sweep,
    run_until_signalled,
)
from echomq_django.durable import forget_rows
from echomq_django.mirror import sync_queue
from echomq_django.outbox import Relay, outbox_in_use, relayed
from echomq_django.queues import get_queue, make_sweeper, queue_names
from echomq_django.status import seconds_since

from ._options import CommandRunner, connect_or_fail, non_negative_int, positive_seconds

logger = logging.getLogger("echomq.sweeper")


class Command(BaseCommand):
    help = (
        "Mark active jobs whose lock is gone, and recover (to wait, or to failed past their "
        "ceiling) those marked by an earlier sweep that are still lockless."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue", action="append", dest="queues", metavar="NAME",
            help="Queue to sweep; repeat for several (default: every queue in ECHOMQ['QUEUES']).",
        )
        parser.add_argument("--once", action="store_true", help="Sweep each queue once, then exit.")
        parser.add_argument(
            "--interval", type=positive_seconds, default=None, metavar="SECONDS",
            help="Seconds between sweeps, and how long the gate stays closed "
                 "(default: each queue's SWEEP_INTERVAL, 30 unless configured).",
        )
        parser.add_argument(
            "--force", action="store_true",
            help="Sweep even if another sweeper ran within the interval; the gate then stays closed "
                 "for an interval, so no regular sweep follows at once.",
        )
        parser.add_argument(
            "--max-stalled-count", type=non_negative_int, default=None, metavar="N",
            help="Stalls a job may survive before it is failed (default: each queue's "
                 "MAX_STALLED_COUNT, 1 unless configured).",
        )
        parser.add_argument(
            "--no-relay", action="store_false", dest="relay",
            help="Do not relay the outbox's rows (echomq_relay does it apart); by default the sweeper relays "
                 "whenever ECHOMQ or a queue has OUTBOX on, or rows are left from when one had.",
        )

    def handle(self, *, once: bool, **options: Any) -> None:
        # The loop's signals are recorded from here on: one during start-up stops it as soon as it runs.
        with contextlib.nullcontext() if once else RecordedSignals() as recorded:
            self.sweep(recorded, once=once, **options)

    def sweep(
        self, recorded: RecordedSignals | None, *, queues: list[str] | None, once: bool, interval: float | None,
        force: bool, max_stalled_count: int | None, relay: bool, verbosity: int, **options: Any,
    ) -> None:
        try:
            sweeper = make_sweeper(
                queue_names(queues), max_stalled_count=max_stalled_count,
                interval_ms=max(1, round(interval * 1000)) if interval else None,
            )
        except (InvalidNameError, ValueError) as error:
            raise CommandError(str(error)) from None
        connect_or_fail(lambda message: self.stderr.write(self.style.WARNING(message)))

        def report(result: SweepReport) -> None:
            if result.skipped:
                # A skipped sweep is routine in the loop (other sweepers), news with --once.
                if once and verbosity >= 1:
                    self.stdout.write(skipped_line(result.queue))
                elif verbosity >= 2:
                    self.stdout.write(result.summary())
                return
            if verbosity >= 1:
                self.stdout.write(result.summary())
                if once and result.held_ms:
                    self.stdout.write(f"queue {result.queue}: run --once on a schedule with --interval set to the "
                                      "schedule's period, so the time between runs is not taken for an outage")
            self.mirror(result.queue, verbosity)

        with echomq_logs_shown(self, verbosity):
            try:
                # Always: with OUTBOX off a pass only looks for rows left from when it was on (outbox_in_use).
                relayer = Relay() if relay else None
                if once:
                    for result in sweeper.sweep_all(force=force):
                        report(result)
                    if relayer:
                        relayed(self, relayer.run_once(), verbosity)
                    return
                if verbosity >= 1:
                    self.stdout.write("sweeping " + ", ".join(
                        f"{target.queue} every {target.interval_ms / 1000:g} s" for target in sweeper.targets)
                        + (", relaying the outbox" if relayer and outbox_in_use() else ""))
                runners = [CommandRunner(lambda: sweeper.run(report, force=force), sweeper)]
                if relayer:
                    runners.append(CommandRunner(relayer.run, relayer))
                run_until_signalled(*runners, grace_s=0, recorded=recorded)
            except QueueStateError as error:
                raise CommandError(str(error)) from None
            except UNREACHABLE as error:  # only --once gets here: the loop waits out outages
                raise CommandError(f"cannot reach Redis: {error}") from None

    def mirror(self, queue: str, verbosity: int) -> None:
        """Bring the admin's copy of this queue's failed and stalled sets up to date, and forget the durable steps'
        rows of its jobs gone from Redis."""
        close_old_connections()
        try:
            synced = sync_queue(get_queue(queue, long_running=True))
            forget_rows(queue)  # the durable steps' rows of jobs gone from Redis
        except UNREACHABLE:
            raise  # the sweeper's loop waits for Redis and tries again
        except DatabaseError as error:
            logger.error("could not update the mirror of queue %s: %s", queue, error)
            return
        except Exception:
            # The admin's copy is a convenience; recovering stalled jobs is not.
            # Whatever breaks the mirror (a bug, data nobody foresaw) is logged
            # with its traceback, and the sweeps go on.
            logger.exception("could not update the mirror of queue %s", queue)
            return
        if verbosity >= 2 or (verbosity >= 1 and (synced.written or synced.deleted)):
            self.stdout.write(synced.summary())


def skipped_line(queue_name: str) -> str:
    """Why a sweep of `queue_name` was skipped: the gate, closed by another sweep within its interval."""
    queue = get_queue(queue_name, long_running=True)
    try:
        why = f"another sweep ran {seconds_since(last_sweep(queue.client, queue.keys) or {}):.1f} s ago"
    except (KeyError, TypeError, ValueError):  # no report yet, or one this package did not write
        why = "another sweep ran within its interval"
    return f"queue {queue_name}: skipped: {why}; use --force to sweep now"
