"""The app's settings: one `ECHOMQ` dict, read when first needed, re-read when it changes.

    ECHOMQ = {
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "PREFIX": "emq",
        "MAX_PAYLOAD_BYTES": 524288,
        "CONFIRM_REPLICAS": 0,  # WAIT for this many replicas after adds and finishes
        "CONFIRM_TIMEOUT": 1,
        "ENQUEUE_TIMEOUT": 3,  # seconds an enqueue may take before it raises
        "METRICS_MINUTES": 1440,  # per-minute metrics kept in Redis (0: none)
        "METRICS_TOKEN": None,  # bearer token a Prometheus scraper sends to /metrics/
        "SCHEDULES": {"heartbeat": {"TASK": "myapp.jobs.ping", "EVERY": 30}},  # see schedules/
        "QUEUES": {"default": {"LOCK_DURATION": 30, "SWEEP_INTERVAL": 30, ...}},
    }

A queue's jobs run on threads (POOL "threads", the default) or in child
processes (POOL "processes"); TIME_LIMIT and SOFT_TIME_LIMIT bound each
attempt, and MAX_JOBS_PER_CHILD / MAX_MEMORY_PER_CHILD (MB) recycle children.

Durations are in seconds (fractions allowed). Every problem is described once,
here, as a `Problem`; the system checks report them all, and reading broken
settings raises ImproperlyConfigured with the first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import routes
from . import settings_values as read
from .core import (
    ALPHABET,
    MAX_ATTEMPTS,
    Backoff,
    Confirm,
    InvalidNameError,
    JobOptions,
    RateLimit,
    Retention,
    WorkerOptions,
    defaults,
    validate_name,
)
from .settings_values import Parse, Problem, threads_time_limit_warning

# The runtime's defaults (core/defaults.py, in ms) in the settings' units (seconds),
# so that a value left out means the same with or without Django.
TOP_LEVEL_DEFAULTS: dict[str, Any] = {
    "REDIS_URL": defaults.REDIS_URL,
    "PREFIX": defaults.PREFIX,
    "MAX_PAYLOAD_BYTES": defaults.MAX_PAYLOAD_BYTES,
    "CONFIRM_REPLICAS": 0,  # replicas that must have an added job or a result before it counts (WAIT)
    "CONFIRM_TIMEOUT": defaults.CONFIRM_TIMEOUT_MS / 1000,  # seconds to wait for them
    # Seconds a producer's call (an enqueue, an admin view) may take when Redis does not
    # answer, retries included, before it raises; workers and sweepers wait out outages.
    "ENQUEUE_TIMEOUT": 3,
    # Minutes of per-minute metrics each queue keeps in Redis; 0 keeps none (and no all-time counters).
    "METRICS_MINUTES": defaults.METRICS_MINUTES,
    # A bearer token that lets a scraper read /metrics/ without a login; None: only staff with the permission.
    "METRICS_TOKEN": None,
    "QUEUES": {"default": {}},
    # Periodic jobs: name -> options, read by echomq_beat (schedules/parsing.py checks them).
    "SCHEDULES": {},
    # An enqueue inside a transaction writes the job to the database's outbox in that transaction,
    # sent to Redis after the commit (outbox/); a queue's own OUTBOX overrides it.
    "OUTBOX": False,
    # Seconds an outbox row may wait to be sent; an older one is not sent (the record that keeps a
    # second send out lasts this long), and manage.py check --deploy reports it.
    "OUTBOX_MAX_AGE": 86_400,
    # Seconds a finished workflow's record and results are kept (docs/workflows.md).
    "WORKFLOW_TTL": 86_400,
    # With OpenTelemetry tracing on (the otel extra): a job's process spans are children of the span that
    # sent it, in its trace; False: each starts a trace of its own, linked to that span (core/producing/tracing.py).
    "TRACE_AS_CHILD": False,
    # Which queue a task or @job without a queue of its own goes to: Celery's task_routes shapes (routes.py).
    "TASK_ROUTES": None,
}
QUEUE_DEFAULTS: dict[str, Any] = {
    "LOCK_DURATION": defaults.LOCK_DURATION_MS / 1000,  # seconds a lock lives unless renewed
    "LOCK_RENEW_INTERVAL": None,  # seconds between renewals; None = half the lock duration
    "SWEEP_INTERVAL": defaults.SWEEP_INTERVAL_MS / 1000,  # seconds between sweeps; also the gate's lifetime
    "MAX_STALLED_COUNT": defaults.MAX_STALLED_COUNT,  # stalls a job may survive before it is failed
    "ATTEMPTS": defaults.ATTEMPTS,  # default attempts of a job added without its own
    "BACKOFF": {"TYPE": "fixed", "DELAY": 0},  # default backoff; DELAY in seconds
    "CONCURRENCY": defaults.CONCURRENCY,  # worker threads per queue
    "KEEP_COMPLETED": {"COUNT": defaults.KEEP_COMPLETED_COUNT, "AGE": None},  # None = no limit; AGE in seconds
    "RESULT_TTL": None,  # seconds a completed job (its result) is kept at most; None = as KEEP_COMPLETED says
    "KEEP_FAILED": {"COUNT": None, "AGE": None},
    "MAX_LOG_LINES": defaults.MAX_LOG_LINES,  # log lines each job keeps; the oldest go first
    # What runs the jobs: "threads" of the worker's process, or "processes" (children started
    # once and reused, each running one job at a time), CONCURRENCY of them.
    "POOL": "threads",
    # Seconds an attempt may run (None: no limit); a job's own time_limit overrides it. On the
    # processes pool the child is killed at the limit; a thread cannot be killed (echomq.W017).
    "TIME_LIMIT": None,
    # Seconds after which SoftTimeLimitExceeded is raised in the job (None: never); less than TIME_LIMIT.
    "SOFT_TIME_LIMIT": None,
    "MAX_JOBS_PER_CHILD": 0,  # a child is replaced after this many jobs (0: never); processes pool only
    "MAX_MEMORY_PER_CHILD": 0,  # MB: a child whose memory grows past this is replaced (0: never); processes only
    # {"MAX": N, "DURATION": seconds}: at most N of the queue's jobs start in any window of DURATION,
    # across all its workers (None: no limit).
    "RATE_LIMIT": None,
    "MAX_ACTIVE": None,  # at most this many of the queue's jobs run at once, across all its workers (None: no cap)
    # At most this many jobs of one group run at once (None: no cap); groups take turns either way.
    "GROUP_MAX_ACTIVE": None,
    "OUTBOX": None,  # True or False: this queue's enqueues in a transaction go through the outbox; None: ECHOMQ's
}


@dataclass(frozen=True)
class QueueConfig:
    """The resolved settings of one queue."""

    name: str
    lock_duration_ms: int
    renew_interval_ms: int
    sweep_interval_ms: int
    max_stalled_count: int
    attempts: int
    backoff: Backoff
    concurrency: int
    keep_completed: Retention
    keep_failed: Retention
    max_log_lines: int = defaults.MAX_LOG_LINES
    pool: str = "threads"  # or "processes"
    time_limit_ms: int = 0  # 0: none
    soft_time_limit_ms: int = 0  # 0: none
    max_jobs_per_child: int = 0  # 0: never recycled
    max_memory_per_child_mb: int = 0  # 0: never recycled
    rate_limit: RateLimit | None = None  # None: no limit
    max_active: int = 0  # 0: no cap
    group_max_active: int = 0  # 0: no cap
    outbox: bool | None = None  # None: the top-level OUTBOX
    result_ttl_ms: int = 0  # 0: a completed job is kept as KEEP_COMPLETED says

    @property
    def job_options(self) -> JobOptions:
        """The options of this queue's jobs where a job gives none of its own (attempts, backoff, result TTL)."""
        return JobOptions(attempts=self.attempts, backoff=self.backoff, result_ttl_ms=self.result_ttl_ms)

    def worker_options(self, top: EchoMQSettings, **overrides: Any) -> WorkerOptions:
        """What a worker of this queue is told: its settings and `top`'s that every queue shares, with `overrides`
        (WorkerOptions fields; None keeps the setting). ValueError for an override that cannot be.

        On threads the children's settings (recycling, `child_init`) are left out, as they do not apply.
        """
        configured = WorkerOptions(
            prefix=top.prefix, concurrency=self.concurrency, lock_duration_ms=self.lock_duration_ms,
            renew_interval_ms=self.renew_interval_ms, default_attempts=self.attempts,
            keep_completed=self.keep_completed, keep_failed=self.keep_failed, confirm=top.confirm,
            metrics_minutes=top.metrics_minutes, max_log_lines=self.max_log_lines, pool=self.pool,
            time_limit_ms=self.time_limit_ms, soft_time_limit_ms=self.soft_time_limit_ms,
            max_jobs_per_child=self.max_jobs_per_child, max_memory_per_child_kb=self.max_memory_per_child_mb * 1024,
            rate_limit=self.rate_limit, max_active=self.max_active, group_max_active=self.group_max_active,
            trace_as_child=top.trace_as_child)
        options = replace(configured, **{key: value for key, value in overrides.items() if value is not None})
        if options.pool != "processes":
            options = replace(options, max_jobs_per_child=0, max_memory_per_child_kb=0, child_init=None)
        return options


