"""What the schedule pages show of each schedule: how it was read, what Redis remembers of it, when it fires next.

A row of the Schedule model and a schedule of ECHOMQ["SCHEDULES"] are shown
by the same columns. What Redis remembers (the latest tick and job) is read
for a whole page at once (`read_shown`: one round trip for the records, one
for whether their jobs still exist); when Redis does not answer, each Redis
column says so and the rest of the page is still shown. When a schedule
fires next is computed, with no Redis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest
from django.urls import reverse
from django.utils import dateformat
from django.utils.html import format_html, format_html_join

from .. import schedules
from ..core import UNREACHABLE, Firing, InvalidNameError, QueueKeys, Record, seconds_text, validate_stored_id, zone
from ..core import now_ms as clock_ms
from ..queues import get_queue
from ..schedules import Entry
from ..schedules.models import Schedule as ScheduleRow
from .browser_pages import job_link
from .common import REDIS_ERRORS, redis_problem

# How many coming ticks a schedule's page lists.
NEXT_FIRES = 5
# What a Redis column says when Redis did not answer.
UNREACHABLE_TEXT = "Redis unreachable"


@dataclass
class Shown:
    """One schedule as a page shows it: how it was read, and what Redis remembers of it (or why that is unknown)."""

    entry: Entry | None  # None: ECHOMQ is broken, so the schedule could not be read (`unread` says why)
    record: Record | None = None
    job_exists: bool = False  # the record's latest job still has its hash
    unread: str = ""
    can_view_jobs: bool = False  # the latest job is linked to its page
    shadowed: bool = False  # a row with the name of a settings schedule, which the scheduler leaves out


def entry_of(row: ScheduleRow) -> tuple[Entry | None, str]:
    """A row read as the scheduler reads it, and ""; (None, why) when ECHOMQ cannot be read."""
    try:
        return row.entry(), ""
    except ImproperlyConfigured as error:
        return None, str(error)


def read_shown(entries: list[Entry | None], *, can_view_jobs: bool) -> tuple[list[Shown], str]:
    """Each entry with its record: one read of the records, one of whether their jobs still exist.

    Returns why Redis could not be read too ("" when it could).
    """
    shown = [Shown(entry, can_view_jobs=can_view_jobs) for entry in entries]
    readable = [(item, item.entry.schedule) for item in shown
                if item.entry is not None and item.entry.schedule is not None]
    if not readable:
        return shown, ""
    try:
        found = schedules.records([schedule for _, schedule in readable])
        there = jobs_exist([(schedule.queue, record.job_id) for (_, schedule), record in zip(readable, found)])
    except (*REDIS_ERRORS, ImproperlyConfigured) as error:
        for item, _ in readable:
            item.unread = UNREACHABLE_TEXT if isinstance(error, UNREACHABLE) else f"unknown: {error}"
        return shown, redis_problem(error)
    for (item, _), record, exists in zip(readable, found, there):
        item.record, item.job_exists = record, exists
    return shown, ""


def jobs_exist(jobs: list[tuple[str, str]]) -> list[bool]:
    """Whether each (queue, job id) still has its job hash, in one pipelined round trip."""
    asked = [(queue, job_id) for queue, job_id in jobs if linkable(job_id)]
    if not asked:
        return [False] * len(jobs)
    queue = get_queue(asked[0][0])
    pipe = queue.client.pipeline(transaction=False)
    for queue_name, job_id in asked:
        pipe.exists(QueueKeys(queue_name, queue.keys.prefix).job(job_id))
    answers = iter(pipe.execute())
    return [bool(next(answers)) if linkable(job_id) else False for _, job_id in jobs]


def linkable(job_id: str) -> bool:
    """Whether a job id read from a record can be a job's (another client may have written anything there)."""
    try:
        validate_stored_id(job_id)
    except InvalidNameError:
        return False
    return True


def problems_of(entry: Entry) -> list[str]:
    """The errors that keep a schedule from firing (warnings left out)."""
    return [problem.message for _, problem in entry.problems if not problem.warning]


def in_zone(ms: int | None, timezone_name: str) -> str:
    """A moment (ms since the epoch) to the second, in a schedule's time zone; "-" for none or nonsense."""
    if ms is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(ms / 1000, UTC).astimezone(zone(timezone_name))
    except (OverflowError, OSError, ValueError):  # a tick another client wrote, out of any calendar
        return "-"
    return dateformat.format(moment, "Y-m-d H:i:s T")


def when_text(entry: Entry | None, options: dict[str, Any]) -> str:
    """"every 30 s" or "cron 0 3 * * 1-5 (Europe/Berlin)", from the options when they do not make a schedule."""
    if entry is not None and entry.schedule is not None:
        return entry.schedule.describe()
    cron, every = options.get("CRON"), options.get("EVERY")
    if cron:
        return f"cron {cron} ({options.get('TIMEZONE') or settings.TIME_ZONE})"
    if isinstance(every, (int, float)) and math.isfinite(every) and abs(every) < 1e15:
        return f"every {seconds_text(round(every * 1000))} s"
    if every is not None:
        return f"every {every!r} s"
    return "-"


def dotted(path: Any) -> str:
    """A task's dotted path, with a line break allowed after each dot."""
    if not path:
        return "-"
    parts = str(path).split(".")
    return format_html_join("", "{}<wbr>", ((piece,) for piece in [part + "." for part in parts[:-1]] + parts[-1:]))


