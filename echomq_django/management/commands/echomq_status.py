"""`manage.py echomq_status`: jobs per state, marks and the last sweep of each queue."""

import json
import math
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import ResponseError

from echomq_django.core import COUNTED, InvalidNameError, QueueStateError
from echomq_django.core.connection import UNREACHABLE
from echomq_django.core.sweeper import last_sweep
from echomq_django.queues import get_queue, queue_names


def queue_status(name: str) -> dict[str, Any]:
    """Everything the status shows for one queue, as plain data; `error` instead when a key is broken."""
    queue = get_queue(name)
    try:
        return {"queue": name, "paused": queue.is_paused(), "counts": queue.counts(),
                "last_sweep": last_sweep(queue.client, queue.keys)}
    except (QueueStateError, ResponseError) as error:  # a key another client gave another Redis type
        return {"queue": name, "error": str(error)}


class Command(BaseCommand):
    help = "Show jobs per state (stalled = marked, also counted in active), pause state and last sweep."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", action="append", dest="queues", metavar="NAME",
                            help="Queue to show; repeat for several (default: every configured queue).")
        parser.add_argument("--json", action="store_true", dest="as_json",
                            help="Print one JSON document instead of a table.")

    def handle(self, *, queues: list[str] | None, as_json: bool, **options: Any) -> None:
        try:
            statuses = [queue_status(name) for name in queue_names(queues)]
        except InvalidNameError as error:
            raise CommandError(str(error)) from None
        except UNREACHABLE as error:
            raise CommandError(f"cannot reach Redis: {error}") from None
        if as_json:
            self.stdout.write(json.dumps(statuses))
        else:
            self.stdout.write(f"{'queue':<20}" + "".join(f"{state:>10}" for state in COUNTED) + "  last sweep")
            for status in statuses:
                self.stdout.write(status_line(status))
        broken = [status["queue"] for status in statuses if "error" in status]
        if broken:  # after the healthy queues were shown, so one broken queue hides nothing
            raise CommandError(f"could not read queue(s) {', '.join(broken)}")


def status_line(status: dict[str, Any]) -> str:
    if "error" in status:
        return f"{status['queue']:<20}  error: {status['error']}"
    name = status["queue"] + (" (paused)" if status["paused"] else "")
    return (f"{name:<20}" + "".join(f"{status['counts'][s]:>10}" for s in COUNTED)
            + "  " + describe_sweep(status["last_sweep"]))


def describe_sweep(sweep: Any) -> str:
    """The last sweep report in one line (the admin's dashboard shows it too)."""
    if not sweep:
        return "never"
    # The report is JSON any client may have written: a field missing or of
    # another type makes it unreadable, not the status.
    try:
        finished_s = float(sweep["finished_at_ms"]) / 1000
        if not math.isfinite(finished_s):
            raise ValueError(finished_s)
        return (f"{max(0.0, time.time() - finished_s):.0f} s ago on {sweep['host']}: marked {sweep['marked']}, "
                f"recovered {sweep['recovered']}, failed {sweep['failed']}")
    except (KeyError, TypeError, ValueError):
        return "unreadable report"

