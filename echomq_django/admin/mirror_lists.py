"""The failed and stalled lists: changelists over the mirror (JobRecord rows, searchable and filterable).

Each list is brought up to date from Redis when it opens (a bounded sync: see
mirror.py). A job's own page, named by queue and job id, reads Redis itself.
Retry (`retry_failedjob`) and delete (`delete_failedjob`) go through the Lua
scripts first, POST-only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html_join
from django.utils.http import urlencode
from django.utils.text import capfirst
from django.views.decorators.http import require_POST

from ..conf import get_settings
from ..core import UNREACHABLE, InvalidNameError, Job, LiveJob, Queue, inspect_jobs, validate_id, validate_name
from ..mirror import sync_queue
from ..models import FailedJob, JobRecord, MirrorCursor, StalledJob
from ..queues import get_queue
from .bulk import CANCEL, DELETE, RETRY, bulk_selected
from .common import (
    JOB_ERRORS,
    REDIS_ERRORS,
    StorableQuery,
    confirmation,
    confirmed,
    exact_time,
    job_facts,
    redis_problem,
    row_facts,
)

# Failed (and marked) jobs a list copies from Redis per queue when it is opened;
# a larger backlog is copied by echomq_sweep's sync, so the page never waits for it.
VIEW_SYNC_LIMIT = 1000


class JobChangeList(ChangeList):
    """Links each row to its job's page, named by queue and job id."""

    def url_for_result(self, result: JobRecord) -> str:
        return self.model_admin.job_url(result.queue, result.job_id)


