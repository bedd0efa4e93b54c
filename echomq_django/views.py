"""`metrics/`: every configured queue in the Prometheus text format, read from Redis on each scrape.

Who may read it: a scraper that sends `Authorization: Bearer <ECHOMQ["METRICS_TOKEN"]>`,
or a logged-in, active staff user with the permission "Can view metrics"
(`echomq.view_metrics`). A request with a Bearer header is judged by its token alone;
in production (DEBUG = False) a token shorter than 24 characters opens nothing.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from django.views.decorators.vary import vary_on_headers
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from redis.exceptions import ResponseError

from .conf import get_settings
from .core import COUNTED, UNREACHABLE, QueueStateError, last_sweep, oldest_waiting_age_ms, totals
from .queues import get_queue
from .settings_values import short_token_problem
from .status import read_outbox, seconds_since

logger = logging.getLogger("echomq.metrics")

TEXT = "text/plain; charset=utf-8"
# What a refused request is told; no count, no queue name.
NOT_AUTHENTICATED = ('Send "Authorization: Bearer" with the ECHOMQ METRICS_TOKEN, or log in as staff '
                     'with the permission "Can view metrics".\n')
WRONG_TOKEN = "The bearer token is not the ECHOMQ METRICS_TOKEN (or none is configured).\n"
NOT_PERMITTED = 'Reading the metrics needs a staff account with the permission "Can view metrics".\n'


@dataclass(frozen=True)
class QueueReading:
    """What one scrape read of one queue."""

    name: str
    totals: dict[str, int]
    counts: dict[str, int]
    oldest_waiting_ms: int | None
    last_sweep_age_s: float | None
    workers: int = 0  # live in the registry
    busy_slots: int = 0  # of theirs, running a job


def read_queue(name: str) -> QueueReading:
    """One queue's numbers, read through core; raises ResponseError or QueueStateError when a key is broken."""
    queue = get_queue(name)
    sweep = last_sweep(queue.client, queue.keys)
    try:
        sweep_age_s = seconds_since(sweep) if sweep else None
    except (KeyError, TypeError, ValueError):  # a report another client wrote: no age to tell
        sweep_age_s = None
    workers = queue.workers()
    return QueueReading(name, totals(queue), queue.counts(), oldest_waiting_age_ms(queue), sweep_age_s,
                        len(workers), sum(worker.busy_slots for worker in workers))


class QueueCollector:
    """The metrics of the given queues, read from Redis each time a registry collects them."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def collect(self) -> Iterator[Metric]:
        completed = CounterMetricFamily(
            "echomq_jobs_completed", "Jobs completed, all time, by any worker.", labels=["queue"])
        failed = CounterMetricFamily(
            "echomq_jobs_failed", "Jobs failed for good (no retry left), all time.", labels=["queue"])
        recovered = CounterMetricFamily(
            "echomq_jobs_recovered", "Stalled jobs a sweep recovered to run again, all time.", labels=["queue"])
        jobs = GaugeMetricFamily(
            "echomq_queue_jobs", "Jobs in each state now; stalled jobs (marked by a sweep) are also in active.",
            labels=["queue", "state"])
        oldest = GaugeMetricFamily(
            "echomq_oldest_waiting_seconds",
            "Seconds the oldest ready job (wait, paused, next prioritized) has waited; 0 when none waits.",
            labels=["queue"])
        swept = GaugeMetricFamily(
            "echomq_last_sweep_age_seconds",
            "Seconds since the last sweep of the queue ended; no sample for a queue never swept.",
            labels=["queue"])
        workers = GaugeMetricFamily(
            "echomq_workers", "Workers serving the queue now (live in the workers registry).", labels=["queue"])
        busy = GaugeMetricFamily(
            "echomq_worker_busy_slots", "Slots of the queue's live workers running a job now.", labels=["queue"])
        outbox_rows = GaugeMetricFamily(
            "echomq_outbox_rows", "Jobs committed in the outbox and not yet sent to Redis.", labels=["queue"])
        outbox_oldest = GaugeMetricFamily(
            "echomq_outbox_oldest_seconds", "Seconds the oldest job in the outbox has waited to be sent; 0 when none.",
            labels=["queue"])
        outbox = read_outbox()  # None: no queue uses the outbox
        for reading in self.readings():
            if outbox is not None:
                rows = outbox.get(reading.name)
                outbox_rows.add_metric([reading.name], rows.rows if rows else 0)
                outbox_oldest.add_metric([reading.name], rows.oldest_age_s if rows else 0)
            label = [reading.name]
            completed.add_metric(label, reading.totals["completed"])
            failed.add_metric(label, reading.totals["failed"])
            recovered.add_metric(label, reading.totals["recovered"])
            for state in COUNTED:
                jobs.add_metric([reading.name, state], reading.counts[state])
            oldest.add_metric(label, (reading.oldest_waiting_ms or 0) / 1000)
            if reading.last_sweep_age_s is not None:
                swept.add_metric(label, reading.last_sweep_age_s)
            workers.add_metric(label, reading.workers)
            busy.add_metric(label, reading.busy_slots)
        yield from (completed, failed, recovered, jobs, oldest, swept, workers, busy)
        if outbox is not None:
            yield from (outbox_rows, outbox_oldest)

    def readings(self) -> Iterator[QueueReading]:
        """Each queue's reading; a queue with a broken key is left out, Redis out of reach raises."""
        for name in self.names:
            try:
                yield read_queue(name)
            except (QueueStateError, ResponseError) as error:  # a key another client gave another type
                logger.warning("queue %s: left out of the metrics: %s", name, error)