@dataclass(frozen=True)
class EchoMQSettings:
    redis_url: str
    prefix: str
    max_payload_bytes: int
    queues: dict[str, QueueConfig]
    confirm: Confirm | None = None  # None: writes are not confirmed by replicas
    enqueue_timeout_s: float = TOP_LEVEL_DEFAULTS["ENQUEUE_TIMEOUT"]
    metrics_minutes: int = defaults.METRICS_MINUTES
    metrics_token: str | None = None
    outbox: bool = False
    outbox_max_age_ms: int = TOP_LEVEL_DEFAULTS["OUTBOX_MAX_AGE"] * 1000
    workflow_ttl_ms: int = TOP_LEVEL_DEFAULTS["WORKFLOW_TTL"] * 1000
    trace_as_child: bool = False
    task_routes: tuple[Any, ...] = ()

    def uses_outbox(self, name: str) -> bool:
        """Whether queue `name`'s enqueues inside a transaction go through the outbox."""
        own = self.queue(name).outbox
        return self.outbox if own is None else own

    def queue(self, name: str) -> QueueConfig:
        """The configuration of `name`; a queue that is not configured gets the defaults."""
        if name in self.queues:
            return self.queues[name]
        validate_name(name, "queue name")
        config, _problems = _queue_config(name, {})
        return config


