"""Schedules from ECHOMQ["SCHEDULES"] and from the database, as the scheduler (echomq_beat) fires them.

How one schedule's options are read (checked, with every problem tied to its
option) is parsing.py, which the Schedule model uses too; this module adds
the database's rows and what is done with the result.
"""

from __future__ import annotations

import logging
import uuid

from django.db import close_old_connections

from ..core import Firing, Record, Schedule, read_records
from ..core import run_now as fire_now
from ..queues import get_queue
from .models import Schedule as ScheduleRow
from .parsing import Entry, settings_entries

logger = logging.getLogger("echomq.beat")


def database_entries() -> list[Entry]:
    """Every schedule of the Schedule model, as the scheduler reads it now (its process closes stale connections first).

    The scheduler imports a row's TASK as the worker will: the admin accepted only registered ones.
    """
    return [row.entry(importing=True) for row in ScheduleRow.objects.order_by("name")]


def load_schedules() -> list[Schedule]:
    """What the scheduler fires: the enabled schedules without errors, from settings, then the database.

    A database schedule with the name of one in settings is left out (the
    admin's form refuses such names; this covers rows written around it).
    """
    close_old_connections()
    schedules: dict[str, Schedule] = {}
    for entry in [*settings_entries(), *database_entries()]:
        if entry.schedule is None or not entry.enabled:
            if entry.enabled and any(not problem.warning for _, problem in entry.problems):
                logger.error("schedule %s (%s) is not fired: %s", entry.name, entry.source,
                             next(problem.message for _, problem in entry.problems if not problem.warning))
            continue
        if entry.name in schedules:
            logger.error("schedule %s of the database is not fired: ECHOMQ['SCHEDULES'] has one of that name",
                         entry.name)
            continue
        schedules[entry.name] = entry.schedule
    return list(schedules.values())


def records(schedules: list[Schedule]) -> list[Record]:
    """What Redis remembers of each schedule (latest tick, latest job), in one round trip."""
    if not schedules:
        return []
    queue = get_queue(schedules[0].queue)
    return read_records(queue.client, schedules, prefix=queue.keys.prefix)


def run_now(schedule: Schedule) -> Firing:
    """Add the schedule's job now, outside its ticks; ConnectionError or TimeoutError when Redis does not answer."""
    queue = get_queue(schedule.queue)
    return fire_now(queue.scripts, schedule, f"{schedule.name}@now-{uuid.uuid4().hex[:12]}",
                    prefix=queue.keys.prefix, max_payload_bytes=queue.max_payload_bytes)