class MirrorAdmin(StorableQuery, admin.ModelAdmin):
    """The list of one mirrored set, and each job's page: read-only; changes go through the scripts."""

    # Exact id, and a substring of the name or the reason (see README, "The admin", for the cost).
    search_fields = ("=job_id", "name", "failed_reason")
    list_filter: tuple[Any, ...] = ("queue", "name")  # names, and the lists' own filter classes
    list_per_page = 100
    show_full_result_count = False  # no COUNT(*) over 100,000 rows on every page
    change_list_template = "admin/echomq/job_list.html"
    changelist_class = JobChangeList

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="name", ordering="name")
    def dotted_name(self, obj: JobRecord) -> str:
        """The job's name, with a line break allowed after each dot of a dotted path."""
        parts = obj.name.split(".")
        pieces = [part + "." for part in parts[:-1]] + parts[-1:]
        return format_html_join("", "{}<wbr>", ((piece,) for piece in pieces)) if obj.name else "-"

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return self.changelist_class

    def url_name(self, view: str) -> str:
        return f"{self.opts.app_label}_{self.opts.model_name}_{view}"

    def get_urls(self) -> list[URLPattern]:
        # Only the list and the job pages: the row-id pages (change, history, delete) do not exist.
        return [
            path("", self.admin_site.admin_view(self.changelist_view), name=self.url_name("changelist")),
            path("<str:queue_name>/<str:job_id>/", self.admin_site.admin_view(self.job_view),
                 name=self.url_name("job")),
            *self.job_action_urls(),
        ]

    def job_action_urls(self) -> list[URLPattern]:
        return []

    def job_url(self, queue_name: str, job_id: str) -> str:
        try:
            validate_name(queue_name, "queue name")
            validate_id(job_id)
        except InvalidNameError:  # a row another client's id got into: found by an exact search instead
            return reverse(f"admin:{self.url_name('changelist')}") + "?" + urlencode({"q": f'"{job_id}"'})
        return reverse(f"admin:{self.url_name('job')}", args=[queue_name, job_id])

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if request.method == "GET" and self.has_view_permission(request):
            extra_context = {**(extra_context or {}), "mirror_notes": self.refresh_mirror(request)}
        return super().changelist_view(request, extra_context)

    def refresh_mirror(self, request: HttpRequest) -> list[dict[str, Any]]:
        """Copy what changed in Redis into the rows (bounded); one note per queue on how complete the copy is."""
        try:
            names = list(get_settings().queues)
        except ImproperlyConfigured:
            return []
        if request.GET.get("queue") in names:
            names = [request.GET["queue"]]
        notes: list[dict[str, Any]] = []
        for name in names:
            note: dict[str, Any] = {"queue": name}
            unreachable = next((n["error"] for n in notes if n.get("unreachable")), None)
            try:
                if unreachable:  # one wait for Redis per page, not one per queue
                    note.update(error=unreachable, unreachable=True)
                else:
                    result = sync_queue(get_queue(name), limit=VIEW_SYNC_LIMIT)
                    note.update(complete=result.complete, pending=result.pending)
            except REDIS_ERRORS as error:
                note.update(error=redis_problem(error), unreachable=isinstance(error, UNREACHABLE))
            notes.append(note)
        synced = dict(MirrorCursor.objects.filter(queue__in=names).values_list("queue", "synced_at"))
        for note in notes:
            note["synced_at"] = exact_time(synced.get(note["queue"])) if synced.get(note["queue"]) else "never"
        return notes

    def job_queue(self, queue_name: str, job_id: str) -> tuple[Queue, JobRecord | None]:
        """The queue of a job page's URL and the job's row; 404 for names no queue or job can have."""
        try:
            validate_name(queue_name, "queue name")
            validate_id(job_id)
            configured = get_settings().queues
        except (InvalidNameError, ImproperlyConfigured) as error:
            raise Http404(str(error)) from None
        row = self.model.objects.filter(queue=queue_name, job_id=job_id).first()
        if row is None and queue_name not in configured:
            raise Http404("no such queue is configured")
        return get_queue(queue_name), row

    def in_its_set(self, queue: Queue, job_id: str, state: str | None) -> bool:
        raise NotImplementedError

    def job_view(self, request: HttpRequest, queue_name: str, job_id: str) -> HttpResponse:
        """One job: what Redis holds now, or the row's copy when Redis no longer has it."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        queue, row = self.job_queue(queue_name, job_id)
        unread = ""  # why Redis could not be read, if it could not
        try:
            job, state = queue.get_job_with_state(job_id)
            in_its_set = self.in_its_set(queue, job_id, state)
        except REDIS_ERRORS as error:
            job, state, in_its_set, unread = None, None, False, redis_problem(error)
        if row is None and not in_its_set:
            raise Http404(f"job {job_id} of queue {queue_name} is not in the {self.opts.verbose_name_plural}")
        if job is not None:
            facts = job_facts(job, state)
        elif row is not None:
            facts = row_facts(row)
        else:  # a stalled mark left by a job removed since, never copied
            raise Http404(f"job {job_id} of queue {queue_name}: Redis no longer has it, and there is no copy of it")
        context = {
            **self.admin_site.each_context(request), "opts": self.opts,
            "title": f"{capfirst(self.opts.verbose_name)} {job_id} of queue {queue.name}",
            "facts": [*facts, *self.live_facts(queue, job_id, job)], "job_id": job_id, "queue_name": queue.name,
            "gone": job is None and not unread, "unread": unread, "in_its_set": in_its_set,
            **self.job_buttons(request, queue, job_id, in_its_set),
        }
        return TemplateResponse(request, "admin/echomq/job_detail.html", context)

    def live_facts(self, queue: Queue, job_id: str, job: Job | None) -> list[tuple[str, Any]]:
        return []

    def job_buttons(self, request: HttpRequest, queue: Queue, job_id: str, in_its_set: bool) -> dict[str, Any]:
        return {}


class WhyFailedFilter(admin.SimpleListFilter):
    """The failed jobs by why the scripts failed them: expired (never started), cancelled, or the job's own error."""

    title, parameter_name = "why", "why"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("expired", "expired (never started)"), ("cancelled", "cancelled"), ("other", "the job's own error")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value == "expired":
            return queryset.filter(failed_reason="expired")
        if value == "cancelled":
            return queryset.filter(failed_reason__startswith="cancelled")
        if value == "other":
            return queryset.exclude(failed_reason="expired").exclude(failed_reason__startswith="cancelled")
        return queryset