@never_cache
@vary_on_headers("Authorization", "Cookie")
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """Every configured queue in the Prometheus text format, to a scraper with the token or to permitted staff."""
    try:
        settings = get_settings()
    except ImproperlyConfigured as error:  # `manage.py check` names it too; the scraper gets one line
        return HttpResponse(f"The ECHOMQ setting is wrong: {error}\n", status=503, content_type=TEXT)
    refused = refusal(request, settings.metrics_token)
    if refused:
        return refused
    registry = CollectorRegistry()  # of this request only: no process metrics, no duplicate registrations
    registry.register(QueueCollector(list(settings.queues)))
    try:
        exposition = generate_latest(registry)
    except UNREACHABLE as error:  # a failed scrape, which Prometheus records as such (up == 0)
        return HttpResponse(f"Redis did not answer: {error}\n", status=503, content_type=TEXT)
    return HttpResponse(exposition, content_type=CONTENT_TYPE_LATEST)


def refusal(request: HttpRequest, expected: str | None) -> HttpResponse | None:
    """The 401 or 403 this request gets (`expected`: the METRICS_TOKEN), or None when it may read the metrics."""
    token = bearer_token(request)
    if token is not None:
        short = short_token_problem(expected, debug=django_settings.DEBUG)
        if short and not short.warning:  # the scraper is told no more than for a wrong token
            logger.warning("a bearer token was refused: %s", short.message)
            return unauthorized(WRONG_TOKEN)
        if expected is not None and secrets.compare_digest(token.encode(), expected.encode()):
            return None
        return unauthorized(WRONG_TOKEN)
    user: Any = request.user
    if not user.is_authenticated:
        return unauthorized(NOT_AUTHENTICATED)
    if user.is_active and user.is_staff and user.has_perm("echomq.view_metrics"):
        return None
    return HttpResponse(NOT_PERMITTED, status=403, content_type=TEXT)


def bearer_token(request: HttpRequest) -> str | None:
    """The token of an `Authorization: Bearer` header ("" when empty); None without one.

    Another scheme (Basic, from a proxy in front of the site) is not ours to judge.
    """
    scheme, _, credentials = request.headers.get("Authorization", "").strip().partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" else None


def unauthorized(message: str) -> HttpResponse:
    response = HttpResponse(message, status=401, content_type=TEXT)
    response["WWW-Authenticate"] = "Bearer"
    return response
