"""The admin: a queue dashboard, the stalled set and the failed set.

The failed and stalled lists are changelists over the mirror (JobRecord rows,
searchable and filterable); every change goes through the Lua scripts first,
so Redis stays the source of truth. Changes are POST-only, CSRF-protected and
need their own permission: retry (`retry_failedjob`), delete
(`delete_failedjob`), sweep now (`sweep_queue`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from django.views.decorators.http import require_POST
from redis.exceptions import ResponseError

from .conf import get_settings
from .core import InvalidNameError, JobLockedError, JobOptions, QueueStateError, validate_name
from .core.job import options_from_json
from .management.commands.echomq_status import describe_sweep, queue_status
from .mirror import sync_queue
from .models import FailedJob, JobRecord, Queue, StalledJob
from .queues import get_queue, make_sweeper

DAY_MS = 86_400_000
# A century: more is surely a typo, and days * DAY_MS must stay a number Redis takes.
MAX_CLEAN_DAYS = 36_500
# What a job or queue can answer instead of doing what it was asked: its id or
# name is outside the alphabet, a key holds another Redis type, a worker holds it.
JOB_ERRORS = (InvalidNameError, QueueStateError, ResponseError, JobLockedError)


def pretty_json(value: Any) -> str:
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False, default=str))


class MirrorAdmin(admin.ModelAdmin):
    """Read-only views of mirror rows: rows change only through the scripts and the sync."""

    # Exact id, name prefix (both use an index) and a substring of the reason.
    search_fields = ("=job_id", "^name", "failed_reason")
    list_filter = ("queue", "name")
    list_per_page = 100
    show_full_result_count = False  # no COUNT(*) over 100,000 rows on every page

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="data")
    def pretty_data(self, obj: JobRecord) -> str:
        return pretty_json(obj.data)

    @admin.display(description="options")
    def pretty_opts(self, obj: JobRecord) -> str:
        return pretty_json(obj.opts)

    @admin.display(description="stack traces")
    def pretty_stacktrace(self, obj: JobRecord) -> str:
        traces = obj.stacktrace or []
        return format_html("<pre>{}</pre>", "\n\n".join(map(str, traces))) if traces else "-"


@admin.register(FailedJob)
class FailedJobAdmin(MirrorAdmin):
    list_display = ("job_id", "queue", "name", "reason", "attempts_made", "finished_at")
    # No date_hierarchy: its year/month links need a scan of every row.
    list_filter = ("queue", "name", "finished_at")
    ordering = ("-finished_at",)
    actions = ["retry_selected", "delete_selected"]
    fields = ("queue", "job_id", "name", "attempts_made", "stall_count", "created_at", "processed_at",
              "finished_at", "synced_at", "failed_reason", "pretty_data", "pretty_opts", "pretty_stacktrace")
    readonly_fields = fields

    @admin.display(description="reason", ordering="failed_reason")
    def reason(self, obj: JobRecord) -> str:
        reason = obj.failed_reason
        return reason if len(reason) <= 120 else reason[:119] + "…"

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("echomq.retry_failedjob")

    @admin.action(permissions=["retry"], description="Retry selected jobs")
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        retried, gone = 0, []
        for record in queryset:
            try:
                if get_queue(record.queue).retry(record.job_id):
                    retried += 1
                else:
                    gone.append(record.job_id)
            except JOB_ERRORS as error:
                self.message_user(request, f"Job {record.job_id!r} was left alone: {error}", messages.ERROR)
                continue
            record.delete()  # either way it is no longer in failed
        self.message_user(request, f"{retried} job(s) sent back to wait.", messages.SUCCESS)
        if gone:
            self.message_user(request, f"{len(gone)} job(s) were no longer failed and were left alone: "
                              f"{', '.join(gone[:20])}", messages.WARNING)

    def delete_model(self, request: HttpRequest, obj: JobRecord) -> None:
        """Delete the job from Redis (only while it is still failed), then its row."""
        try:
            get_queue(obj.queue).remove(obj.job_id, only_from="failed")
        except JOB_ERRORS as error:
            self.message_user(request, f"Job {obj.job_id!r} was not deleted: {error}", messages.ERROR)
            return
        obj.delete()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for record in queryset:
            self.delete_model(request, record)


class StalledChangeList(ChangeList):
    """Adds what only Redis knows now to each listed row: lock TTL, time in active, next sweep's verdict."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        rows = list(self.result_list)
        by_queue: dict[str, list[JobRecord]] = {}
        for row in rows:
            by_queue.setdefault(row.queue, []).append(row)
        now_ms = time.time() * 1000
        for queue_name, records in by_queue.items():
            queue = get_queue(queue_name)
            config = get_settings().queue(queue_name)
            pipe = queue.client.pipeline(transaction=False)
            for record in records:
                pipe.hmget(queue.keys.job(record.job_id), "atm", "stc", "opts", "processedOn")
                pipe.pttl(queue.keys.lock(record.job_id))
                pipe.sismember(queue.keys.stalled, record.job_id)
            replies = pipe.execute(raise_on_error=False)
            for index, record in enumerate(records):
                fields, ttl, marked = replies[3 * index: 3 * index + 3]
                if any(isinstance(reply, Exception) for reply in (fields, ttl, marked)):
                    record.live_verdict = "unknown: a key of this job holds another Redis type"
                    continue
                atm, stc, opts, processed_on = fields
                record.live_ttl_ms = ttl
                record.live_in_active_s = seconds_since(processed_on, now_ms)
                record.live_verdict = next_sweep_verdict(atm, stc, opts, ttl, marked, config.max_stalled_count,
                                                         config.attempts)


