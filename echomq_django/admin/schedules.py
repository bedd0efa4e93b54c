"""The schedules: the Schedule rows (list, form, actions) and, read-only, the schedules of ECHOMQ["SCHEDULES"].

Beside its options, each schedule shows what Redis remembers of it (its
latest tick and job: one read for the whole page) and when it fires next
(computed, no Redis). Enable and disable need the change permission; run now
(`run_schedule`) adds the schedule's job at once, POST-only: the action for
rows, a button for each settings schedule. A Redis out of reach makes the
Redis columns say so, never the page fail.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ImproperlyConfigured, PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils import dateformat, timezone
from django.utils.html import format_html, format_html_join
from django.views.decorators.http import require_POST

from .. import schedules
from ..core import (
    UNREACHABLE,
    Firing,
    InvalidNameError,
    PayloadError,
    QueueKeys,
    Record,
    seconds_text,
    validate_stored_id,
    zone,
)
from ..core import now_ms as clock_ms
from ..queues import get_queue
from ..schedules import Entry
from ..schedules.models import Schedule as ScheduleRow
from .browser_pages import job_link
from .common import REDIS_ERRORS, StorableQuery, redis_problem

# How many coming ticks a schedule's page lists.
NEXT_FIRES = 5
# What a Redis column says when Redis did not answer.
UNREACHABLE_TEXT = "Redis unreachable"
# What run now can raise instead of adding the job: Redis errors, data too large for the queue, broken settings.
RUN_ERRORS = (*REDIS_ERRORS, PayloadError, InvalidNameError, ImproperlyConfigured)


class ArgumentsField(forms.JSONField):
    """The form's JSON field for ARGS and KWARGS: any text a user can type is a field error, never a 500.

    JSON nested beyond what Python's parser takes is refused, and a value is
    shown ASCII-escaped, so a lone surrogate ("\\ud800") can be written back
    into the page.
    """

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:
            raise ValidationError("This JSON is nested too deeply.", code="invalid") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        try:
            return super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)

    def prepare_value(self, value: Any) -> str:
        if isinstance(value, InvalidJSONInput):
            return value
        try:
            return json.dumps(value, cls=self.encoder)  # ensure_ascii: lone surrogates become \\ud800
        except (TypeError, ValueError, RecursionError):
            return InvalidJSONInput(repr(value))


@dataclass
class Shown:
    """One schedule as a page shows it: how it was read, and what Redis remembers of it (or why that is unknown)."""

    entry: Entry | None  # None: ECHOMQ is broken, so the schedule could not be read (`unread` says why)
    record: Record | None = None
    job_exists: bool = False  # the record's latest job still has its hash
    unread: str = ""
    can_view_jobs: bool = False  # the latest job is linked to its page
    shadowed: bool = False  # a row with the name of a settings schedule, which the scheduler leaves out


def entry_of(row: ScheduleRow) -> tuple[Entry | None, str]:
    """A row read as the scheduler reads it, and ""; (None, why) when ECHOMQ cannot be read."""
    try:
        return row.entry(), ""
    except ImproperlyConfigured as error:
        return None, str(error)


def read_shown(entries: list[Entry | None], *, can_view_jobs: bool) -> tuple[list[Shown], str]:
    """Each entry with its record: one read of the records, one of whether their jobs still exist.

    Returns why Redis could not be read too ("" when it could).
    """
    shown = [Shown(entry, can_view_jobs=can_view_jobs) for entry in entries]
    readable = [item for item in shown if item.entry is not None and item.entry.schedule is not None]
    if not readable:
        return shown, ""
    try:
        found = schedules.records([item.entry.schedule for item in readable])  # type: ignore[union-attr]
        there = jobs_exist([(item.entry.schedule.queue, record.job_id)  # type: ignore[union-attr]
                            for item, record in zip(readable, found)])
    except (*REDIS_ERRORS, ImproperlyConfigured) as error:
        for item in readable:
            item.unread = UNREACHABLE_TEXT if isinstance(error, UNREACHABLE) else f"unknown: {error}"
        return shown, redis_problem(error)
    for item, record, exists in zip(readable, found, there):
        item.record, item.job_exists = record, exists
    return shown, ""


def jobs_exist(jobs: list[tuple[str, str]]) -> list[bool]:
    """Whether each (queue, job id) still has its job hash, in one pipelined round trip."""
    asked = [(queue, job_id) for queue, job_id in jobs if linkable(job_id)]
    if not asked:
        return [False] * len(jobs)
    queue = get_queue(asked[0][0])
    pipe = queue.client.pipeline(transaction=False)
    for queue_name, job_id in asked:
        pipe.exists(QueueKeys(queue_name, queue.keys.prefix).job(job_id))
    answers = iter(pipe.execute())
    return [bool(next(answers)) if linkable(job_id) else False for _, job_id in jobs]


def linkable(job_id: str) -> bool:
    """Whether a job id read from a record can be a job's (another client may have written anything there)."""
    try:
        validate_stored_id(job_id)
    except InvalidNameError:
        return False
    return True