def _queue_config(name: str, raw: Any) -> tuple[QueueConfig, list[Problem]]:
    problems: list[Problem] = []
    where = f"ECHOMQ['QUEUES'][{name!r}]"
    if not isinstance(raw, dict):
        problems.append(Problem("echomq.E006", f"{where} must be a dict of queue options.",
                                f"Known options: {', '.join(QUEUE_DEFAULTS)}."))
        raw = {}
    for unknown in sorted(set(raw) - set(QUEUE_DEFAULTS)):
        problems.append(Problem("echomq.W002", f"{where} has an unknown option {unknown!r}; it is ignored.",
                                f"Known options: {', '.join(QUEUE_DEFAULTS)}.", warning=True))
    values = {**QUEUE_DEFAULTS, **raw}

    def option(key: str, parse: Parse) -> Any:
        return read.option(values, QUEUE_DEFAULTS, key, where, problems, parse)

    lock_ms = option("LOCK_DURATION", read.seconds_to_ms)
    renew_ms = option("LOCK_RENEW_INTERVAL", functools.partial(read.seconds_to_ms, allow_none=True)) or lock_ms // 2
    if not 0 < renew_ms < lock_ms:  # a lock of 1 ms has no shorter whole interval: the worker refuses it
        problems.append(Problem(
            "echomq.E004", f"{where}: the lock is renewed every {renew_ms / 1000:g} s, which is not between 0 "
            f"and the lock duration of {lock_ms / 1000:g} s, so live jobs would look stalled.",
            "Make LOCK_RENEW_INTERVAL at most half of LOCK_DURATION (of at least 2 ms), or leave it None."))
    config = QueueConfig(
        name=name,
        lock_duration_ms=lock_ms,
        renew_interval_ms=renew_ms,
        sweep_interval_ms=option("SWEEP_INTERVAL", read.seconds_to_ms),
        max_stalled_count=option("MAX_STALLED_COUNT", functools.partial(read.count, minimum=0)),
        attempts=option("ATTEMPTS", functools.partial(read.count, minimum=1, maximum=MAX_ATTEMPTS)),
        backoff=option("BACKOFF", read.backoff),
        concurrency=option("CONCURRENCY", functools.partial(read.count, minimum=1)),
        keep_completed=option("KEEP_COMPLETED", functools.partial(read.retention,
                                                                  fallback=QUEUE_DEFAULTS["KEEP_COMPLETED"])),
        keep_failed=option("KEEP_FAILED", functools.partial(read.retention, fallback=QUEUE_DEFAULTS["KEEP_FAILED"])),
        max_log_lines=option("MAX_LOG_LINES", read.max_log_lines),
        pool=option("POOL", read.pool),
        max_jobs_per_child=option("MAX_JOBS_PER_CHILD", functools.partial(read.count, minimum=0)),
        max_memory_per_child_mb=option("MAX_MEMORY_PER_CHILD", functools.partial(read.count, minimum=0)),
        rate_limit=option("RATE_LIMIT", read.rate_limit),
        max_active=option("MAX_ACTIVE", functools.partial(read.count, minimum=1, allow_none=True)) or 0,
        group_max_active=option("GROUP_MAX_ACTIVE", functools.partial(read.count, minimum=1, allow_none=True)) or 0,
        outbox=option("OUTBOX", functools.partial(read.flag, allow_none=True)),
        result_ttl_ms=option("RESULT_TTL", functools.partial(read.seconds_to_ms, allow_none=True)) or 0,
        **_time_limits(option, where, problems),
    )
    if config.pool == "threads" and config.time_limit_ms:
        problems.append(threads_time_limit_warning(
            f"{where}['TIME_LIMIT'] is {config.time_limit_ms / 1000:g} s", name))
    return config, problems


