"""`manage.py echomq_status`: jobs per state, marks and the last sweep of each queue."""

import json
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from echomq_django.core import InvalidNameError
from echomq_django.core.connection import UNREACHABLE
from echomq_django.core.sweeper import last_sweep
from echomq_django.queues import get_queue, queue_names

STATES = ("wait", "paused", "active", "stalled", "delayed", "completed", "failed")


def queue_status(name: str) -> dict[str, Any]:
    """Everything the status shows for one queue, as plain data."""
    queue = get_queue(name)
    return {"queue": name, "paused": queue.is_paused(), "counts": queue.counts(),
            "last_sweep": last_sweep(queue.client, queue.keys)}


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
            return
        self.stdout.write(f"{'queue':<20}" + "".join(f"{state:>10}" for state in STATES) + "  last sweep")
        for status in statuses:
            name = status["queue"] + (" (paused)" if status["paused"] else "")
            self.stdout.write(f"{name:<20}" + "".join(f"{status['counts'][s]:>10}" for s in STATES)
                              + "  " + describe_sweep(status["last_sweep"]))


def describe_sweep(sweep: dict[str, Any] | None) -> str:
    if not sweep:
        return "never"
    ago = max(0.0, time.time() - sweep["finished_at_ms"] / 1000)
    return (f"{ago:.0f} s ago on {sweep['host']}: marked {sweep['marked']}, recovered {sweep['recovered']}, "
            f"failed {sweep['failed']}")