def problems_of(entry: Entry) -> list[str]:
    """The errors that keep a schedule from firing (warnings left out)."""
    return [problem.message for _, problem in entry.problems if not problem.warning]


def in_zone(ms: int | None, timezone_name: str) -> str:
    """A moment (ms since the epoch) to the second, in a schedule's time zone; "-" for none or nonsense."""
    if ms is None:
        return "-"
    try:
        moment = datetime.fromtimestamp(ms / 1000, UTC).astimezone(zone(timezone_name))
    except (OverflowError, OSError, ValueError):  # a tick another client wrote, out of any calendar
        return "-"
    return dateformat.format(moment, "Y-m-d H:i:s T")


def when_text(entry: Entry | None, options: dict[str, Any]) -> str:
    """"every 30 s" or "cron 0 3 * * 1-5 (Europe/Berlin)", from the options when they do not make a schedule."""
    if entry is not None and entry.schedule is not None:
        return entry.schedule.describe()
    cron, every = options.get("CRON"), options.get("EVERY")
    if cron:
        return f"cron {cron} ({options.get('TIMEZONE') or settings.TIME_ZONE})"
    if isinstance(every, (int, float)) and math.isfinite(every) and abs(every) < 1e15:
        return f"every {seconds_text(round(every * 1000))} s"
    if every is not None:
        return f"every {every!r} s"
    return "-"


def dotted(path: Any) -> str:
    """A task's dotted path, with a line break allowed after each dot."""
    if not path:
        return "-"
    parts = str(path).split(".")
    return format_html_join("", "{}<wbr>", ((piece,) for piece in [part + "." for part in parts[:-1]] + parts[-1:]))


def queue_text(explicit: Any, entry: Entry | None) -> str:
    """The queue the options name; else the task's own, said so."""
    if explicit:
        return str(explicit)
    if entry is not None and entry.schedule is not None:
        return format_html('{} <span class="help">(the task\'s own)</span>', entry.schedule.queue)
    return format_html('<span class="help">{}</span>', "(the task's own)")


SHADOWED = "not fired: ECHOMQ['SCHEDULES'] has a schedule of this name"


def next_fire(entry: Entry | None, shadowed: bool = False) -> str:
    """When the schedule fires next, in its time zone; or why it does not."""
    if entry is None:
        return "-"
    if shadowed:
        return format_html('<span class="echomq-problem">{}</span>', SHADOWED)
    if entry.schedule is None:
        found = problems_of(entry)
        return format_html('<span class="echomq-problem">invalid: {}</span>', found[0] if found else "?")
    if not entry.enabled:
        return "disabled"
    try:
        return in_zone(entry.schedule.tick_after(clock_ms()), entry.schedule.timezone)
    except Exception as error:  # a cron expression the library cannot step through (the scheduler logs it too)
        return format_html('<span class="echomq-problem">cannot work out its ticks: {}</span>', error or repr(error))


def next_fires(entry: Entry | None, shadowed: bool = False) -> str:
    """The next ticks, in the schedule's time zone, as a list; or why there are none."""
    if entry is None or entry.schedule is None or shadowed:
        return next_fire(entry, shadowed)
    schedule = entry.schedule
    try:
        coming = schedule.next_ticks(clock_ms(), NEXT_FIRES)
    except Exception as error:  # as in next_fire
        return format_html('<span class="echomq-problem">cannot work out its ticks: {}</span>', error or repr(error))
    ticks = format_html_join("", "<li>{}</li>", ((in_zone(tick, schedule.timezone),) for tick in coming))
    if entry.enabled:
        return format_html('<ul class="echomq-ticks">{}</ul>', ticks)
    return format_html('<p>Disabled: it does not fire. Enabled, it would fire at:</p><ul class="echomq-ticks">{}</ul>',
                       ticks)


