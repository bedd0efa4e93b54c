"""The admin: a queue dashboard, the stalled set and the failed set.

The failed and stalled lists are changelists over the mirror (JobRecord rows,
searchable and filterable), brought up to date from Redis each time a list is
opened (a bounded sync: see mirror.py). A job's own page, named by queue and
job id, reads Redis itself. Every change goes through the Lua scripts first,
so Redis stays the source of truth. Changes are POST-only, CSRF-protected and
need their own permission: retry (`retry_failedjob`), delete
(`delete_failedjob`), sweep now (`sweep_queue`); the bulk ones that act on a
whole set (retry all, clean) run only on the POST of a confirmation page.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.text import capfirst
from django.views.decorators.http import require_POST
from redis.exceptions import RedisClusterException, RedisError

from .conf import get_settings
from .core import (
    UNREACHABLE,
    InvalidNameError,
    Job,
    JobLockedError,
    LiveJob,
    Queue,
    QueueStateError,
    count_failed_older_than,
    datetime_from_ms,
    failed_count,
    inspect_jobs,
    validate_name,
)
from .mirror import sync_queue
from .models import FailedJob, JobRecord, MirrorCursor, StalledJob
from .models import Queue as QueueModel
from .queues import get_queue, make_sweeper
from .status import describe_sweep, queue_status

DAY_MS = 86_400_000
# A century: more is surely a typo, and days * DAY_MS must stay a number Redis takes.
MAX_CLEAN_DAYS = 36_500
# What a read of Redis can raise: an answer of the wrong kind, or Redis out of reach.
REDIS_ERRORS = (RedisError, RedisClusterException, QueueStateError)
# What a change to a job can raise instead of doing what it was asked: the
# errors above, an id outside the alphabet (or a queue key's name), a worker holds it.
JOB_ERRORS = (*REDIS_ERRORS, InvalidNameError, JobLockedError)


def redis_problem(error: Exception) -> str:
    """An error of a Redis call in words for a page: out of reach, or what Redis answered."""
    return f"Redis did not answer ({error})" if isinstance(error, UNREACHABLE) else str(error)


# Failed (and marked) jobs a list copies from Redis per queue when it is opened;
# a larger backlog is copied by echomq_sweep's sync, so the page never waits for it.
VIEW_SYNC_LIMIT = 1000


def pretty_json(value: Any) -> str:
    # Lone surrogates (valid JSON from another client, not encodable as UTF-8) stay escaped.
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return format_html("<pre>{}</pre>", text.encode("utf-8", "backslashreplace").decode("utf-8"))


def exact_time(value: datetime | None) -> str:
    """A time to the second, in the site's time zone."""
    if value is None:
        return "-"
    return dateformat.format(timezone.localtime(value) if timezone.is_aware(value) else value, "Y-m-d H:i:s T")


def confirmation(request: HttpRequest, model_admin: admin.ModelAdmin, *, title: str, question: str,
                 button: str, fields: dict[str, str] | None = None) -> TemplateResponse:
    """A page that asks before a change; its form POSTs the same fields again, with post=yes."""
    context = {**model_admin.admin_site.each_context(request), "title": title, "question": question,
               "button": button, "fields": fields or {}, "opts": model_admin.model._meta,
               "cancel_url": reverse(f"admin:{model_admin.opts.app_label}_{model_admin.opts.model_name}_changelist")}
    return TemplateResponse(request, "admin/echomq/confirm.html", context)


def confirmed(request: HttpRequest) -> bool:
    return request.POST.get("post") == "yes"


class JobChangeList(ChangeList):
    """Links each row to its job's page, named by queue and job id."""

    def url_for_result(self, result: JobRecord) -> str:
        return self.model_admin.job_url(result.queue, result.job_id)


class MirrorAdmin(admin.ModelAdmin):
    """The list of one mirrored set, and each job's page: read-only; changes go through the scripts."""

    # Exact id, and a substring of the name or the reason (see README, "The admin", for the cost).
    search_fields = ("=job_id", "name", "failed_reason")
    list_filter = ("queue", "name")
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
            validate_name(job_id, "job id")
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
            validate_name(job_id, "job id")
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
        facts = job_facts(job, state) if job else row_facts(row)
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


def job_facts(job: Job, state: str | None) -> list[tuple[str, Any]]:
    """A job as read from Redis now, one (label, value) per line of its page."""
    return [
        ("state now", state or "in no state (removed)"), ("name", job.name),
        ("attempts made", job.attempts_made), ("attempts started", job.attempts_started),
        ("stalls", job.stall_count), ("created", exact_time(datetime_from_ms(job.timestamp))),
        ("first started", exact_time(datetime_from_ms(job.started_on))),
        ("last started", exact_time(datetime_from_ms(job.processed_on))),
        ("finished", exact_time(datetime_from_ms(job.finished_on))), ("worker", job.worker_id or "-"),
        ("failed reason", job.failed_reason or "-"), ("exception classes", ", ".join(job.error_classes) or "-"),
        ("data", pretty_json(job.data)), ("options", pretty_json(job.opts.to_json())),
        ("stack traces", traces(job.stacktrace)),
    ]


