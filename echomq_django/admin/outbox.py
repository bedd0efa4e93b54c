"""The outbox's rows (outbox/): the jobs and workflows committed with their transaction that Redis does not have yet.

Read-only: a row is sent by its process or a relay, never edited. Deleting
one (the "delete" permission, on a confirmation page) drops a job that was
never sent, for a row that will never be: too old, or not sendable as it is.
"""

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Length, Substr
from django.http import HttpRequest
from django.utils.html import format_html

from ..conf import get_settings
from ..core import datetime_from_ms, now_ms
from ..outbox import OutboxJob, OutboxWorkflow
from .common import StorableQuery

# The characters of a workflow row's canvas its page shows.
CANVAS_SHOWN = 2000


class OutboxRowAdmin(StorableQuery, admin.ModelAdmin):
    """What the pages of both tables share: read-only, oldest first, and why a row was never sent."""

    list_filter = ("queue",)
    ordering = ("timestamp_ms",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="enqueued", ordering="timestamp_ms")
    def enqueued(self, row: Any) -> Any:
        return datetime_from_ms(row.timestamp_ms)

    @admin.display(description="age")
    def age(self, row: Any) -> str:
        return f"{max(0, now_ms() - row.timestamp_ms) / 1000:.0f} s"

    @admin.display(description="never sent because")
    def unsent(self, row: Any) -> str:
        if row.error:
            return format_html("it cannot be sent as it is: {}", row.error)
        if now_ms() - row.timestamp_ms > get_settings().outbox_max_age_ms:
            return "older than OUTBOX_MAX_AGE"
        return ""


@admin.register(OutboxJob)
class OutboxJobAdmin(OutboxRowAdmin):
    list_display = ("job_id", "queue", "name", "enqueued", "age", "unsent")
    search_fields = ("job_id", "name")
    readonly_fields = ("job_id", "queue", "name", "data", "opts", "delay_ms", "priority", "group", "enqueued",
                       "error")
    fields = readonly_fields


@admin.register(OutboxWorkflow)
class OutboxWorkflowAdmin(OutboxRowAdmin):
    list_display = ("workflow_id", "queue", "jobs", "enqueued", "age", "unsent")
    search_fields = ("workflow_id",)
    readonly_fields = ("workflow_id", "queue", "jobs", "enqueued", "error", "canvas_start")
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[OutboxWorkflow]:
        # A row's canvas may be MAX_ROW_BYTES: a page reads its start and length, never the whole of it.
        return super().get_queryset(request).defer("canvas").annotate(
            start=Substr("canvas", 1, CANVAS_SHOWN), length=Length("canvas"))

    @admin.display(description="canvas")
    def canvas_start(self, row: Any) -> str:
        if row.length <= CANVAS_SHOWN:
            return str(row.start)
        return f"{row.start}… ({row.length:,} characters in all)"