class ErrorTextFilter(admin.SimpleListFilter):
    """The failed jobs whose reason holds a text, any case (one pass over the rows of the set, like a search)."""

    title, parameter_name = "error text", "error"
    template = "admin/echomq/text_filter.html"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        return True

    def choices(self, changelist: ChangeList) -> Any:
        # The form keeps every other filter of the page (and goes back to its first page).
        kept = [(name, value) for name, values in self.request.GET.lists() for value in values
                if name not in (self.parameter_name, "p")]
        yield {"name": self.parameter_name, "value": self.value() or "", "kept": kept,
               "clear_url": changelist.get_query_string(remove=[self.parameter_name]) if self.value() else None}

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(failed_reason__icontains=self.value()) if self.value() else queryset


@admin.register(FailedJob)
class FailedJobAdmin(MirrorAdmin):
    list_display = ("job_id", "finished", "dotted_name", "reason", "error_class", "attempts_made", "queue")
    # No date_hierarchy: its year/month links need a scan of every row.
    list_filter = ("queue", WhyFailedFilter, "error_class", ErrorTextFilter, "name", "finished_at")
    ordering = ("-finished_at",)
    actions = ["retry_selected", "delete_selected"]

    @admin.display(description="finished at", ordering="finished_at")
    def finished(self, obj: JobRecord) -> str:
        return exact_time(obj.finished_at)

    @admin.display(description="reason", ordering="failed_reason")
    def reason(self, obj: JobRecord) -> str:
        reason = obj.failed_reason
        return reason if len(reason) <= 120 else reason[:119] + "…"

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("echomq.retry_failedjob")

    def in_its_set(self, queue: Queue, job_id: str, state: str | None) -> bool:
        return state == "failed"

    def job_action_urls(self) -> list[URLPattern]:
        return [
            path("<str:queue_name>/<str:job_id>/retry/", self.admin_site.admin_view(require_POST(self.retry_job)),
                 name=self.url_name("job_retry")),
            path("<str:queue_name>/<str:job_id>/delete/", self.admin_site.admin_view(require_POST(self.delete_job)),
                 name=self.url_name("job_delete")),
        ]

    def job_buttons(self, request: HttpRequest, queue: Queue, job_id: str, in_its_set: bool) -> dict[str, Any]:
        args = [queue.name, job_id]
        return {
            "retry_url": reverse(f"admin:{self.url_name('job_retry')}", args=args)
            if in_its_set and self.has_retry_permission(request) else None,
            "delete_url": reverse(f"admin:{self.url_name('job_delete')}", args=args)
            if self.has_delete_permission(request) else None,
        }

    def retry_job(self, request: HttpRequest, queue_name: str, job_id: str) -> HttpResponse:
        if not self.has_retry_permission(request):
            raise PermissionDenied
        queue, _row = self.job_queue(queue_name, job_id)
        return self._change_one(request, queue, job_id, lambda: (
            "sent back to wait" if queue.retry(job_id) else "was no longer failed and was left alone"))

    def delete_job(self, request: HttpRequest, queue_name: str, job_id: str) -> HttpResponse:
        if not self.has_delete_permission(request):
            raise PermissionDenied
        queue, _row = self.job_queue(queue_name, job_id)
        if not confirmed(request):
            return confirmation(request, self, title="Delete a failed job?", button="Yes, delete it",
                                question=f"Delete failed job {job_id} of queue {queue.name} from Redis? "
                                         "Its data and traces go with it; this cannot be undone.")
        return self._change_one(request, queue, job_id, lambda: (
            "deleted" if queue.remove(job_id, only_from="failed") else "was no longer failed and was left alone"))

    def _change_one(self, request: HttpRequest, queue: Queue, job_id: str, change: Callable[[], str]) -> HttpResponse:
        """Run a script on one failed job, then drop its row (it is no longer failed either way)."""
        try:
            outcome = change()
        except JOB_ERRORS as error:
            self.message_user(request, f"Job {job_id} was left alone: {redis_problem(error)}", messages.ERROR)
            return HttpResponseRedirect(self.job_url(queue.name, job_id))
        FailedJob.objects.filter(queue=queue.name, job_id=job_id).delete()
        self.message_user(request, f"Job {job_id} of {queue.name} {outcome}.", messages.SUCCESS)
        return HttpResponseRedirect(reverse(f"admin:{self.url_name('changelist')}"))

    @admin.action(permissions=["retry"], description="Retry selected jobs")
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """Ticked rows at once; every row the list matches ("Select all") after a page that gives the count."""
        return bulk_selected(self, request, queryset, RETRY, "retry_selected")

    @admin.action(permissions=["delete"], description="Delete selected jobs")
    def delete_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """Delete from Redis (each only while still failed), after a page that gives the count; then the rows."""
        return bulk_selected(self, request, queryset, DELETE, "delete_selected")