def last_fired(shown: Shown) -> str:
    """The latest tick decided and how (fired, skipped, missed), and a run now since, if any."""
    if shown.unread:
        return shown.unread
    entry, record = shown.entry, shown.record
    if entry is None or entry.schedule is None or record is None:
        return "-"
    schedule = entry.schedule
    ran_now = record.ran_now and record.fired_at_ms is not None
    parts = []
    if record.tick_ms is not None:
        parts.append(f"{in_zone(record.tick_ms, schedule.timezone)}: {record.outcome or 'unknown'}")
    if ran_now:
        parts.append(f"run now at {in_zone(record.fired_at_ms, schedule.timezone)}")
    return "; ".join(parts) or "never"


def outcome_counts(shown: Shown) -> str:
    if shown.unread:
        return shown.unread
    if shown.record is None:
        return "-"
    counts = shown.record.counts
    return ", ".join(f"{outcome} {counts.get(outcome, 0)}" for outcome in ("fired", "skipped", "missed"))


def last_job(shown: Shown) -> str:
    """The id of the schedule's latest job, linked to its page while Redis still has it."""
    if shown.unread:
        return shown.unread
    entry, record = shown.entry, shown.record
    if entry is None or entry.schedule is None or record is None or not record.job_id:
        return "-"
    if not linkable(record.job_id):  # another client's: no page can show it
        return record.job_id
    if not shown.job_exists:
        return format_html('{} <span class="help">(no longer in Redis)</span>', record.job_id)
    if not shown.can_view_jobs:
        return record.job_id
    return job_link(entry.schedule.queue, record.job_id)


def fired_links(request: HttpRequest, firings: list[Firing]) -> str:
    """"name as job <id> (queue q)" for each firing, the ids linked when the user may see jobs."""
    can_view_jobs = request.user.has_perm("echomq.view_job")
    return format_html_join(", ", "{} as job {} on queue {}", (
        (firing.schedule, job_link(firing.queue, firing.job_id) if can_view_jobs else firing.job_id, firing.queue)
        for firing in firings))


