"""The job browser: every state of every configured queue, paged straight from Redis, and a page per job.

A list is a window of its state's key (core.browse), so a page costs the same
with ten jobs in the state as with a million. A job's page reads its hash, log
lines and state in one step (its durable steps, and a parked job's signal, after).
Retry, promote, cancel, delete and send a signal are POST-only, each behind its
own permission, and go through the Lua scripts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from ..conf import get_settings
from ..core import BROWSABLE, STATES, Cancel, InvalidNameError, Queue, browse, validate_stored_id, waiting_for
from ..models import FailedJob, JobRecord
from ..models import Job as JobModel
from ..queues import get_queue
from .browser_pages import COLUMNS, STATE_COLUMNS, job_sections, page_links, table_row
from .bulk import actions_for, bulk_view
from .bulk_runs import run_view
from .common import JOB_ERRORS, REDIS_ERRORS, configured_queue, confirmation, confirmed, redis_problem
from .durable import UNFINISHED, parked_columns, parked_facts, signal_sender, steps_section
from .mirror_lists import live_jobs
from .workflows import cancel_workflow_view, workflow_view

PAGE_SIZE = 50
# The newest log lines a job's page shows, each cut at MAX_LOG_LINE_CHARS as Job.log writes them (log_line).
PAGE_LOG_LINES = 100
# A Redis list or sorted set holds fewer than 2**32 items, so a page past that is past the end of
# any state; capping the position keeps the LRANGE argument a number Redis takes.
MAX_POSITION = 2**32


@dataclass(frozen=True)
class Action:
    """A button of a job's page: the permission it needs and the states it works in."""

    name: str  # its URL segment, and the end of its URL name
    label: str
    permission: str
    states: tuple[str | None, ...]  # None: a job hash that is in no state
    works_on: str  # the states, in words
    done: str  # what it does, in the past tense


RETRY = Action("retry", "Retry", "echomq.retry_failedjob", ("failed",), "a failed job", "retried")
PROMOTE = Action("promote", "Promote now", "echomq.promote_job", ("delayed",), "a delayed job", "promoted")
# A running job is flagged, and its worker stops it at its next lock renewal.
CANCEL = Action("cancel", "Cancel", "echomq.cancel_job",
                ("wait", "paused", "prioritized", "delayed", "deferred", "parked", "active"),
                "a job that has not finished", "cancelled")
# A worker holds an active job: deleting it would drop the worker's result on the floor.
DELETE = Action("delete", "Delete…", "echomq.delete_job", (*(s for s in STATES if s != "active"), None),
                "a job that is not active", "deleted")
ACTIONS = (RETRY, PROMOTE, CANCEL, DELETE)
# A form of its own on the job's page (a name and a JSON payload), not a button of ACTIONS.
SIGNAL = Action("signal", "Send signal", "echomq.signal_job", UNFINISHED, "a job that has not finished",
                "sent a signal")
Outcome = tuple[str, int, str | None]  # what happened, the message level, where to go (None: the job's page)


def job_id_or_404(job_id: str) -> str:
    try:
        return validate_stored_id(job_id)
    except InvalidNameError as error:
        raise Http404(str(error)) from None


def number_or_404(text: str, low: int, high: int) -> int:
    """A page number or cursor of the query string, from `low` up to `high`; 404 for anything else."""
    try:
        number = int(text)
    except ValueError:
        raise Http404("not a whole number") from None
    if not low <= number < high:
        raise Http404(f"{number} is out of range")
    return number


