"""The queue dashboard: one row per configured queue, with its counts and buttons, and its charts.

Sweep now (`sweep_queue`), pause and resume (`pause_queue`), retry all failed
(`retry_failedjob`) and clean failed (`delete_failedjob`) are POST-only; the
bulk ones run only on the POST of a confirmation page. Each count links to
its list in the job browser (`view_job`). With `view_metrics`, each queue has
two charts, throughput and waiting jobs, over the last hour or day
(`?range=day`). The page reloads itself every REFRESH_SECONDS unless
`?refresh=0`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from ..conf import get_settings
from ..core import (
    COUNTED,
    UNREACHABLE,
    Queue,
    count_failed_older_than,
    failed_count,
    recent_minutes,
)
from ..mirror import sync_queue
from ..models import FailedJob
from ..models import Queue as QueueModel
from ..outbox import QueueOutbox
from ..queues import get_queue, make_sweeper
from ..status import describe_abandoned, describe_outbox, describe_sweep, queue_status, read_outbox
from .bulk import DELETE, RETRY, BulkAction, audit
from .charts_context import HOUR, SPANS, Span, queue_charts, slot_metrics
from .common import REDIS_ERRORS, configured_queue, confirmation, confirmed, redis_problem

DAY_MS = 86_400_000
# A century: more is surely a typo, and days * DAY_MS must stay a number Redis takes.
MAX_CLEAN_DAYS = 36_500
# How often the dashboard reloads itself, unless ?refresh=0.
REFRESH_SECONDS = 30  # as often as a sweep samples the waiting depth by default; a typed value survives a while
# The states whose counts make the waiting depth: ready, not taken (as the sweep samples it).
WAITING_STATES = ("wait", "prioritized", "paused")


@admin.register(QueueModel)
class QueueAdmin(admin.ModelAdmin):
    """The dashboard: one row per configured queue, with its buttons."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        def view(function: Any) -> Any:
            return self.admin_site.admin_view(require_POST(function))

        # No row-id pages: the model has no table, so there is nothing for /1/change/ to show.
        return [
            path("", self.admin_site.admin_view(self.changelist_view), name="echomq_queue_changelist"),
            path("<str:queue_name>/sweep/", view(self.sweep_now), name="echomq_queue_sweep"),
            path("<str:queue_name>/pause/", view(self.pause), name="echomq_queue_pause"),
            path("<str:queue_name>/resume/", view(self.resume), name="echomq_queue_resume"),
            path("<str:queue_name>/retry-failed/", view(self.retry_all_failed), name="echomq_queue_retry_failed"),
            path("<str:queue_name>/clean-failed/", view(self.clean_failed), name="echomq_queue_clean_failed"),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        user = request.user
        try:
            settings = get_settings()
            names, settings_error = list(settings.queues), ""
        except ImproperlyConfigured as error:  # `manage.py check` names it too, but not every deploy runs it
            settings, names, settings_error = None, [], str(error)
        span = SPANS.get(request.GET.get("range", ""), HOUR)
        refresh = request.GET.get("refresh") != "0"
        # Charts need their permission, and metrics kept: without them the page reads none.
        metrics_minutes = settings.metrics_minutes if settings else 0
        charted = user.has_perm("echomq.view_metrics") and metrics_minutes > 0
        rows = self.queue_rows(names, span if charted else None, min(span.minutes, metrics_minutes))
        context = {
            **self.admin_site.each_context(request),
            "title": "Queues",
            "opts": self.model._meta,
            "settings_error": settings_error,
            "queues": rows,
            # One header per counted state, from the same tuple as the cells (a state added is a column added).
            "state_headers": ["marked stalled" if state == "stalled" else state for state in COUNTED],
            "span_columns": len(COUNTED) + 2,  # the counts, the workers and the last sweep
            "can_view_workers": user.has_perm("echomq.view_worker"),
            "flow_queues": [row for row in rows if row.get("flow")],
            "can_sweep": user.has_perm("echomq.sweep_queue"),
            "can_pause": user.has_perm("echomq.pause_queue"),
            "can_retry": user.has_perm("echomq.retry_failedjob"),
            "can_clean": user.has_perm("echomq.delete_failedjob"),
            "can_view_jobs": user.has_perm("echomq.view_job"),
            "can_view_failed": user.has_perm("echomq.view_failedjob"),
            "can_view_stalled": user.has_perm("echomq.view_stalledjob"),
            "can_view_metrics": user.has_perm("echomq.view_metrics"),
            "can_view_outbox": user.has_perm("echomq.view_outboxjob"),
            "metrics_off": settings is not None and metrics_minutes == 0,
            **page_controls(span, refresh),
        }
        return TemplateResponse(request, "admin/echomq/queue_dashboard.html", context)

    def queue_rows(self, names: list[str], span: Span | None = None, read_minutes: int = 0) -> list[dict[str, Any]]:
        """The dashboard's lines; once Redis has not answered for one queue, the rest say so without waiting.

        With a `span`, each line has its charts too, from its last `read_minutes` of metrics.
        """
        rows: list[dict[str, Any]] = []
        outbox = read_outbox()
        for name in names:
            unreachable = next((row["error"] for row in rows if row.get("unreachable")), None)
            if unreachable:
                rows.append({"name": name, "error": unreachable, "unreachable": True})
                continue
            row = self.queue_row(name, outbox)
            if span and "counts" in row:
                row.update(self.queue_charts(name, row["counts"], span, read_minutes))
            rows.append(row)
        return rows

    def queue_row(self, name: str, outbox: dict[str, QueueOutbox] | None) -> dict[str, Any]:
        """One queue's line of the dashboard; `error` instead of counts when one of its keys is broken."""
        try:
            status = queue_status(name, outbox=outbox)  # what echomq_status shows, read the same way
        except REDIS_ERRORS as error:  # out of reach: a page says so rather than failing
            return {"name": name, "error": redis_problem(error), "unreachable": isinstance(error, UNREACHABLE)}
        if "error" in status:
            return {"name": name, "error": status["error"]}
        counts, flow = status["counts"], status["flow"]
        limited = any(flow[key] for key in ("rate_limit", "max_active", "group_max_active", "paused_for_s",
                                            "groups_waiting", "groups_active"))
        return {"name": name, "counts": counts, "paused": status["paused"],
                "cells": [{"state": state, "count": counts[state]} for state in COUNTED],
                "last_sweep": describe_sweep(status["last_sweep"]), "flow": flow if limited else None,
                "abandoned": describe_abandoned(status["abandoned_threads"]),
                "workers": len(status["workers"]), "warnings": status["warnings"],
                "busy_slots": sum(len(worker["running"]) for worker in status["workers"]),
                "slots": sum(worker["concurrency"] for worker in status["workers"]),
                "outbox": describe_outbox(status["outbox"]), "outbox_unsent": bool(
                    status["outbox"]["stale"] or status["outbox"]["refused"])}

    def queue_charts(self, name: str, counts: dict[str, int], span: Span, read_minutes: int) -> dict[str, Any]:
        """A queue's charts over `span`, from one pipelined read of its metrics; `charts_error` when unread."""
        try:
            minutes = recent_minutes(get_queue(name), read_minutes)
        except REDIS_ERRORS as error:
            return {"charts_error": redis_problem(error)}
        live_waiting = sum(counts[state] for state in WAITING_STATES)
        return {"charts": queue_charts(name, slot_metrics(minutes, span, live_waiting=live_waiting), span)}

    def _queue_for(self, request: HttpRequest, queue_name: str, permission: str) -> Queue:
        """The configured queue named in the URL, if the user has `permission`."""
        if not request.user.has_perm(permission):
            raise PermissionDenied
        return configured_queue(queue_name)

    def _back(self) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:echomq_queue_changelist"))

    def _operate(self, request: HttpRequest, queue: Queue, operation: Callable[[], str],
                 audited: BulkAction | None = None) -> HttpResponse:
        """Run one button's operation and bring the mirror up to date; its outcome becomes a message.

        A bulk one (`audited`) leaves its outcome in the admin's history, as the lists' bulk actions do.
        """
        try:
            summary = operation()
            sync_queue(queue)
        except REDIS_ERRORS as error:
            self.message_user(request, f"Queue {queue.name}: {redis_problem(error)}", messages.ERROR)
        else:
            if audited is not None:
                audit(request, FailedJob, audited, f"queue {queue.name}: failed jobs", summary)
            self.message_user(request, summary, messages.SUCCESS)
        return self._back()

    def _confirm(self, request: HttpRequest, queue: Queue, count: Callable[[], int], ask: Callable[[int], str],
                 **options: Any) -> HttpResponse:
        """The confirmation page of a bulk button, saying how many jobs it would change now."""
        try:
            found = count()
        except REDIS_ERRORS as error:
            self.message_user(request, f"Queue {queue.name}: {redis_problem(error)}", messages.ERROR)
            return self._back()
        return confirmation(request, self, question=ask(found), **options)

    def sweep_now(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        queue = self._queue_for(request, queue_name, "echomq.sweep_queue")

        def sweep() -> str:
            sweeper = make_sweeper([queue.name], long_running=False)
            return sweeper.sweep(sweeper.targets[0], force=True).summary()

        return self._operate(request, queue, sweep)

    def pause(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        queue = self._queue_for(request, queue_name, "echomq.pause_queue")

        def pause() -> str:
            queue.pause()
            return f"Queue {queue.name} paused: workers take none of its jobs until it is resumed; running jobs finish."

        return self._operate(request, queue, pause)

    def resume(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        queue = self._queue_for(request, queue_name, "echomq.pause_queue")

        def resume() -> str:
            queue.resume()
            return f"Queue {queue.name} resumed: workers take its jobs again."

        return self._operate(request, queue, resume)

    def retry_all_failed(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        queue = self._queue_for(request, queue_name, "echomq.retry_failedjob")
        if not confirmed(request):
            return self._confirm(
                request, queue, lambda: failed_count(queue),
                lambda found: f"Send all {found} failed job(s) of queue {queue.name} back to wait? "
                              "Each runs again, with the attempts it has made so far counted.",
                title=f"Retry every failed job of {queue.name}?", button="Yes, retry them all")
        return self._operate(request, queue, lambda: (
            f"{queue.retry_all_failed()} failed job(s) of {queue.name} sent back to wait."), audited=RETRY)

    def clean_failed(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        queue = self._queue_for(request, queue_name, "echomq.delete_failedjob")
        try:
            days = float(request.POST.get("days", ""))
            if not 0 <= days <= MAX_CLEAN_DAYS:  # also refuses nan
                raise ValueError
        except ValueError:
            self.message_user(request, f"Give the age in days as a number from 0 to {MAX_CLEAN_DAYS}.",
                              messages.ERROR)
            return self._back()
        older_than_ms = round(days * DAY_MS)
        if not confirmed(request):
            # "before now", not "all": a job another client scored in the future stays.
            which = " that failed before now" if days == 0 else f" that failed more than {days:g} day(s) ago"
            return self._confirm(
                request, queue, lambda: count_failed_older_than(queue, older_than_ms),
                lambda found: f"Delete {found} failed job(s) of queue "
                              f"{queue.name}{which}? Their data and traces go too; this cannot be undone.",
                title=f"Delete failed jobs of {queue.name}?", button="Yes, delete them",
                fields={"days": request.POST["days"]})
        return self._operate(request, queue, lambda: (
            f"{queue.clean('failed', older_than_ms)} failed job(s) of {queue.name} "
            f"older than {days:g} day(s) deleted."), audited=DELETE)


def page_controls(span: Span, refresh: bool) -> dict[str, Any]:
    """The links that switch the charts' span and the self-refresh, each keeping the other's choice."""
    return {"span": span, "spans": [(other, dashboard_url(other, refresh)) for other in SPANS.values()],
            "refreshing": refresh, "refresh_seconds": REFRESH_SECONDS,
            "refresh_toggle_url": dashboard_url(span, not refresh)}


def dashboard_url(span: Span, refresh: bool) -> str:
    """The dashboard over `span`, reloading itself or not; the defaults stay out of the query."""
    query = {}
    if span is not HOUR:
        query["range"] = span.key
    if not refresh:
        query["refresh"] = "0"
    url = reverse("admin:echomq_queue_changelist")
    return f"{url}?{urlencode(query)}" if query else url
