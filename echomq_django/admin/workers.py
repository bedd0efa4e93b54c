"""The Workers page: every live worker of every configured queue, as the workers registry lists them.

Read-only (`echomq.view_worker`): where each worker runs, its pool and
slots, how long it has been up, its last heartbeat, and the jobs it runs
now, each linked to its page (`echomq.view_job`). A queue with waiting
jobs and no live worker, or no recent sweep, carries the dashboard's warning.

A record is written by a worker process, or by any client that can write the
queue's keys: the page cuts each text and list of one (TEXT_SHOWN, JOBS_SHOWN,
QUEUES_SHOWN), so no record, however long, makes the page long.
"""

from __future__ import annotations

import time
from typing import Any

from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from ..conf import get_settings
from ..core import UNREACHABLE, InvalidNameError, datetime_from_ms, validate_id
from ..models import Worker
from ..status import duration, queue_status
from .common import REDIS_ERRORS, redis_problem

# What one record shows at most: the characters of each text (an id, a host, a queue's name), the running jobs
# (the oldest first: the ones to look at), the queues its process serves. The counts are of everything it holds.
TEXT_SHOWN = 200
JOBS_SHOWN = 50
QUEUES_SHOWN = 20


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    """One page; the model has no table, so none of the row-id pages exist."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        return [path("", self.admin_site.admin_view(self.changelist_view), name="echomq_worker_changelist")]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            names, settings_error = list(get_settings().queues), ""
        except ImproperlyConfigured as error:  # `manage.py check` names it too, but not every deploy runs it
            names, settings_error = [], str(error)
        links = request.user.has_perm("echomq.view_job")
        sections: list[dict[str, Any]] = []
        for name in names:
            unreachable = next((section["error"] for section in sections if section.get("unreachable")), None)
            sections.append({"name": name, "error": unreachable, "unreachable": True} if unreachable
                            else queue_section(name, links))
        context = {**self.admin_site.each_context(request), "opts": self.opts, "title": "Workers",
                   "settings_error": settings_error, "queues": sections}
        return TemplateResponse(request, "admin/echomq/workers.html", context)


def queue_section(name: str, links: bool) -> dict[str, Any]:
    """One queue's part of the page: its workers, a row each, and its warnings; `error` when unread."""
    try:
        status = queue_status(name)
    except REDIS_ERRORS as error:  # out of reach: the page says so rather than failing
        return {"name": name, "error": redis_problem(error), "unreachable": isinstance(error, UNREACHABLE)}
    if "error" in status:
        return {"name": name, "error": status["error"]}
    now_s = time.time()
    return {"name": name, "warnings": status["warnings"],
            "workers": [worker_row(name, worker, now_s, links) for worker in status["workers"]]}


def worker_row(queue_name: str, worker: dict[str, Any], now_s: float, links: bool) -> dict[str, Any]:
    """One worker's row, each of its texts and lists cut to what a page can show."""
    running, queues = worker["running"], worker["queues"]
    return {
        **{field: cut(worker[field]) for field in ("id", "host", "pool", "version")},
        "pid": worker["pid"], "concurrency": worker["concurrency"], "done": worker["done"], "failed": worker["failed"],
        "queues": [cut(name) for name in queues[:QUEUES_SHOWN]], "more_queues": more(queues, QUEUES_SHOWN),
        "busy": f"{len(running):,}",
        "started": datetime_from_ms(worker["started_at_ms"]),
        "uptime": duration(max(0.0, now_s - worker["started_at_ms"] / 1000)),
        "heartbeat_ago": duration(max(0.0, now_s - worker["heartbeat_at_ms"] / 1000)),
        "jobs": [{"id": cut(job_id), "for": duration(max(0.0, now_s - started_ms / 1000)),
                  "url": job_url(queue_name, job_id) if links else None}
                 for job_id, started_ms in running[:JOBS_SHOWN]],
        "more_jobs": more(running, JOBS_SHOWN),
    }


def more(items: list[Any], shown: int) -> str:
    """How many of `items` a page leaves out when it shows `shown` ("" for none)."""
    return f"{len(items) - shown:,}" if len(items) > shown else ""


def cut(text: str) -> str:
    """`text` as a page shows it: its first TEXT_SHOWN characters, and an ellipsis when there were more."""
    return text if len(text) <= TEXT_SHOWN else text[:TEXT_SHOWN - 1] + "…"


def job_url(queue_name: str, job_id: str) -> str | None:
    """The page of a running job; None for an id that no job can have (a record another client wrote)."""
    try:
        validate_id(job_id)
    except InvalidNameError:
        return None
    return reverse("admin:echomq_job_detail", args=[queue_name, job_id])
