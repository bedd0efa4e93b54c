"""What `echomq_status` and the admin's dashboard show of a queue, read the same way for both."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from redis.exceptions import ResponseError

from .conf import QueueConfig, get_settings
from .core import (
    FlowState,
    Minute,
    Queue,
    QueueStateError,
    abandoned_threads,
    datetime_from_ms,
    flow_state,
    last_sweep,
    recent_minutes,
)
from .outbox import QueueOutbox, outbox_in_use, outbox_state
from .queues import get_queue

logger = logging.getLogger("echomq.outbox")

# The states whose jobs wait for a worker: one of them not empty and no live worker is worth a warning.
READY_STATES = ("wait", "prioritized", "paused")
# A queue whose last sweep is older than this many of its sweep intervals has no sweeper running, it seems.
SWEEPS_MISSED = 3

# The complete minutes whose rates `echomq_status --json` reports (its key "last_5_minutes" says so too).
RATE_MINUTES = 5
# The counts it gives a mean per minute of.
RATED = ("completed", "failed", "recovered")


def read_outbox() -> dict[str, QueueOutbox] | None:
    """The outbox's rows per queue; None when no queue uses it, ECHOMQ is unreadable or the database fails (logged)."""
    try:
        if not outbox_in_use():
            return None
        return outbox_state()
    except ImproperlyConfigured:  # the dashboard and the check say what is wrong with ECHOMQ
        return None
    except DatabaseError as error:
        logger.warning("the outbox could not be read: %s", error)
        return None


def outbox_summary(rows: QueueOutbox | None) -> dict[str, Any]:
    """A queue's outbox as `echomq_status --json` shows it."""
    rows = rows or QueueOutbox(0, 0.0, 0, 0)
    return {"rows": rows.rows, "oldest_age_s": rows.oldest_age_s, "stale": rows.stale, "refused": rows.refused}


def describe_outbox(outbox: dict[str, Any]) -> str:
    """A queue's outbox in words ("" when it has no rows)."""
    if not outbox["rows"]:
        return ""
    unsent = [f"{outbox[key]} {key}" for key in ("stale", "refused") if outbox[key]]
    return (f"outbox: {outbox['rows']} job(s) not yet in Redis, the oldest {outbox['oldest_age_s']:.0f} s old"
            + (f" ({', '.join(unsent)}: never sent)" if unsent else ""))


def queue_status(name: str, *, rates: bool = False, now: int | None = None,
                 outbox: dict[str, QueueOutbox] | None = None) -> dict[str, Any]:
    """Everything the status shows for one queue, as plain data; `error` instead when a key is broken.

    `rates` adds `recent_rates` as of `now` (ms; default: the time now);
    `outbox` is read_outbox()'s, read once for every queue shown.
    """
    queue = get_queue(name)
    config = get_settings().queue(name)
    try:
        status = {"queue": name, "paused": queue.is_paused(), "counts": queue.counts(),
                  "last_sweep": last_sweep(queue.client, queue.keys),
                  "flow": flow_summary(flow_state(queue, config.rate_limit), config),
                  # Worker slots held by a thread past its hard limit (threads pool): no job starts in them.
                  "abandoned_threads": [{"worker": worker, "job": job}
                                        for worker, job in abandoned_threads(queue.client, queue.keys)],
                  "outbox": outbox_summary((outbox or {}).get(name)),
                  "workers": [worker.to_json() for worker in queue.workers()]}
    except (QueueStateError, ResponseError) as error:  # a key another client gave another Redis type
        return {"queue": name, "error": str(error)}
    status["warnings"] = queue_warnings(status, config)
    return {**status, **recent_rates(queue, now)} if rates else status


def queue_warnings(status: dict[str, Any], config: QueueConfig) -> list[str]:
    """What an operator should look at now: jobs waiting with no live worker, and no sweep for a while."""
    warnings = []
    ready = sum(status["counts"][state] for state in READY_STATES)
    if ready and not status["workers"]:
        warnings.append(f"no workers: {ready} job(s) waiting and no live worker serves this queue")
    sweep = status["last_sweep"]
    interval_s = sweep_interval_ms(sweep, config) / 1000
    try:
        age_s = seconds_since(sweep) if sweep else None
    except (KeyError, TypeError, ValueError):  # a report another client wrote
        age_s = None
    if age_s is not None and age_s > SWEEPS_MISSED * interval_s:
        warnings.append(f"no sweeper: the last sweep ended {age_s:.0f} s ago, more than {SWEEPS_MISSED} sweep "
                        f"intervals of {interval_s:g} s (is `manage.py echomq_sweep` running?)")
    elif sweep is None and status["counts"]["active"]:
        warnings.append("no sweeper: this queue has running jobs and was never swept (is `manage.py echomq_sweep` "
                        "running?): a job whose worker dies would not be recovered")
    return warnings