def _time_limits(option: Callable[[str, Parse], Any], where: str, problems: list[Problem]) -> dict[str, int]:
    """TIME_LIMIT and SOFT_TIME_LIMIT in ms (0: none); a soft limit not under the hard one is an error."""
    hard, soft = option("TIME_LIMIT", read.limit_ms), option("SOFT_TIME_LIMIT", read.limit_ms)
    if hard and soft >= hard:
        problems.append(Problem(
            "echomq.E022", f"{where}: the SOFT_TIME_LIMIT of {soft / 1000:g} s is not shorter than the TIME_LIMIT "
            f"of {hard / 1000:g} s, so the job would never get its warning before it is stopped.",
            "Make SOFT_TIME_LIMIT shorter than TIME_LIMIT (the time the job has to clean up is the difference), "
            "or leave one of them None."))
        hard = soft = 0  # a wrong pair falls back to the defaults, as a wrong value does
    return {"time_limit_ms": hard, "soft_time_limit_ms": soft}


def parse_settings(raw: Any) -> tuple[EchoMQSettings, list[Problem]]:
    """Resolve a raw ECHOMQ value into settings, with every problem found."""
    problems: list[Problem] = []
    if not isinstance(raw, dict):
        problems.append(Problem("echomq.E001", f"ECHOMQ must be a dict, not {type(raw).__name__}.",
                                'For example ECHOMQ = {"REDIS_URL": "redis://127.0.0.1:6379/0"}.'))
        raw = {}
    for unknown in sorted(set(raw) - set(TOP_LEVEL_DEFAULTS)):
        problems.append(Problem("echomq.W001", f"ECHOMQ has an unknown key {unknown!r}; it is ignored.",
                                f"Known keys: {', '.join(TOP_LEVEL_DEFAULTS)}.", warning=True))
    values = {**TOP_LEVEL_DEFAULTS, **raw}

    def option(key: str, parse: Parse) -> Any:
        return read.option(values, TOP_LEVEL_DEFAULTS, key, "ECHOMQ", problems, parse)

    url = option("REDIS_URL", read.redis_url)
    prefix = option("PREFIX", read.prefix)
    max_payload = option("MAX_PAYLOAD_BYTES", functools.partial(read.count, minimum=1))
    replicas = option("CONFIRM_REPLICAS", functools.partial(read.count, minimum=0))
    confirm_ms = option("CONFIRM_TIMEOUT", read.seconds_to_ms)
    enqueue_timeout_ms = option("ENQUEUE_TIMEOUT", read.seconds_to_ms)
    metrics_minutes = option("METRICS_MINUTES", read.metrics_minutes)
    metrics_token = option("METRICS_TOKEN", read.token)
    outbox = option("OUTBOX", read.flag)
    outbox_max_age_ms = option("OUTBOX_MAX_AGE", read.seconds_to_ms)
    workflow_ttl_ms = option("WORKFLOW_TTL", read.seconds_to_ms)
    trace_as_child = option("TRACE_AS_CHILD", read.flag)
    try:
        task_routes = routes.parse(values["TASK_ROUTES"])
    except ValueError as error:
        problems.append(Problem("echomq.E025", f"ECHOMQ['TASK_ROUTES']: {error}.",
                                "See docs/migrating-from-celery.md, \"Routing\"."))
        task_routes = ()
    queues: dict[str, QueueConfig] = {}
    raw_queues = values["QUEUES"]
    if not isinstance(raw_queues, dict) or not raw_queues:
        problems.append(Problem("echomq.E001", "ECHOMQ['QUEUES'] must be a non-empty dict of queue name -> options.",
                                'For example {"default": {}}.'))
        raw_queues = TOP_LEVEL_DEFAULTS["QUEUES"]
    for name, options in raw_queues.items():
        try:
            validate_name(name, "queue name")
        except InvalidNameError as error:
            problems.append(Problem("echomq.E003", f"ECHOMQ['QUEUES']: {error}.",
                                    f"Queue names become part of Redis keys and admin URLs; use {ALPHABET}."))
            continue
        queues[name], queue_problems = _queue_config(name, options)
        problems += queue_problems
    resolved = EchoMQSettings(redis_url=url, prefix=prefix, max_payload_bytes=max_payload, queues=queues,
                              confirm=Confirm(replicas, confirm_ms) if replicas else None,
                              enqueue_timeout_s=enqueue_timeout_ms / 1000, metrics_minutes=metrics_minutes,
                              metrics_token=metrics_token, outbox=outbox, outbox_max_age_ms=outbox_max_age_ms,
                              workflow_ttl_ms=workflow_ttl_ms, trace_as_child=trace_as_child,
                              task_routes=task_routes)
    return resolved, problems


