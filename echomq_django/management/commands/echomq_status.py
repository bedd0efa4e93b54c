"""`manage.py echomq_status`: jobs per state, marks, the last sweep of each queue, and the worker slots
held by threads past their time limit, if any.

`--json` adds each queue's last five complete minutes and its mean rates per minute over them.
"""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from echomq_django.core import COUNTED, UNREACHABLE, InvalidNameError, now_ms
from echomq_django.queues import queue_names
from echomq_django.status import describe_abandoned, describe_outbox, describe_sweep, queue_status, read_outbox

COLUMN = 2 + max(len(state) for state in COUNTED)  # so that no two headers run together


class Command(BaseCommand):
    help = "Show jobs per state (stalled = marked, also counted in active), pause state and last sweep."

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