class ScheduleChangeList(ChangeList):
    """Reads, for the page's rows and the settings schedules together, what Redis remembers: one round trip."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        model_admin: ScheduleAdmin = self.model_admin  # type: ignore[assignment]
        can_view_jobs = request.user.has_perm("echomq.view_job")
        settings_entries, self.echomq_settings_error = [], ""
        rows_entries = []
        for row in self.result_list:
            entry, error = entry_of(row)
            rows_entries.append(entry)
            self.echomq_settings_error = self.echomq_settings_error or error
        try:
            settings_entries = schedules.settings_entries()
        except ImproperlyConfigured as error:
            self.echomq_settings_error = self.echomq_settings_error or str(error)
        self.echomq_redis_error = ""
        if request.method in ("GET", "HEAD"):  # an action's POST answers with a redirect: no need to wait for Redis
            shown, self.echomq_redis_error = read_shown([*rows_entries, *settings_entries], can_view_jobs=can_view_jobs)
        else:
            shown = [Shown(entry) for entry in [*rows_entries, *settings_entries]]
        settings_names = {entry.name for entry in settings_entries}
        for row, item in zip(self.result_list, shown):
            item.shadowed = row.name in settings_names
            row.echomq_shown = item
        can_run = model_admin.has_run_schedule_permission(request)
        self.echomq_settings_rows = [settings_row(item, can_run) for item in shown[len(rows_entries):]]


def settings_row(shown: Shown, can_run: bool) -> dict[str, Any]:
    """One line of the settings schedules' table: the same columns as the rows', its problems, its button."""
    entry = shown.entry
    assert entry is not None
    # Its problems are listed in full under its line.
    when_next = (format_html('<span class="echomq-problem">{}</span>', "invalid: see its problems below")
                 if entry.schedule is None else next_fire(entry))
    return {
        "name": entry.name, "when": when_text(entry, entry.options), "task": dotted(entry.options.get("TASK")),
        "queue": queue_text(entry.options.get("QUEUE"), entry), "enabled": entry.enabled,
        "last_fired": last_fired(shown), "next_fire": when_next, "last_job": last_job(shown),
        "problems": [{"message": problem.message, "hint": problem.hint, "warning": problem.warning}
                     for _, problem in entry.problems],
        "run_url": reverse("admin:echomq_schedule_run_settings", args=[entry.name])
        if can_run and entry.schedule is not None else None,
    }


@admin.register(ScheduleRow)
class ScheduleAdmin(StorableQuery, admin.ModelAdmin):
    list_display = ("name", "when", "task_path", "queue_shown", "enabled", "last_fired", "next_fire", "last_job")
    list_filter = ("enabled", "queue")
    search_fields = ("name", "task")
    actions = ["enable_selected", "disable_selected", "run_selected"]
    change_list_template = "admin/echomq/schedule/change_list.html"
    readonly_fields = ("last_fired_at", "outcome_counts", "next_fires", "last_job_id", "created_at", "updated_at")
    fieldsets = (
        ("What to run", {"fields": ("name", "task", "args", "kwargs", "queue")}),
        ("When", {"fields": ("cron", "every", "timezone", "enabled"),
                  "description": "Give a cron expression or an interval in seconds, not both."}),
        ("Options", {"fields": ("catch_up", "skip_if_running", "priority", "attempts")}),
    )
    redis_fieldset = ("In Redis", {"fields": ("last_fired_at", "outcome_counts", "next_fires", "last_job_id",
                                              "created_at", "updated_at")})

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name in ("args", "kwargs"):
            kwargs["form_class"] = ArgumentsField
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name in ("args", "kwargs") and field is not None:
            field.widget.attrs.update(rows=3, cols=60)  # a line of JSON, mostly
        return field

    def get_fieldsets(self, request: HttpRequest, obj: ScheduleRow | None = None) -> Any:
        return self.fieldsets if obj is None else (*self.fieldsets, self.redis_fieldset)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return ScheduleChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:  # the form's read-only fields see only the row: whether to link jobs rides on it
            obj.echomq_can_view_jobs = request.user.has_perm("echomq.view_job")
        return obj

    def has_run_schedule_permission(self, request: HttpRequest) -> bool:
        # Running a schedule from a page one cannot see makes no sense: the view permission comes with it.
        return request.user.has_perm("echomq.run_schedule") and self.has_view_permission(request)

    def get_urls(self) -> list[URLPattern]:
        return [
            path("settings/<str:name>/run/",
                 self.admin_site.admin_view(require_POST(self.run_settings_view)),
                 name="echomq_schedule_run_settings"),
            *super().get_urls(),
        ]

    # -- the list's columns ---------------------------------------------------------------------------------------

    def shown(self, obj: ScheduleRow) -> Shown:
        """What a row shows: read with the page's rows (the list), or on its own (the form), once."""
        found = getattr(obj, "echomq_shown", None)
        if found is None:
            entry, error = entry_of(obj)
            if entry is None:
                found = Shown(None, unread=f"unknown: {error}")
            else:
                [found], _error = read_shown([entry], can_view_jobs=getattr(obj, "echomq_can_view_jobs", False))
                found.shadowed = any(other.name == obj.name for other in schedules.settings_entries())
            obj.echomq_shown = found
        return found

    @admin.display(description="when")
    def when(self, obj: ScheduleRow) -> str:
        return when_text(self.shown(obj).entry, obj.options())

    @admin.display(description="task", ordering="task")
    def task_path(self, obj: ScheduleRow) -> str:
        return dotted(obj.task)

    @admin.display(description="queue", ordering="queue")
    def queue_shown(self, obj: ScheduleRow) -> str:
        return queue_text(obj.queue, self.shown(obj).entry)

    @admin.display(description="last fired")
    def last_fired(self, obj: ScheduleRow) -> str:
        return last_fired(self.shown(obj))

    @admin.display(description="next fire")
    def next_fire(self, obj: ScheduleRow) -> str:
        shown = self.shown(obj)
        return shown.unread if shown.entry is None else next_fire(shown.entry, shown.shadowed)

    @admin.display(description="last job")
    def last_job(self, obj: ScheduleRow) -> str:
        return last_job(self.shown(obj))

    # -- the form's read-only fields --------------------------------------------------------------------------------

    @admin.display(description="last fired")
    def last_fired_at(self, obj: ScheduleRow) -> str:
        return last_fired(self.shown(obj))

    @admin.display(description="outcome counts")
    def outcome_counts(self, obj: ScheduleRow) -> str:
        return outcome_counts(self.shown(obj))

    @admin.display(description="next fires")
    def next_fires(self, obj: ScheduleRow) -> str:
        shown = self.shown(obj)
        return shown.unread if shown.entry is None else next_fires(shown.entry, shown.shadowed)

    @admin.display(description="last job")
    def last_job_id(self, obj: ScheduleRow) -> str:
        return last_job(self.shown(obj))

    # -- actions ------------------------------------------------------------------------------------------------------

    @admin.action(permissions=["change"], description="Enable selected schedules")
    def enable_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        # update() skips auto_now; updated_at is when the schedule starts counting ticks to catch up, so
        # rows already enabled keep theirs (a tick due now is still caught up).
        count = queryset.filter(enabled=False).update(enabled=True, updated_at=timezone.now())
        self.message_user(request, f"{count} schedule(s) enabled; ticks they slept through are not fired.",
                          messages.SUCCESS)

    @admin.action(permissions=["change"], description="Disable selected schedules")
    def disable_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        count = queryset.filter(enabled=True).update(enabled=False, updated_at=timezone.now())
        self.message_user(request, f"{count} schedule(s) disabled.", messages.SUCCESS)

    @admin.action(permissions=["run_schedule"], description="Run selected schedules now")
    def run_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        """Add each valid selected schedule's job now; invalid ones are named and skipped."""
        firings: list[Firing] = []
        rows = list(queryset)
        try:
            taken = {entry.name for entry in schedules.settings_entries()}
        except ImproperlyConfigured as error:
            self.message_user(request, f"No schedule was run: {error}", messages.ERROR)
            return
        for index, row in enumerate(rows):
            entry, error = entry_of(row)
            if entry is None:
                self.message_user(request, f"No schedule was run: {error}", messages.ERROR)
                break
            if row.name in taken:  # it would run under the settings schedule's name, and rewrite its record
                self.message_user(request, f"Schedule {row.name} was not run: ECHOMQ['SCHEDULES'] has a schedule "
                                  "of this name, and the scheduler leaves this row out.", messages.WARNING)
                continue
            if entry.schedule is None:
                found = problems_of(entry)
                self.message_user(request, f"Schedule {row.name} was not run: {found[0] if found else 'invalid'}",
                                  messages.WARNING)
                continue
            try:
                firings.append(schedules.run_now(entry.schedule))
            except RUN_ERRORS as error:
                unreachable, rest = isinstance(error, UNREACHABLE), len(rows) - index - 1
                also = f"; nor were the {rest} other selected schedule(s)" if unreachable and rest else ""
                self.message_user(request, f"Schedule {row.name} was not run: {redis_problem(error)}{also}",
                                  messages.ERROR)
                if unreachable:  # one wait for Redis per request, not one per schedule
                    break
        if firings:
            self.message_user(request, format_html("Ran {} schedule(s) now: {}.", len(firings),
                                                   fired_links(request, firings)), messages.SUCCESS)

    # -- the settings schedules' button ----------------------------------------------------------------------------

    def run_settings_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """Run now, for a schedule of ECHOMQ["SCHEDULES"] (POST only)."""
        if not self.has_run_schedule_permission(request):
            raise PermissionDenied
        back = HttpResponseRedirect(reverse("admin:echomq_schedule_changelist"))
        try:
            entry = next((entry for entry in schedules.settings_entries() if entry.name == name), None)
        except ImproperlyConfigured as error:
            self.message_user(request, f"Schedule {name} was not run: {error}", messages.ERROR)
            return back
        if entry is None:
            raise Http404("ECHOMQ['SCHEDULES'] has no schedule of that name")
        if entry.schedule is None:
            found = problems_of(entry)
            self.message_user(request, f"Schedule {name} was not run: {found[0] if found else 'invalid'}",
                              messages.ERROR)
            return back
        try:
            firing = schedules.run_now(entry.schedule)
        except RUN_ERRORS as error:
            self.message_user(request, f"Schedule {name} was not run: {redis_problem(error)}", messages.ERROR)
            return back
        self.message_user(request, format_html("Ran {} now.", fired_links(request, [firing])), messages.SUCCESS)
        return back
