"""The job browser's pieces of a page: times, the columns of each state's list, a job's sections."""

from __future__ import annotations

from collections.abc import Callable
from itertools import zip_longest
from typing import Any

from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from ..core import Entry, InvalidNameError, Job, LiveJob, TooDeep, datetime_from_ms, log_line, validate_stored_id
from .common import exact_time, pretty_json
from .mirror_lists import lock_ttl, seconds

REASON_CHARS = 120


def moment(ms: float | None) -> str:
    try:
        return exact_time(datetime_from_ms(None if ms is None else int(ms)))
    except (OverflowError, ValueError):  # inf or nan, scored by another client
        return "-"


def duration(ms: int | None) -> str:
    return "-" if ms is None or ms < 0 else f"{ms} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def shortened(text: str | None) -> str:
    text = text or "-"
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 1] + "…"


def job_link(queue_name: str, job_id: str) -> str:
    """The id, linked to its page; an id no job can have (another client's) is shown unlinked."""
    try:
        validate_stored_id(job_id)
    except InvalidNameError:
        return job_id
    return format_html('<a href="{}">{}</a>', reverse("admin:echomq_job_detail", args=[queue_name, job_id]), job_id)


def workflow_link(job: Job) -> str:
    """A step's workflow, linked to its page; "-" for a job of no workflow."""
    if not (job.workflow_id and job.workflow_queue):
        return "-"
    try:
        validate_stored_id(job.workflow_id)
        url = reverse("admin:echomq_workflow_detail", args=[job.workflow_queue, job.workflow_id])
    except (InvalidNameError, NoReverseMatch):  # another client's fields
        return job.workflow_id
    return format_html('<a href="{}">{}</a>', url, job.workflow_id)


Column = tuple[str, Callable[[Job, Entry], Any]]
FINISHED: Column = ("finished", lambda job, entry: moment(job.finished_on or entry.score_ms))
LOCK_AND_WORKER: tuple[Column, ...] = (("lock TTL", lambda job, entry: lock_ttl(entry.lock_ttl_ms)),
                                       ("worker", lambda job, entry: job.worker_id or "-"))
COLUMNS: tuple[Column, ...] = (
    ("name", lambda job, entry: job.name or "-"),
    ("attempts (made / started)", lambda job, entry: f"{job.attempts_made} / {job.attempts_started}"),
    ("created", lambda job, entry: moment(job.timestamp)),
    ("workflow", lambda job, entry: workflow_link(job)),
)
STATE_COLUMNS: dict[str, tuple[Column, ...]] = {
    "prioritized": (("priority", lambda job, entry: job.opts.priority),),
    "delayed": (("due", lambda job, entry: moment(entry.score_ms)),),
    "active": (("started", lambda job, entry: moment(job.processed_on)), *LOCK_AND_WORKER),
    "stalled": LOCK_AND_WORKER,
    "completed": (FINISHED, ("run time", lambda job, entry: duration(
        job.finished_on - job.processed_on if job.finished_on and job.processed_on else None))),
    "failed": (FINISHED, ("reason", lambda job, entry: shortened(job.failed_reason))),
}


def table_row(queue_name: str, entry: Entry, columns: tuple[Column, ...]) -> dict[str, Any]:
    """A job's line of a list; `job_id` is None for an id no job can have (it cannot be ticked either)."""
    try:
        job_id: str | None = validate_stored_id(entry.job_id)
    except InvalidNameError:
        job_id = None
    if entry.job is None:
        return {"id": job_link(queue_name, entry.job_id), "job_id": job_id, "problem": entry.problem}
    return {"id": job_link(queue_name, entry.job_id), "job_id": job_id,
            "cells": [value(entry.job, entry) for _, value in columns]}


def page_links(number: int, last: int) -> dict[str, Any]:
    def link(page: int) -> str:
        return "?" + urlencode({"p": page})

    earlier, later = number > 1, number < last
    return {"number": number, "last": last, "first_url": link(1) if earlier else None,
            "previous_url": link(number - 1) if earlier else None,
            "next_url": link(number + 1) if later else None, "last_url": link(last) if later else None}


def percent(progress: Any) -> float | None:
    """The progress as a percentage, when it is a number from 0 to 100."""
    number = isinstance(progress, (int, float)) and not isinstance(progress, bool)
    return progress if number and 0 <= progress <= 100 else None


def job_sections(job: Job, state: str | None, due_ms: float | None, live: LiveJob | None) -> dict[str, Any]:
    """What a job's page shows, section by section, from what Redis holds now."""
    # Both lists keep the newest failures, one entry each: pairing them from the newest end keeps a
    # class with its traceback even when one list is shorter (written before `errc` existed).
    errors = [(error_class, trace, TooDeep.note if isinstance(trace, TooDeep) else "")
              for error_class, trace in zip_longest(reversed(job.error_classes), reversed(job.stacktrace),
                                                    fillvalue="")][::-1]
    return {
        "name": job.name, "failed_reason": job.failed_reason, "errors": errors,
        "timeline": [("created", moment(job.timestamp)), *([("due", moment(due_ms))] if state == "delayed" else []),
                     ("first started", moment(job.started_on)), ("last started", moment(job.processed_on)),
                     ("finished", moment(job.finished_on))],
        "attempts": [("attempts made", job.attempts_made), ("attempts started", job.attempts_started),
                     ("attempts allowed", job.opts.attempts), ("stalls", job.stall_count)],
        "worker_ids": job.worker_ids,
        "running": [("worker", job.worker_id or "-"), ("lock TTL", lock_ttl(live.lock_ttl_ms)),
                    ("time in active", seconds(live.seconds_in_active)), ("next sweep will", str(live.verdict)),
                    *([("cancel requested", f"{job.cancel_reason}: its worker stops it at its next lock renewal")]
                      if job.cancel_reason else [])]
        if live else [],
        "progress": None if job.progress is None else pretty_json(job.progress), "percent": percent(job.progress),
        "logs": [log_line(line) for line in job.logs], "log_count": job.log_count,
        "first_log_line": job.log_count - len(job.logs) + 1,
        "returnvalue": pretty_json(job.returnvalue) if state == "completed" or job.returnvalue is not None else None,
        "data": pretty_json(job.data), "options": pretty_json(job.opts.to_json()),
    }
