"""Bulk actions too large for a request: run by the queue's workers as jobs, with a page of their own.

An action on more than BACKGROUND_ABOVE jobs (every job of a state, or every
row a failed or stalled list matches) is not run by the request that asks for
it (after its POST, CSRF and permission checks, and the confirmation page):
the request records a run (core/reading/bulk_runs.py) and adds its first step, a job of
the queue whose jobs it changes (bulk_steps.py), and sends the user to the run's
page. A worker of that queue runs each step (STEP_JOBS ids at most, then it adds
the next step), and the step that ends the run writes the admin's LogEntry with
the final counts and the user who asked. A step that a crash or an outage
ends is run again by the queue's recovery, and changes no job twice (see
core/reading/bulk_runs.py). With no live worker serving the queue nothing is started,
and the user is told; the run's page says when it waits for a worker, or when
the queue is paused, or when its step failed for good (retrying that job goes
on from where it stopped).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from ..bulk_steps import add_step, run_summary
from ..core import BulkRun, InvalidNameError, Queue, read_run, start_run, validate_name
from .common import configured_queue

# Above this many jobs an action runs as jobs of the queue, outside the request (about 0.5 s of changes).
BACKGROUND_ABOVE = 5_000


def start_background(request: HttpRequest, queue: Queue, action: Any, state: str, ids: list[str] | None,
                     what: str, model: type[models.Model], asked: int) -> str | None:
    """Run `action` as jobs of `queue`; its run's page, or None (a message said why) when no worker serves the queue."""
    if not queue.workers():
        messages.error(request, f"Nothing changed: {asked:,} job(s) are more than a request changes "
                                f"({BACKGROUND_ABOVE:,}), so the action runs as jobs of queue {queue.name}, and no "
                                f"live worker serves it. Start one (manage.py echomq_worker {queue.name}) and ask "
                                "again, or act on fewer jobs at a time.")
        return None
    kind = ContentType.objects.get_for_model(model, for_concrete_model=False)
    fields = {"user_id": str(request.user.pk), "username": request.user.get_username(), "what": what,
              "content_type": str(kind.pk), "verb": action.verb, "done_text": action.done, "flag": str(action.flag),
              "permission": action.permission}
    run_id = start_run(queue, action.name, state, ids, fields, reason=f"in the admin by {request.user.get_username()}",
                       only_from=state if action.name == "delete" and state in ("delayed", "completed", "failed")
                       else "")
    add_step(queue, run_id, 0)
    return reverse("admin:echomq_bulk_run", args=[queue.name, run_id])


def run_view(model_admin: admin.ModelAdmin, request: HttpRequest, queue_name: str, run_id: str) -> HttpResponse:
    """A run's page: its progress while it runs, its final counts once done, and what it waits for, if anything."""
    queue = configured_queue(queue_name)
    try:
        validate_name(run_id, "run id")
    except InvalidNameError as error:
        raise Http404(str(error)) from None
    run = read_run(queue, run_id)
    if run is None:
        raise Http404(f"no bulk run {run_id!r} of queue {queue.name} (a run's page is kept a week)")
    if not request.user.has_perm(run.fields.get("permission", "")):
        raise PermissionDenied
    context = {**model_admin.admin_site.each_context(request), "opts": model_admin.opts,
               "title": f"{run.fields.get('verb', run.action)}: {run.fields.get('what', '')}", "run": run,
               "queue_name": queue.name, "summary": run_summary(queue.name, run), "warnings": waits_for(queue, run),
               "asked_by": run.fields.get("username", "")}
    return TemplateResponse(request, "admin/echomq/bulk_run.html", context)


def waits_for(queue: Queue, run: BulkRun) -> list[str]:
    """Why a run that is not done makes no progress now, if it can be told: no worker, a paused queue, a failed step."""
    if run.finished:
        return []
    warnings = []
    if not queue.workers():
        warnings.append(f"No live worker serves queue {queue.name}: this action goes on when one starts "
                        f"(manage.py echomq_worker {queue.name}).")
    if queue.is_paused():
        warnings.append(f"Queue {queue.name} is paused: its workers take no job, this action's steps included, "
                        "until it is resumed.")
    step = queue.client.hget(queue.keys.bulk_run(run.run_id), "step")
    if step and queue.get_state(step) == "failed":
        warnings.append(f"Its step job {step} failed (see its page); retry that job to go on from where it stopped.")
    return warnings