def sweep_interval_ms(sweep: Any, config: QueueConfig) -> int:
    """The interval the last sweep ran with (`echomq_sweep --interval` may differ), else the queue's setting."""
    interval = sweep.get("interval_ms") if isinstance(sweep, dict) else None
    if isinstance(interval, int) and not isinstance(interval, bool) and 0 < interval < 2**53:
        return interval
    return config.sweep_interval_ms


def describe_worker(worker: dict[str, Any], now_s: float | None = None) -> str:
    """One worker of the registry in one line: where it runs, how busy, since when."""
    now_s = time.time() if now_s is None else now_s
    up_s = max(0.0, now_s - worker["started_at_ms"] / 1000)
    beat_s = max(0.0, now_s - worker["heartbeat_at_ms"] / 1000)
    jobs = ", ".join(job_id for job_id, _ in worker["running"])
    return (f"{worker['id']} on {worker['host']} (pid {worker['pid']}), {worker['pool']} x{worker['concurrency']}, "
            f"busy {len(worker['running'])}/{worker['concurrency']}, up {duration(up_s)}, heartbeat "
            f"{beat_s:.0f} s ago, {worker['done']} done, {worker['failed']} failed"
            + (f"; running {jobs}" if jobs else ""))


def duration(seconds: float) -> str:
    """A duration in its largest units: "45 s", "12 min", "3 h 20 min", "2 d 4 h"."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def flow_summary(state: FlowState, config: QueueConfig) -> dict[str, Any]:
    """A queue's limits (settings) beside what they hold back now (Redis), as plain data."""
    rate = config.rate_limit
    return {
        "rate_limit": {"max": rate.max, "duration_s": rate.duration_ms / 1000} if rate else None,
        "started_in_window": state.started_in_window,
        "max_active": config.max_active or None,
        "group_max_active": config.group_max_active or None,
        "paused_for_s": state.paused_for_ms / 1000,
        "groups_waiting": state.groups_waiting,
        "groups_active": state.groups_active,
        "top_groups": [{"group": group.name, "waiting": group.waiting, "active": group.active}
                       for group in state.top_groups],
    }


def recent_rates(queue: Queue, now: int | None = None) -> dict[str, Any]:
    """The RATE_MINUTES complete minutes before `now` (ms), oldest first, and their mean counts per minute."""
    minutes = recent_minutes(queue, RATE_MINUTES + 1, now)[:-1]  # the minute now is still counting
    return {
        "last_5_minutes": [minute_summary(minute) for minute in minutes],
        "rates_per_minute": {name: sum(getattr(minute, name) for minute in minutes) / len(minutes)
                             for name in RATED},
    }


def minute_summary(minute: Minute) -> dict[str, Any]:
    """One minute as `echomq_status --json` shows it: its start (ISO 8601, UTC), counts and mean times (ms)."""
    start = datetime_from_ms(minute.start_ms)
    return {"minute": start.isoformat() if start else None, "completed": minute.completed,
            "failed": minute.failed, "retried": minute.retried, "recovered": minute.recovered,
            "mean_wait_ms": minute.mean_wait_ms, "mean_run_ms": minute.mean_run_ms}


def describe_abandoned(threads: list[dict[str, str]]) -> str:
    """The slots held by abandoned threads in words ("" for none)."""
    if not threads:
        return ""
    jobs = ", ".join(thread["job"] for thread in threads)
    return (f"{len(threads)} worker slot(s) held by thread(s) running on past their time limit "
            f"(job(s) {jobs}): no job starts in them until they end")


def describe_sweep(sweep: Any) -> str:
    """The last sweep report in one line."""
    if not sweep:
        return "never"
    # The report is JSON any client may have written: a field missing or of
    # another type makes it unreadable, not the status.
    try:
        return (f"{seconds_since(sweep):.0f} s ago on {sweep['host']}: marked {sweep['marked']}, "
                f"recovered {sweep['recovered']}, failed {sweep['failed']}")
    except (KeyError, TypeError, ValueError):
        return "unreadable report"


def seconds_since(sweep: dict[str, Any]) -> float:
    """Seconds since a sweep report's sweep ended; ValueError, KeyError or TypeError when it says no time."""
    try:
        finished_s = float(sweep["finished_at_ms"]) / 1000
    except OverflowError:  # an int no float holds: no time either (its callers catch ValueError)
        raise ValueError("finished_at_ms is out of a float's range") from None
    if not math.isfinite(finished_s):
        raise ValueError(finished_s)
    return max(0.0, time.time() - finished_s)