def queue_text(explicit: Any, entry: Entry | None) -> str:
    """The queue the options name; else the task's own, said so."""
    if explicit:
        return str(explicit)
    if entry is not None and entry.schedule is not None:
        return format_html('{} <span class="help">(the task\'s own)</span>', entry.schedule.queue)
    return format_html('<span class="help">{}</span>', "(the task's own)")


SHADOWED = "not fired: ECHOMQ['SCHEDULES'] has a schedule of this name"


def next_fire(entry: Entry | None, shadowed: bool = False) -> str:
    """When the schedule fires next, in its time zone; or why it does not."""
    if entry is None:
        return "-"
    if shadowed:
        return format_html('<span class="echomq-problem">{}</span>', SHADOWED)
    if entry.schedule is None:
        found = problems_of(entry)
        return format_html('<span class="echomq-problem">invalid: {}</span>', found[0] if found else "?")
    if not entry.enabled:
        return "disabled"
    try:
        return in_zone(entry.schedule.tick_after(clock_ms()), entry.schedule.timezone)
    except Exception as error:  # a cron expression the library cannot step through (the scheduler logs it too)
        return format_html('<span class="echomq-problem">cannot work out its ticks: {}</span>', error or repr(error))


def next_fires(entry: Entry | None, shadowed: bool = False) -> str:
    """The next ticks, in the schedule's time zone, as a list; or why there are none."""
    if entry is None or entry.schedule is None or shadowed:
        return next_fire(entry, shadowed)
    schedule = entry.schedule
    try:
        coming = schedule.next_ticks(clock_ms(), NEXT_FIRES)
    except Exception as error:  # as in next_fire
        return format_html('<span class="echomq-problem">cannot work out its ticks: {}</span>', error or repr(error))
    ticks = format_html_join("", "<li>{}</li>", ((in_zone(tick, schedule.timezone),) for tick in coming))
    if entry.enabled:
        return format_html('<ul class="echomq-ticks">{}</ul>', ticks)
    return format_html('<p>Disabled: it does not fire. Enabled, it would fire at:</p><ul class="echomq-ticks">{}</ul>',
                       ticks)


def last_fired(shown: Shown) -> str:
    """The latest tick decided and how (fired, skipped, missed), and a run now since, if any."""
    if shown.unread:
        return shown.unread
    entry, record = shown.entry, shown.record
    if entry is None or entry.schedule is None or record is None:
        return "-"
    schedule = entry.schedule
    ran_now = record.ran_now and record.fired_at_ms is not None
    parts = []
    if record.tick_ms is not None:
        parts.append(f"{in_zone(record.tick_ms, schedule.timezone)}: {record.outcome or 'unknown'}")
    if ran_now:
        parts.append(f"run now at {in_zone(record.fired_at_ms, schedule.timezone)}")
    return "; ".join(parts) or "never"


def outcome_counts(shown: Shown) -> str:
    if shown.unread:
        return shown.unread
    if shown.record is None:
        return "-"
    counts = shown.record.counts
    return ", ".join(f"{outcome} {counts.get(outcome, 0)}" for outcome in ("fired", "skipped", "missed"))


def last_job(shown: Shown) -> str:
    """The id of the schedule's latest job, linked to its page while Redis still has it."""
    if shown.unread:
        return shown.unread
    entry, record = shown.entry, shown.record
    if entry is None or entry.schedule is None or record is None or not record.job_id:
        return "-"
    if not linkable(record.job_id):  # another client's: no page can show it
        return record.job_id
    if not shown.job_exists:
        return format_html('{} <span class="help">(no longer in Redis)</span>', record.job_id)
    if not shown.can_view_jobs:
        return record.job_id
    return job_link(entry.schedule.queue, record.job_id)


def fired_links(request: HttpRequest, firings: list[Firing]) -> str:
    """"name as job <id> (queue q)" for each firing, the ids linked when the user may see jobs."""
    can_view_jobs = request.user.has_perm("echomq.view_job")
    return format_html_join(", ", "{} as job {} on queue {}", (
        (firing.schedule, job_link(firing.queue, firing.job_id) if can_view_jobs else firing.job_id, firing.queue)
        for firing in firings))


def settings_row(shown: Shown, can_run: bool) -> dict[str, Any]:
    """One line of the settings schedules' table: the same columns as the rows', its problems, its button."""
    entry = shown.entry
    assert entry is not None
    # Its problems are listed in full under its line.
    when_next = (format_html('<span class="echomq-problem">{}</span>', "invalid: see its problems below")
                 if entry.schedule is None else next_fire(entry))
    return {
        "name": entry.name, "when": when_text(entry, entry.options), "task": dotted(entry.options.get("TASK")),
        "queue": queue_text(entry.options.get("QUEUE"), entry), "enabled": entry.enabled,
        "last_fired": last_fired(shown), "next_fire": when_next, "last_job": last_job(shown),
        "problems": [{"message": problem.message, "hint": problem.hint, "warning": problem.warning}
                     for _, problem in entry.problems],
        "run_url": reverse("admin:echomq_schedule_run_settings", args=[entry.name])
        if can_run and entry.schedule is not None else None,
    }