def row_facts(row: JobRecord) -> list[tuple[str, Any]]:
    """A job as the mirror last copied it (Redis no longer has it)."""
    return [
        ("state now", "no longer in Redis; this is the copy of " + exact_time(row.synced_at)), ("name", row.name),
        ("attempts made", row.attempts_made), ("stalls", row.stall_count), ("created", exact_time(row.created_at)),
        ("last started", exact_time(row.processed_at)), ("finished", exact_time(row.finished_at)),
        ("failed reason", row.failed_reason or "-"), ("data", pretty_json(row.data)),
        ("options", pretty_json(row.opts)), ("stack traces", traces(row.stacktrace)),
    ]


def traces(stacktrace: Any) -> str:
    items = stacktrace if isinstance(stacktrace, list) else [stacktrace] if stacktrace else []
    return format_html("<pre>{}</pre>", "\n\n".join(map(str, items))) if items else "-"


@admin.register(FailedJob)
class FailedJobAdmin(MirrorAdmin):
    list_display = ("job_id", "finished", "dotted_name", "reason", "attempts_made", "queue")
    # No date_hierarchy: its year/month links need a scan of every row.
    list_filter = ("queue", "name", "finished_at")
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
    def retry_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        retried, gone = 0, []
        for record in queryset:
            try:
                if get_queue(record.queue).retry(record.job_id):
                    retried += 1
                else:
                    gone.append(record.job_id)
            except JOB_ERRORS as error:
                self.message_user(request, f"Job {record.job_id!r} was left alone: {redis_problem(error)}",
                                  messages.ERROR)
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
            self.message_user(request, f"Job {obj.job_id!r} was not deleted: {redis_problem(error)}", messages.ERROR)
            return
        obj.delete()

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for record in queryset:
            self.delete_model(request, record)


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
    actions = None
    changelist_class = StalledChangeList

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

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
            path("<str:queue_name>/retry-failed/", view(self.retry_all_failed), name="echomq_queue_retry_failed"),
            path("<str:queue_name>/clean-failed/", view(self.clean_failed), name="echomq_queue_clean_failed"),
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
            "queues": self.queue_rows(names),
            "can_sweep": user.has_perm("echomq.sweep_queue"),
            "can_retry": user.has_perm("echomq.retry_failedjob"),
            "can_clean": user.has_perm("echomq.delete_failedjob"),
            "can_view_failed": user.has_perm("echomq.view_failedjob"),
            "can_view_stalled": user.has_perm("echomq.view_stalledjob"),
        }
        return TemplateResponse(request, "admin/echomq/queue_dashboard.html", context)

    def queue_rows(self, names: list[str]) -> list[dict[str, Any]]:
        """The dashboard's lines; once Redis has not answered for one queue, the rest say so without waiting."""
        rows: list[dict[str, Any]] = []
        for name in names:
            unreachable = next((row["error"] for row in rows if row.get("unreachable")), None)
            rows.append({"name": name, "error": unreachable, "unreachable": True} if unreachable
                        else self.queue_row(name))
        return rows

    def queue_row(self, name: str) -> dict[str, Any]:
        """One queue's line of the dashboard; `error` instead of counts when one of its keys is broken."""
        try:
            status = queue_status(name)  # what echomq_status shows, read the same way
        except REDIS_ERRORS as error:  # out of reach: a page says so rather than failing
            return {"name": name, "error": redis_problem(error), "unreachable": isinstance(error, UNREACHABLE)}
        if "error" in status:
            return {"name": name, "error": status["error"]}
        return {"name": name, "counts": status["counts"], "paused": status["paused"],
                "last_sweep": describe_sweep(status["last_sweep"])}

    def _queue_for(self, request: HttpRequest, queue_name: str, permission: str) -> Queue:
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

    def _operate(self, request: HttpRequest, queue: Queue, operation: Callable[[], str]) -> HttpResponse:
        """Run one button's operation and bring the mirror up to date; its outcome becomes a message."""
        try:
            summary = operation()
            sync_queue(queue)
        except REDIS_ERRORS as error:
            self.message_user(request, f"Queue {queue.name}: {redis_problem(error)}", messages.ERROR)
        else:
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

    def retry_all_failed(self, request: HttpRequest, queue_name: str) -> HttpResponse:
        queue = self._queue_for(request, queue_name, "echomq.retry_failedjob")
        if not confirmed(request):
            return self._confirm(
                request, queue, lambda: failed_count(queue),
                lambda found: f"Send all {found} failed job(s) of queue {queue.name} back to wait? "
                              "Each runs again, with the attempts it has made so far counted.",
                title=f"Retry every failed job of {queue.name}?", button="Yes, retry them all")
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
            f"older than {days:g} day(s) deleted."))