@functools.cache
def _cached() -> tuple[EchoMQSettings, list[Problem]]:
    return parse_settings(getattr(settings, "ECHOMQ", {}))


def settings_problems() -> list[Problem]:
    """Every problem in the current ECHOMQ setting (for the system checks)."""
    return _cached()[1]


def unserved_queue(queue: str) -> str | None:
    """Why jobs sent to `queue` would never run (it is not in ECHOMQ["QUEUES"]), or None when they would."""
    if queue in get_settings().queues:
        return None
    return (f"queue {queue!r} is not in ECHOMQ['QUEUES'], so no echomq_worker serves it "
            "(without --queue, workers and sweepers take only the configured queues)")


def settings_readable() -> bool:
    """Whether ECHOMQ has no errors, so what needs its queues (a check, a backend's) can read them."""
    return not any(not problem.warning for problem in settings_problems())


def get_settings() -> EchoMQSettings:
    """The current settings; raises ImproperlyConfigured if ECHOMQ has an error."""
    resolved, problems = _cached()
    errors = [problem for problem in problems if not problem.warning]
    if errors:
        raise ImproperlyConfigured(f"{errors[0].message} {errors[0].hint}")
    return resolved


@receiver(setting_changed)
def _reload(*, setting: str, **kwargs: Any) -> None:
    if setting == "ECHOMQ":
        _cached.cache_clear()