def seconds_since(started_ms: str | None, now_ms: float) -> float | None:
    """Seconds from a job hash's ms timestamp to now; None when another client wrote no number there."""
    if not started_ms:
        return None
    try:
        started = float(started_ms)
    except ValueError:
        return None
    return (now_ms - started) / 1000 if math.isfinite(started) else None


def next_sweep_verdict(atm: str | None, stc: str | None, opts: str | None, ttl: int, marked: bool,
                       max_stalled_count: int, default_attempts: int) -> str:
    """What the next sweep will do with a marked job, decided as the sweep script decides it."""
    if not marked:
        return "nothing: no longer marked"
    if ttl != -2:
        return "unmark it: its lock is back"
    try:
        attempts_made, stalls = int(atm or 0) + 1, int(stc or 0) + 1
    except ValueError:
        return "fail it: its counters are not integers"
    try:
        options = options_from_json(json.loads(opts)) if opts else JobOptions(attempts=default_attempts)
    except (ValueError, RecursionError):
        return "fail it: its opts are not JSON"
    if attempts_made >= options.attempts:
        return f"fail it: attempt ceiling ({attempts_made} of {options.attempts})"
    if stalls > max_stalled_count:
        return f"fail it: stall ceiling ({stalls} stalls, max {max_stalled_count})"
    return "recover it to wait"


@admin.register(StalledJob)
class StalledJobAdmin(MirrorAdmin):
    list_display = ("job_id", "queue", "name", "attempts_made", "time_in_active", "lock_ttl", "next_sweep")
    ordering = ("queue", "job_id")
    fields = ("queue", "job_id", "name", "attempts_made", "stall_count", "created_at", "processed_at",
              "synced_at", "pretty_data", "pretty_opts")
    readonly_fields = fields
    actions = None

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return StalledChangeList

    @admin.display(description="time in active")
    def time_in_active(self, obj: JobRecord) -> str:
        seconds = getattr(obj, "live_in_active_s", None)
        return "-" if seconds is None else f"{seconds:.0f} s"

    @admin.display(description="lock TTL")
    def lock_ttl(self, obj: JobRecord) -> str:
        ttl = getattr(obj, "live_ttl_ms", -2)
        return "gone" if ttl == -2 else f"{ttl / 1000:.1f} s"

    @admin.display(description="next sweep will")
    def next_sweep(self, obj: JobRecord) -> str:
        return getattr(obj, "live_verdict", "-")


