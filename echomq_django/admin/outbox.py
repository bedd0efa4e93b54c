"""The outbox's rows (outbox.py): the jobs committed with their transaction that Redis does not have yet.

Read-only: a row is sent by its process or a relay, never edited. Deleting
one (the "delete" permission, on a confirmation page) drops a job that was
never sent, for a row that will never be: too old, or not sendable as it is.
"""

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from ..conf import get_settings
from ..core import datetime_from_ms, now_ms
from ..outbox_model import OutboxJob
from .common import StorableQuery


@admin.register(OutboxJob)
class OutboxJobAdmin(StorableQuery, admin.ModelAdmin):
    list_display = ("job_id", "queue", "name", "enqueued", "age", "unsent")
    list_filter = ("queue",)
    search_fields = ("job_id", "name")
    ordering = ("timestamp_ms",)
    readonly_fields = ("job_id", "queue", "name", "data", "opts", "delay_ms", "priority", "group", "enqueued",
                       "error")
    fields = readonly_fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="enqueued", ordering="timestamp_ms")
    def enqueued(self, row: OutboxJob) -> Any:
        return datetime_from_ms(row.timestamp_ms)

    @admin.display(description="age")
    def age(self, row: OutboxJob) -> str:
        return f"{max(0, now_ms() - row.timestamp_ms) / 1000:.0f} s"

    @admin.display(description="never sent because")
    def unsent(self, row: OutboxJob) -> str:
        if row.error:
            return format_html("it cannot be sent as it is: {}", row.error)
        if now_ms() - row.timestamp_ms > get_settings().outbox_max_age_ms:
            return "older than OUTBOX_MAX_AGE"
        return ""
