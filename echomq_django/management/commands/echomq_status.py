"""`manage.py echomq_status`: jobs per state, marks, the last sweep of each queue, the worker slots
held by threads past their time limit, if any, the live workers and the warnings.

`--json` adds each queue's last five complete minutes and its mean rates per minute over them.
"""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from echomq_django.core import COUNTED, UNREACHABLE, InvalidNameError, now_ms
from echomq_django.queues import queue_names
from echomq_django.status import (
    describe_abandoned,
    describe_outbox,
    describe_sweep,
    describe_worker,
    queue_status,
    read_outbox,
)

COLUMN = 2 + max(len(state) for state in COUNTED)  # so that no two headers run together


class Command(BaseCommand):
    help = ("Show jobs per state (stalled = marked, also counted in active), pause state, last sweep, the live "
            "workers and warnings (jobs waiting with no worker, no sweep for three intervals).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", action="append", dest="queues", metavar="NAME",
                            help="Queue to show; repeat for several (default: every configured queue).")
        parser.add_argument("--json", action="store_true", dest="as_json",
                            help="Print one JSON document instead of a table, with each queue's last five "
                                 "complete minutes and its jobs completed, failed and recovered per minute.")

    def handle(self, *, queues: list[str] | None, as_json: bool, **options: Any) -> None:
        try:
            now = now_ms()  # one "now" for every queue, so all show the same minutes
            outbox = read_outbox()
            statuses = [queue_status(name, rates=as_json, now=now, outbox=outbox) for name in queue_names(queues)]
        except InvalidNameError as error:
            raise CommandError(str(error)) from None
        except UNREACHABLE as error:
            raise CommandError(f"cannot reach Redis: {error}") from None
        if as_json:
            self.stdout.write(json.dumps(statuses))
        else:
            self.stdout.write(f"{'queue':<20}" + "".join(f"{state:>{COLUMN}}" for state in COUNTED) + "  last sweep")
            for status in statuses:
                self.stdout.write(status_line(status))
            self.stdout.write("\nworkers:")
            for status in statuses:
                for line in worker_lines(status):
                    self.stdout.write(line)
            warnings = [f"{status['queue']}: {warning}"
                        for status in statuses for warning in status.get("warnings", ())]
            if warnings:
                self.stdout.write("\nwarnings:")
                for warning in warnings:
                    self.stdout.write(self.style.WARNING(f"  {warning}"))
        broken = [status["queue"] for status in statuses if "error" in status]
        if broken:  # after the healthy queues were shown, so one broken queue hides nothing
            raise CommandError(f"could not read queue(s) {', '.join(broken)}")


def status_line(status: dict[str, Any]) -> str:
    if "error" in status:
        return f"{status['queue']:<20}  error: {status['error']}"
    name = status["queue"] + (" (paused)" if status["paused"] else "")
    notes = [note for note in (describe_abandoned(status["abandoned_threads"]), describe_outbox(status["outbox"]))
             if note]
    return (f"{name:<20}" + "".join(f"{status['counts'][s]:>{COLUMN}}" for s in COUNTED)
            + "  " + describe_sweep(status["last_sweep"]) + "".join(f"; {note}" for note in notes))


def worker_lines(status: dict[str, Any]) -> list[str]:
    """A queue's live workers, a line each (one line saying none when it has none)."""
    if "error" in status:
        return []
    if not status["workers"]:
        return [f"  {status['queue']}: none"]
    return [f"  {status['queue']}: {describe_worker(worker)}" for worker in status["workers"]]