class StalledChangeList(JobChangeList):
    """Adds what only Redis knows now to each listed row: lock TTL, time in active, next sweep's verdict."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        by_queue: dict[str, list[JobRecord]] = {}
        for row in self.result_list:
            by_queue.setdefault(row.queue, []).append(row)
        for queue_name, records in by_queue.items():
            try:
                live = live_jobs(queue_name, [record.job_id for record in records])
            except (*REDIS_ERRORS, InvalidNameError) as error:
                self.model_admin.message_user(request, f"Queue {queue_name}: {error}", messages.ERROR)
                continue
            for record, job in zip(records, live):
                record.live = job


def live_jobs(queue_name: str, job_ids: list[str]) -> list[LiveJob]:
    """Lock TTL, time in active and the next sweep's verdict, with the queue's configured ceilings."""
    config = get_settings().queue(queue_name)
    return inspect_jobs(get_queue(queue_name), job_ids, max_stalled_count=config.max_stalled_count,
                        default_attempts=config.attempts)


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} s"


def lock_ttl(ttl_ms: int | None) -> str:
    return "gone" if ttl_ms is None else "no expiry" if ttl_ms == -1 else f"{ttl_ms / 1000:.1f} s"


@admin.register(StalledJob)
class StalledJobAdmin(MirrorAdmin):
    list_display = ("job_id", "next_sweep", "lock_ttl", "time_in_active", "attempts_made", "dotted_name", "queue")
    ordering = ("queue", "job_id")
    actions = ["cancel_selected"]
    changelist_class = StalledChangeList

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("echomq.cancel_job")

    @admin.action(permissions=["cancel"], description="Cancel selected jobs")
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> HttpResponse | None:
        """Flag the jobs for their workers to stop (they are active), after a page that gives the count."""
        return bulk_selected(self, request, queryset, CANCEL, "cancel_selected")

    def in_its_set(self, queue: Queue, job_id: str, state: str | None) -> bool:
        return job_id in queue.stalled_ids()

    def live_facts(self, queue: Queue, job_id: str, job: Job | None) -> list[tuple[str, Any]]:
        try:
            [live] = live_jobs(queue.name, [job_id])
        except REDIS_ERRORS as error:
            return [("next sweep will", f"unknown: {error}")]
        return [("next sweep will", str(live.verdict)), ("lock TTL", lock_ttl(live.lock_ttl_ms)),
                ("time in active", seconds(live.seconds_in_active))]

    @admin.display(description="time in active")
    def time_in_active(self, obj: JobRecord) -> str:
        live = getattr(obj, "live", None)
        return seconds(live.seconds_in_active) if live else "-"

    @admin.display(description="lock TTL")
    def lock_ttl(self, obj: JobRecord) -> str:
        live = getattr(obj, "live", None)
        return lock_ttl(live.lock_ttl_ms) if live else "-"

    @admin.display(description="next sweep will")
    def next_sweep(self, obj: JobRecord) -> str:
        live = getattr(obj, "live", None)
        return str(live.verdict) if live else "-"