@admin.register(Queue)
class QueueAdmin(admin.ModelAdmin):
    """The dashboard: one row per configured queue, with its buttons."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        def view(function: Any) -> Any:
            return self.admin_site.admin_view(require_POST(function))

        return [
            path("<str:queue_name>/sweep/", view(self.sweep_now), name="echomq_queue_sweep"),
            path("<str:queue_name>/retry-failed/", view(self.retry_all_failed), name="echomq_queue_retry_failed"),
            path("<str:queue_name>/clean-failed/", view(self.clean_failed), name="echomq_queue_clean_failed"),
            *super().get_urls(),
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        user = request.user
        try:
            names, settings_error = list(get_settings().queues), ""
        except ImproperlyConfigured as error:  # `manage.py check` names it too, but not every deploy runs it
            names, settings_error = [], str(error)
        context = {
            **self.admin_site.each_context(request),
            "title": "Queues",
            "opts": self.model._meta,
            "settings_error": settings_error,
            "queues": [self.queue_row(name) for name in names],
            "can_sweep": user.has_perm("echomq.sweep_queue"),
            "can_retry": user.has_perm("echomq.retry_failedjob"),
            "can_clean": user.has_perm("echomq.delete_failedjob"),
            "can_view_failed": user.has_perm("echomq.view_failedjob"),
            "can_view_stalled": user.has_perm("echomq.view_stalledjob"),
        }
        return TemplateResponse(request, "admin/echomq/queue_dashboard.html", context)

    def queue_row(self, name: str) -> dict[str, Any]:
        """One queue's line of the dashboard; `error` instead of counts when one of its keys is broken."""
        status = queue_status(name)  # what echomq_status shows, read the same way
        if "error" in status:
            return {"name": name, "error": status["error"]}
        return {"name": name, "counts": status["counts"], "paused": status["paused"],
                "last_sweep": describe_sweep(status["last_sweep"])}

    def _queue_for(self, request: HttpRequest, queue_name: str, permission: str) -> Any:
        """The configured queue named in the URL, if the user has `permission`."""
        if not request.user.has_perm(permission):
            raise PermissionDenied
        try:
            configured = get_settings().queues
            validate_name(queue_name, "queue name")
        except (ImproperlyConfigured, InvalidNameError) as error:
            raise Http404(str(error)) from None
        if queue_name not in configured:
            raise Http404("only configured queues are operated from the admin")
        return get_queue(queue_name)

    def _back(self) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:echomq_queue_changelist"))

    def _operate(self, request: HttpRequest, queue: Any, operation: Callable[[], str]) -> HttpResponse:
        """Run one button's operation and bring the mirror up to date; its outcome becomes a message."""
        try:
            summary = operation()
            sync_queue(queue)
        except (QueueStateError, ResponseError) as error:
            self.message_user(request, f"Queue {queue.name}: {error}", messages.ERROR)
        else:
            self.message_user(request, summary, messages.SUCCESS)
        return self._back()

    def sweep_now(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        queue = self._queue_for(request, queue_name, "echomq.sweep_queue")

        def sweep() -> str:
            sweeper = make_sweeper([queue.name])
            return sweeper.sweep(sweeper.targets[0], force=True).summary()

        return self._operate(request, queue, sweep)

    def retry_all_failed(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        queue = self._queue_for(request, queue_name, "echomq.retry_failedjob")
        return self._operate(request, queue, lambda: (
            f"{queue.retry_all_failed()} failed job(s) of {queue.name} sent back to wait."))

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
        return self._operate(request, queue, lambda: (
            f"{queue.clean('failed', round(days * DAY_MS))} failed job(s) of {queue.name} "
            f"older than {days:g} day(s) deleted."))
