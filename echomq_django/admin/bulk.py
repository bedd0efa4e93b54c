"""Bulk actions of the admin's lists: retry, cancel or delete the jobs ticked, or every job the list holds.

The job browser's lists post a form to `bulk_view`; the failed and stalled
lists use the admin's own actions (with its "select all" across pages), which
call `bulk_selected`. Either way the ids are taken first (a state is read in
windows, core.state_ids; the mirror's rows from the list's query, filters and
search included) and then changed BULK_BATCH at a time, one script call per
job, so no call walks a whole state and a job met twice is changed once. A
change of every job, and any cancel or delete, shows a confirmation page with
the count first; each bulk action leaves one line in the admin's LogEntry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from ..bulk_steps import forget
from ..core import (
    BROWSABLE,
    BULK_BATCH,
    GONE,
    STATES,
    STOPPING,
    BulkOutcome,
    InvalidNameError,
    Queue,
    read_jobs,
    state_ids,
    state_size,
    validate_stored_id,
)
from ..models import FailedJob, JobRecord
from ..queues import get_queue
from .bulk_runs import BACKGROUND_ABOVE, start_background
from .common import REDIS_ERRORS, configured_queue, confirmation, confirmed, redis_problem

# The most ids a form may tick: a page of the browser holds 50, the failed list 100.
MAX_TICKED = 500
# Ids named in a message per reason a job was left alone.
IDS_SHOWN = 10


@dataclass(frozen=True)
class BulkAction:
    name: str
    verb: str  # on the button and in the question
    permission: str
    states: tuple[str, ...]  # the browser's lists it is offered on
    done: str  # what happened to a job it changed
    flag: int  # LogEntry's action_flag
    asks: bool  # asks first even for ticked jobs (a retry of ticked jobs does not: it undoes a failure)


RETRY = BulkAction("retry", "Retry", "echomq.retry_failedjob", ("failed",), "sent back to wait", CHANGE, False)
# `stalled`: marked jobs are active, so cancelling one flags it for its worker (as on its page).
CANCEL = BulkAction("cancel", "Cancel", "echomq.cancel_job",
                    ("wait", "paused", "prioritized", "delayed", "deferred", "parked", "active", "stalled"),
                    "cancelled (failed, Retry brings them back)", CHANGE, True)
# A worker holds an active job: the remove script leaves a locked one alone anyway.
DELETE = BulkAction("delete", "Delete", "echomq.delete_job", tuple(s for s in STATES if s != "active"),
                    "deleted", DELETION, True)
ACTIONS = {action.name: action for action in (RETRY, CANCEL, DELETE)}
# The finished sets the remove script can be told a job must still be in.
ONLY_FROM = ("delayed", "completed", "failed")


def actions_for(request: HttpRequest, state: str) -> list[BulkAction]:
    """The bulk actions of a browser list that the user may run."""
    return [action for action in ACTIONS.values()
            if state in action.states and request.user.has_perm(action.permission)]


def change(action: BulkAction, queue: Queue, state: str | None, ids: list[str], user: str,
           after: Callable[[BulkOutcome], None] = lambda outcome: None) -> tuple[BulkOutcome, str]:
    """`action` on `ids`, BULK_BATCH per round trip (`after` each); on a Redis error it stops and says why."""
    outcome, problem = BulkOutcome(), ""
    try:
        for start in range(0, len(ids), BULK_BATCH):
            chunk = ids[start:start + BULK_BATCH]
            if action.name == "retry":
                done = queue.retry_many(chunk)
            elif action.name == "cancel":
                done = queue.cancel_many(chunk, reason=f"in the admin by {user}")
            else:
                done = queue.remove_many(chunk, only_from=state if state in ONLY_FROM else None)
            after(done)
            outcome.merge(done)
    except REDIS_ERRORS as error:
        problem = redis_problem(error)
    return outcome, problem


def summary(action: BulkAction, queue_name: str, state: str, asked: int, outcome: BulkOutcome,
            problem: str) -> str:
    """What a bulk action did, in one message."""
    parts = [f"{len(outcome.done)} job(s) {action.done}, of {asked} asked for in queue {queue_name}"]
    for why, ids in outcome.other.items():
        shown = ", ".join(ids[:IDS_SHOWN]) + (", …" if len(ids) > IDS_SHOWN else "")
        if why == STOPPING:  # changed too: flagged
            parts.append(f"{len(ids)} {why}")
            continue
        if why == GONE:
            why = f"no longer {'marked stalled' if state == 'stalled' else state} (moved on or removed meanwhile)"
        parts.append(f"{len(ids)} left alone, {why}: {shown}")
    if problem:
        # The batch that raised may have been run by Redis before its reply was lost: its jobs are each
        # changed whole or not at all, which cannot be told from here.
        parts.append(f"then it stopped: {problem}; of the jobs not counted above, the last batch's "
                     f"(at most {BULK_BATCH}) may have changed, each whole or not at all, and the rest were left alone")
    return "; ".join(parts) + "."


def audit(request: HttpRequest, model: type[models.Model], action: BulkAction, what: str, text: str) -> None:
    """One line in the admin's history for a bulk action, on the list's model (no row: the jobs live in Redis)."""
    LogEntry.objects.create(
        user_id=request.user.pk, content_type=ContentType.objects.get_for_model(model, for_concrete_model=False),
        object_id=None, object_repr=what[:200], action_flag=action.flag, change_message=f"{action.verb}: {text}")


def tell(model_admin: admin.ModelAdmin, request: HttpRequest, action: BulkAction, what: str, asked: int,
         queue_name: str, state: str, outcome: BulkOutcome, problem: str) -> None:
    text = summary(action, queue_name, state, asked, outcome, problem)
    audit(request, model_admin.model, action, what, text)
    level = messages.ERROR if problem else messages.WARNING if set(outcome.other) - {STOPPING} else messages.SUCCESS
    model_admin.message_user(request, text, level)


def bulk_view(model_admin: admin.ModelAdmin, request: HttpRequest, queue_name: str, state: str) -> HttpResponse:
    """A browser list's form: `action` on the ticked ids, the page's ids, or every id in the state."""
    action = ACTIONS.get(request.POST.get("action", ""))
    if action is None:
        raise Http404("the action is one of " + ", ".join(ACTIONS))
    if not request.user.has_perm(action.permission):
        raise PermissionDenied
    if state not in BROWSABLE or state not in action.states:
        raise Http404(f"{action.verb.lower()} is not an action of the {state} list")
    queue = configured_queue(queue_name)
    back = reverse("admin:echomq_job_browse", args=[queue.name, state])
    scope = request.POST.get("scope", "")
    field = {"ticked": "ids", "page": "page_ids"}.get(scope)
    if field is None and scope != "all":
        raise Http404("the scope is ticked, page or all")
    ids = list(dict.fromkeys(request.POST.getlist(field))) if field else []
    if len(ids) > MAX_TICKED:
        raise Http404(f"at most {MAX_TICKED} ids are ticked at once; choose all instead")
    try:
        ids = [validate_stored_id(job_id) for job_id in ids]
    except InvalidNameError as error:
        raise Http404(str(error)) from None
    if field and not ids:
        model_admin.message_user(request, "No job was ticked, so nothing changed.", messages.WARNING)
        return HttpResponseRedirect(back)
    what = (f"queue {queue.name}, {state}: " + ("every job" if scope == "all" else
            "the page's jobs" if scope == "page" else "the ticked jobs"))
    try:
        if not confirmed(request) and (action.asks or scope == "all"):
            count = state_size(queue, state) if scope == "all" else len(ids)
            return ask(model_admin, request, action, count, f"{state} job(s) of queue {queue.name}", back,
                       [("action", action.name), ("scope", scope), *((field or "ids", job_id) for job_id in ids)],
                       names_of(queue, ids))
        model = FailedJob if action is RETRY else JobRecord
        if scope == "all" and (size := state_size(queue, state)) > BACKGROUND_ABOVE:
            run_page = start_background(request, queue, action, state, None, what, model, size)
            return HttpResponseRedirect(run_page or back)
        if scope == "all":
            ids = state_ids(queue, state)
    except REDIS_ERRORS as error:
        model_admin.message_user(request, f"Nothing changed: {redis_problem(error)}", messages.ERROR)
        return HttpResponseRedirect(back)

    outcome, problem = change(action, queue, state, ids, request.user.get_username(),
                              lambda outcome: forget(action.name, model, queue.name, outcome))
    tell(model_admin, request, action, what, len(ids), queue.name, state, outcome, problem)
    return HttpResponseRedirect(back)


def names_of(queue: Queue, ids: list[str]) -> list[str]:
    """The ticked jobs as the confirmation page lists them: id and name."""
    return [f"{read.job_id} ({read.job.name})" if read.job else f"{read.job_id} ({read.problem})"
            for read in read_jobs(queue, ids)]


def ask(model_admin: admin.ModelAdmin, request: HttpRequest, action: BulkAction, count: int, which: str,
        back: str, fields: list[tuple[str, str]], items: list[str]) -> HttpResponse:
    """The confirmation page of a bulk action: how many jobs it changes, and (ticked ones) which."""
    effects = {"retry": "Each runs again, with the attempts it has made so far counted.",
               "cancel": "Each fails for good as cancelled (a running one when its worker next renews its "
                         "lock); Retry brings a cancelled job back.",
               "delete": "Their data, log lines and traces go with them; this cannot be undone."}
    how = (f" More than {BACKGROUND_ABOVE:,} jobs: the queue's workers run it, a few thousand at a time, and a page "
           "shows how far it is." if count > BACKGROUND_ABOVE else "")
    return confirmation(request, model_admin, title=f"{action.verb} {count} job(s)?",
                        question=f"{action.verb} {count} {which}? {effects[action.name]}{how}",
                        button=f"Yes, {action.verb.lower()} {count} job(s)", fields=fields, cancel_url=back,
                        items=items)


def bulk_selected(model_admin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet, action: BulkAction,
                  action_name: str) -> HttpResponse | None:
    """A failed or stalled list's admin action on the rows ticked, or on every row its filters and search match."""
    across = request.POST.get("select_across") == "1"
    state = "failed" if model_admin.model is FailedJob else "stalled"
    if not confirmed(request) and (action.asks or across):
        fields = [("action", action_name), ("select_across", "1" if across else "0"), ("index", "0"),
                  *(("_selected_action", pk) for pk in request.POST.getlist("_selected_action"))]
        ticked = [] if across else [f"{job_id} ({name or 'no name'}) of queue {queue_name}" for queue_name, job_id, name
                                    in queryset.order_by("queue", "job_id").values_list("queue", "job_id", "name")]
        return ask(model_admin, request, action, queryset.count(),
                   f"{state} job(s)" + (", all that the list's filters and search match," if across else ""),
                   request.get_full_path(), fields, ticked)
    by_queue: dict[str, list[str]] = {}
    for queue_name, job_id in queryset.order_by().values_list("queue", "job_id"):
        by_queue.setdefault(queue_name, []).append(job_id)
    texts, worst = [], messages.SUCCESS
    for queue_name, ids in sorted(by_queue.items()):
        if len(ids) > BACKGROUND_ABOVE:
            in_background(model_admin, request, action, state, get_queue(queue_name), ids, across)
            continue
        outcome, problem = change(action, get_queue(queue_name), state, ids, request.user.get_username(),
                                  functools.partial(forget, action.name, model_admin.model, queue_name))
        texts.append(summary(action, queue_name, state, len(ids), outcome, problem))
        worst = max(worst, messages.ERROR if problem else messages.WARNING if set(outcome.other) - {STOPPING}
                    else messages.SUCCESS)
    if texts:
        which = "every job the list matched" if across else "the ticked jobs"
        query = f" ({request.GET.urlencode()})" if request.GET else ""
        audit(request, model_admin.model, action, f"{state} list: {which}{query}", " ".join(texts))
        model_admin.message_user(request, " ".join(texts), worst)
    return None


def in_background(model_admin: admin.ModelAdmin, request: HttpRequest, action: BulkAction, state: str,
                  queue: Queue, ids: list[str], across: bool) -> None:
    """Run a failed or stalled list's action on a queue's many rows as jobs of that queue; a message links its page."""
    which = "every job the list matched" if across else "the ticked jobs"
    query = f" ({request.GET.urlencode()})" if request.GET else ""
    what = f"{state} list, queue {queue.name}: {which}{query}"
    run_page = start_background(request, queue, action, state, ids, what, model_admin.model, len(ids))
    if run_page:
        model_admin.message_user(request, format_html(
            "{} {} job(s) of queue {}: the queue's workers run it, a few thousand jobs at a time; "
            '<a href="{}">see how far it is</a>.', action.verb, f"{len(ids):,}", queue.name, run_page), messages.INFO)
