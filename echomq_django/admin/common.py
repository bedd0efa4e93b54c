"""What the admin's pages share: Redis errors in words, times, JSON, job facts, confirmation pages."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import dateformat, timezone
from django.utils.html import format_html
from redis.exceptions import RedisClusterException, RedisError

from ..conf import get_settings
from ..core import (
    UNREACHABLE,
    InvalidNameError,
    Job,
    JobLockedError,
    Queue,
    QueueStateError,
    TooDeep,
    datetime_from_ms,
    validate_name,
)
from ..mirror import storable
from ..models import JobRecord
from ..queues import get_queue

# What a read of Redis can raise: an answer of the wrong kind, or Redis out of reach.
REDIS_ERRORS = (RedisError, RedisClusterException, QueueStateError)
# What a change to a job can raise instead of doing what it was asked: the
# errors above, an id outside the alphabet (or a queue key's name), a worker holds it.
JOB_ERRORS = (*REDIS_ERRORS, InvalidNameError, JobLockedError)


def redis_problem(error: Exception) -> str:
    """An error of a Redis call in words for a page: out of reach, or what Redis answered."""
    return f"Redis did not answer ({error})" if isinstance(error, UNREACHABLE) else str(error)


def pretty_json(value: Any) -> str:
    if isinstance(value, TooDeep):
        return format_html('<p class="help">{}</p><pre>{}</pre>', TooDeep.note, value)
    # Lone surrogates (valid JSON from another client, not encodable as UTF-8) stay escaped.
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return format_html("<pre>{}</pre>", text.encode("utf-8", "backslashreplace").decode("utf-8"))


def exact_time(value: datetime | None) -> str:
    """A time to the second, in the site's time zone."""
    if value is None:
        return "-"
    return dateformat.format(timezone.localtime(value) if timezone.is_aware(value) else value, "Y-m-d H:i:s T")


def confirmation(request: HttpRequest, model_admin: admin.ModelAdmin, *, title: str, question: str,
                 button: str, fields: dict[str, str] | list[tuple[str, str]] | None = None,
                 cancel_url: str | None = None, items: list[str] | None = None) -> TemplateResponse:
    """A page that asks before a change; its form POSTs the same fields again (a name may repeat), with post=yes.

    `items`: the things it would change, one line each, listed under the question.
    """
    pairs = list(fields.items()) if isinstance(fields, dict) else list(fields or [])
    context = {**model_admin.admin_site.each_context(request), "title": title, "question": question,
               "button": button, "fields": pairs, "opts": model_admin.model._meta, "items": items or [],
               "cancel_url": cancel_url or reverse(
                   f"admin:{model_admin.opts.app_label}_{model_admin.opts.model_name}_changelist")}
    return TemplateResponse(request, "admin/echomq/confirm.html", context)


def confirmed(request: HttpRequest) -> bool:
    return request.POST.get("post") == "yes"


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
    if not items:
        return "-"
    note = format_html('<p class="help">{}</p>', TooDeep.note) if any(isinstance(i, TooDeep) for i in items) else ""
    return format_html("{}<pre>{}</pre>", note, "\n\n".join(map(str, items)))


def configured_queue(queue_name: str) -> Queue:
    """The configured queue a URL names; 404 for any other name."""
    try:
        configured = get_settings().queues
        validate_name(queue_name, "queue name")
    except (ImproperlyConfigured, InvalidNameError) as error:
        raise Http404(str(error)) from None
    if queue_name not in configured:
        raise Http404(f"no queue {queue_name!r} is configured")
    return get_queue(queue_name)


class StorableQuery:
    """A changelist whose filters and search take their text as the mirror stores text (NUL as U+FFFD).

    PostgreSQL refuses a NUL in a query (a 500 as the page is read); the mirror never stores one, so a
    reason that held one is found by the same text. For every list of the app (a ModelAdmin's mixin).
    """

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        if any("\x00" in value for _, values in request.GET.lists() for value in values):
            query = request.GET.copy()
            for name, values in query.lists():
                query.setlist(name, [storable(value) for value in values])
            query._mutable = False
            request.GET = query
        return super().get_changelist_instance(request)  # type: ignore[misc]
