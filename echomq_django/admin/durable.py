"""The job browser's durable parts: a job's steps table, what a parked job waits for, and the Send signal form.

Step records, signal names and payloads are written by job code or other
clients: they reach the page as plain text (escaped by the templates), each
cut to DETAIL_CHARS, and a record that is not what this package writes shows
as such. The read itself is bounded in core (read_steps).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import HttpRequest

from ..core import (
    STATES,
    Entry,
    InvalidNameError,
    JobNotFoundError,
    PayloadError,
    Queue,
    SignalRefused,
    StepRecord,
    decode_stored,
    read_steps,
    waiting_for,
)
from .browser_pages import Column, moment
from .common import REDIS_ERRORS, redis_problem

DETAIL_CHARS = 300
# A signal sent before the job waits for it is kept, so any job that has not finished may be sent one.
UNFINISHED = tuple(state for state in STATES if state not in ("completed", "failed"))


def deadline(ms: float | None) -> str:
    """A parked job's deadline: its score in `parked`, +inf (or nothing readable) for none."""
    return "none" if ms is None or ms == float("inf") else moment(ms)


def parked_columns(queue: Queue, entries: list[Entry]) -> tuple[Column, ...]:
    """The parked list's own columns: the signal each job waits for and its deadline (read now, one round trip)."""
    signals = {entry.job_id: signal for entry, (signal, _) in
               zip(entries, waiting_for(queue, [entry.job_id for entry in entries]))}
    return (("waiting for", lambda job, entry: signals.get(entry.job_id) or "-"),
            ("deadline", lambda job, entry: deadline(entry.score_ms)))


def parked_facts(signal: str | None, score: float | None) -> list[tuple[str, str]]:
    """The job page's lines for a parked job (as waiting_for reads it): what it waits for, and until when."""
    return [("waiting for signal", signal or "-"), ("deadline", deadline(score))]


def cut(text: str) -> str:
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS - 1] + "…"


def step_detail(step: StepRecord) -> str:
    """A step's result or error, or what it waits for, in words."""
    if step.state == "failed":
        return step.error or "-"
    if step.state == "waiting":
        return "waiting for its signal, " + (f"until {moment(step.until_ms)}" if step.until_ms else "no deadline")
    if step.state == "timeout":
        return f"no signal came by {moment(step.until_ms)}"
    if step.kind == "sleep" and step.result is None:
        return f"sleeps until {moment(step.until_ms)}"
    text = json.dumps(step.result, ensure_ascii=False, default=str)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate, as its escape


def steps_section(queue: Queue, job_id: str) -> dict[str, Any] | None:
    """The steps table of a job's page; None for a job that recorded none."""
    try:
        read = read_steps(queue, job_id)
    except REDIS_ERRORS as error:
        return {"unread": redis_problem(error)}
    if not read.total:
        return None
    rows = [{"name": step.name, "problem": cut(step.problem)} if step.problem else
            {"name": step.name, "kind": step.kind or "-", "state": step.state or "-", "detail": cut(step_detail(step)),
             "at": moment(step.at_ms)} for step in read.steps]
    return {"rows": rows, "total": read.total, "cut": read.total > len(rows)}


def signal_sender(request: HttpRequest, job_id: str) -> Callable[[Queue, str | None], tuple[str, int, str | None]]:
    """The change of the Send signal form (for JobBrowserAdmin.act): the signal it names, with its JSON payload."""

    def send(queue: Queue, state: str | None) -> tuple[str, int, str | None]:
        name = request.POST.get("name", "").strip()
        try:
            payload = decode_stored(request.POST.get("payload", ""))
        except ValueError as error:
            return f"was sent no signal: the payload is not JSON ({error}); write null for none", messages.ERROR, None
        try:
            resumed = queue.signal(job_id, name, payload)
        except (InvalidNameError, PayloadError, JobNotFoundError) as error:
            return f"was sent no signal: {error}", messages.ERROR, None
        except SignalRefused as error:
            return f"was sent no signal: {error}", messages.WARNING, None
        if resumed:
            return (f"was sent signal {name!r}: it was parked waiting for it and is back in the queue",
                    messages.SUCCESS, None)
        return f"was sent signal {name!r}: it is kept until the job waits for it", messages.SUCCESS, None

    return send
