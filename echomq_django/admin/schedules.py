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
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ImproperlyConfigured, PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_POST

from .. import schedules
from ..core import UNREACHABLE, Firing, InvalidNameError, PayloadError
from ..schedules.models import Schedule as ScheduleRow
from .common import REDIS_ERRORS, StorableQuery, redis_problem
from .schedule_display import (
    Shown,
    dotted,
    entry_of,
    fired_links,
    last_fired,
    last_job,
    next_fire,
    next_fires,
    outcome_counts,
    problems_of,
    queue_text,
    read_shown,
    settings_row,
    when_text,
)

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


class ScheduleChangeList(ChangeList):
    """Reads, for the page's rows and the settings schedules together, what Redis remembers: one round trip."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        model_admin: ScheduleAdmin = self.model_admin
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
            entry, unreadable = entry_of(row)
            if entry is None:
                self.message_user(request, f"No schedule was run: {unreadable}", messages.ERROR)
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