@admin.register(JobModel)
class JobBrowserAdmin(admin.ModelAdmin):
    """The browser's pages; the model has no table, so none of the row-id pages exist."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        def page(view: Any) -> Any:
            return self.admin_site.admin_view(view)

        def change(view: Any) -> Any:
            return self.admin_site.admin_view(require_POST(view))

        job = "<str:queue_name>/job/<str:job_id>/"
        return [
            path("", page(self.changelist_view), name="echomq_job_changelist"),
            path(job, page(self.job_view), name="echomq_job_detail"),
            path(job + "retry/", change(self.retry_job_view), name="echomq_job_retry"),
            path(job + "promote/", change(self.promote_job_view), name="echomq_job_promote"),
            path(job + "cancel/", change(self.cancel_job_view), name="echomq_job_cancel"),
            path(job + "delete/", change(self.delete_job_view), name="echomq_job_delete"),
            path(job + "signal/", change(self.signal_job_view), name="echomq_job_signal"),
            path("<str:queue_name>/<str:state>/", page(self.browse_view), name="echomq_job_browse"),
            path("<str:queue_name>/<str:state>/bulk/", change(
                lambda request, **names: bulk_view(self, request, **names)), name="echomq_job_bulk"),
            path("<str:queue_name>/bulk-run/<str:run_id>/", page(
                lambda request, **names: run_view(self, request, **names)), name="echomq_bulk_run"),
            path("<str:queue_name>/workflow/<str:workflow_id>/", page(
                lambda request, **names: workflow_view(self, request, **names)), name="echomq_workflow_detail"),
            path("<str:queue_name>/workflow/<str:workflow_id>/cancel/", change(
                lambda request, **names: cancel_workflow_view(self, request, **names)), name="echomq_workflow_cancel"),
        ]

    def page(self, request: HttpRequest, template: str, title: str, status: int = 200, **context: Any) -> HttpResponse:
        """A page of the browser (the view has checked the permission)."""
        context = {**self.admin_site.each_context(request), "opts": self.opts, "title": title, **context}
        return TemplateResponse(request, f"admin/echomq/{template}", context, status=status)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """Find a job by queue and id, or open a state's list."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            names, settings_error = list(get_settings().queues), ""
        except ImproperlyConfigured as error:  # `manage.py check` names it too, but not every deploy runs it
            names, settings_error = [], str(error)
        queue_name, job_id = request.GET.get("queue", ""), request.GET.get("id", "").strip()
        problem = self.lookup_problem(queue_name, job_id, names) if "id" in request.GET else ""
        if "id" in request.GET and not problem:
            return HttpResponseRedirect(reverse("admin:echomq_job_detail", args=[queue_name, job_id]))
        queues = [(name, [(state, reverse("admin:echomq_job_browse", args=[name, state])) for state in BROWSABLE])
                  for name in names]
        return self.page(request, "job_lookup.html", "Jobs", settings_error=settings_error, problem=problem,
                         queues=queues, asked_queue=queue_name, asked_id=job_id)

    def lookup_problem(self, queue_name: str, job_id: str, names: list[str]) -> str:
        """Why the job asked for cannot be shown; "" when it can."""
        if queue_name not in names:
            return "Choose one of the configured queues."
        try:
            job, state = get_queue(queue_name).get_job_with_state(validate_stored_id(job_id), log_lines=0)
        except InvalidNameError as error:
            return f"No job can have that id: {error}."
        except REDIS_ERRORS as error:
            return f"The job could not be looked up: {redis_problem(error)}"
        if job is None and state is None:
            return f"Queue {queue_name} has no job {job_id!r} (never added, deleted, or removed by retention)."
        return ""

    def browse_view(self, request: HttpRequest, queue_name: str, state: str) -> HttpResponse:
        """One page of the jobs in one state of a queue, read from Redis now."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if state not in BROWSABLE:
            raise Http404(f"a state is one of {', '.join(BROWSABLE)}")
        queue = configured_queue(queue_name)
        links = [(name, reverse("admin:echomq_job_browse", args=[queue.name, name])) for name in BROWSABLE]
        try:
            if state == "stalled":  # a SET: its pages follow an SSCAN cursor, not positions
                cursor = number_or_404(request.GET.get("cursor", "0"), 0, 2**64)
                page = browse(queue, state, cursor, PAGE_SIZE)
                paging = {"first_url": "?cursor=0" if cursor else None,
                          "next_url": "?" + urlencode({"cursor": page.next_start}) if page.next_start else None}
            else:
                number = number_or_404(request.GET.get("p", "1"), 1, 10**30)
                page = browse(queue, state, min((number - 1) * PAGE_SIZE, MAX_POSITION), PAGE_SIZE)
                last = max(1, -(-page.total // PAGE_SIZE))
                if number > last:  # past the end, or the state shrank since the link was made: its last page
                    number = last
                    page = browse(queue, state, (last - 1) * PAGE_SIZE, PAGE_SIZE)
                paging = page_links(number, last)
            extra = parked_columns(queue, page.entries) if state == "parked" else STATE_COLUMNS.get(state, ())
        except REDIS_ERRORS as error:
            return self.page(request, "job_browser.html", f"Queue {queue.name}: {state}", queue_name=queue.name,
                             state=state, state_links=links, unread=redis_problem(error))
        columns = (*COLUMNS, *extra)
        # The mirror's changelists of these two sets search and filter, which a window of Redis cannot.
        mirror = {"failed": "failedjob", "stalled": "stalledjob"}.get(state)
        mirror_url = (reverse(f"admin:echomq_{mirror}_changelist") + "?" + urlencode({"queue": queue.name})
                      if mirror and request.user.has_perm(f"echomq.view_{mirror}") else None)
        rows = [table_row(queue.name, entry, columns) for entry in page.entries]
        bulk = actions_for(request, state) if page.total else []
        return self.page(request, "job_browser.html", f"Queue {queue.name}: {state}", queue_name=queue.name,
                         state=state, state_links=links, total=page.total, paging=paging, mirror_url=mirror_url,
                         headers=[header for header, _ in columns], rows=rows, bulk_actions=bulk,
                         bulk_url=reverse("admin:echomq_job_bulk", args=[queue.name, state]) if bulk else None)

    def job_view(self, request: HttpRequest, queue_name: str, job_id: str) -> HttpResponse:
        """Everything Redis holds about one job, and the buttons its state and the user allow."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        queue, job_id = configured_queue(queue_name), job_id_or_404(job_id)
        title = f"Job {job_id} of queue {queue.name}"
        try:
            job, state = queue.get_job_with_state(job_id, log_lines=PAGE_LOG_LINES)
            due_ms = queue.client.zscore(queue.keys.delayed, job_id) if state == "delayed" else None
            live = live_jobs(queue.name, [job_id])[0] if state == "active" else None
            signal, deadline_ms = waiting_for(queue, [job_id])[0] if state == "parked" else (None, None)
        except REDIS_ERRORS as error:
            return self.page(request, "job_page.html", title, queue_name=queue.name, job_id=job_id,
                             unread=redis_problem(error))
        if job is None and state is None:
            return self.page(request, "job_page.html", title, status=404, queue_name=queue.name, job_id=job_id,
                             missing=True)
        # An id without a job hash can only be deleted: there is nothing to retry, promote or cancel.
        actions = [(action.label, reverse(f"admin:echomq_job_{action.name}", args=[queue.name, job_id]))
                   for action in ACTIONS if state in action.states and request.user.has_perm(action.permission)
                   and (job is not None or action is DELETE)]
        workflow_url = (reverse("admin:echomq_workflow_detail", args=[job.workflow_queue, job.workflow_id])
                        if job and job.workflow_id and job.workflow_queue else None)
        signal_url = (reverse("admin:echomq_job_signal", args=[queue.name, job_id]) if job and state in SIGNAL.states
                      and request.user.has_perm(SIGNAL.permission) else None)
        return self.page(request, "job_page.html", title, queue_name=queue.name, job_id=job_id, state=state,
                         state_url=reverse("admin:echomq_job_browse", args=[queue.name, state]) if state else None,
                         workflow_url=workflow_url, workflow_id=job.workflow_id if job else None,
                         actions=actions, signal_url=signal_url, signal_name=signal or "",
                         parked=parked_facts(signal, deadline_ms) if state == "parked" else [],
                         steps=steps_section(queue, job_id) if job else None,
                         **(job_sections(job, state, due_ms, live) if job else {"no_hash": True}))

    def act(self, request: HttpRequest, queue_name: str, job_id: str, action: Action,
            change: Callable[[Queue, str | None], Outcome],
            ask: Callable[[str | None], HttpResponse] | None = None) -> HttpResponse:
        """Check the permission, the names and the job's state, then `change` it (after `ask`, if given)."""
        if not request.user.has_perm(action.permission):
            raise PermissionDenied
        queue, job_id = configured_queue(queue_name), job_id_or_404(job_id)
        try:
            state = queue.get_state(job_id)
            if state not in action.states:
                outcome, level, then = (f"is in {state or 'no state'}, and only {action.works_on} can be "
                                        f"{action.done}; it was left alone"), messages.WARNING, None
            elif ask and not confirmed(request):
                return ask(state)
            else:
                outcome, level, then = change(queue, state)
        except JOB_ERRORS as error:
            outcome, level, then = f"was left alone: {redis_problem(error)}", messages.ERROR, None
        self.message_user(request, f"Job {job_id} of {queue.name} {outcome}.", level)
        return HttpResponseRedirect(then or reverse("admin:echomq_job_detail", args=[queue.name, job_id]))

    def retry_job_view(self, request: HttpRequest, queue_name: str, job_id: str) -> HttpResponse:
        def retry(queue: Queue, state: str | None) -> Outcome:
            if not queue.retry(job_id):
                if queue.get_state(job_id) == "failed" and queue.client.hexists(queue.keys.job(job_id), "deps"):
                    return ("is a workflow's step whose inputs did not all come and stays failed",
                            messages.WARNING, None)  # the script answered -2
                if queue.get_state(job_id) == "failed":  # the script answered -1: no job hash to run
                    return "has no job hash to run and stays failed (delete it)", messages.WARNING, None
                return "was no longer failed and was left alone", messages.WARNING, None
            FailedJob.objects.filter(queue=queue.name, job_id=job_id).delete()  # the mirror's copy
            return "was sent back to wait", messages.SUCCESS, None

        return self.act(request, queue_name, job_id, RETRY, retry)

    def promote_job_view(self, request: HttpRequest, queue_name: str, job_id: str) -> HttpResponse:
        def promote(queue: Queue, state: str | None) -> Outcome:
            if queue.promote(job_id):
                return "was promoted: it is ready to run now", messages.SUCCESS, None
            return "was no longer delayed and was left alone", messages.WARNING, None

        return self.act(request, queue_name, job_id, PROMOTE, promote)

    def cancel_job_view(self, request: HttpRequest, queue_name: str, job_id: str) -> HttpResponse:
        def cancel(queue: Queue, state: str | None) -> Outcome:
            done = queue.cancel(job_id, reason=f"in the admin by {request.user.get_username()}")
            if done is Cancel.CANCELLED:
                return "was cancelled: it is failed now, and Retry sends it back", messages.SUCCESS, None
            if done is Cancel.STOPPING:
                return ("is running, and is being cancelled: its worker stops it at its next lock renewal "
                        "(a job on the threads pool stops at its next check), and it fails for good"), \
                    messages.SUCCESS, None
            if done is Cancel.FINISHED:
                return "finished meanwhile and was left alone", messages.WARNING, None
            if queue.get_job(job_id, log_lines=0) is None:  # the script answered -1
                return f"had no job hash: its id was taken out of {state}", messages.WARNING, None
            return "left its state meanwhile and was left alone", messages.WARNING, None

        return self.act(request, queue_name, job_id, CANCEL, cancel)

    def signal_job_view(self, request: HttpRequest, queue_name: str, job_id: str) -> HttpResponse:
        return self.act(request, queue_name, job_id, SIGNAL, signal_sender(request, job_id))

    def delete_job_view(self, request: HttpRequest, queue_name: str, job_id: str) -> HttpResponse:
        def ask(state: str | None) -> HttpResponse:
            return confirmation(request, self, title=f"Delete job {job_id}?", button="Yes, delete it",
                                question=f"Delete job {job_id} of queue {queue_name} ({state or 'in no state'}) "
                                         "from Redis? Its data, log lines and traces go with it; "
                                         "this cannot be undone.")

        def delete(queue: Queue, state: str | None) -> Outcome:
            removed = queue.remove(job_id)  # JobLockedError if a worker took it since the state was read
            JobRecord.objects.filter(queue=queue.name, job_id=job_id).delete()  # the mirror's copy, if any
            back = (reverse("admin:echomq_job_browse", args=[queue.name, state]) if state
                    else reverse("admin:echomq_job_changelist"))
            return ("was deleted" if removed else "was already gone"), messages.SUCCESS, back

        return self.act(request, queue_name, job_id, DELETE, delete, ask)
