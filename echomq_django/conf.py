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
        "SCHEDULES": {"heartbeat": {"TASK": "myapp.jobs.ping", "EVERY": 30}},  # see schedules.py
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
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils import timezone

from .core import (
    ALPHABET,
    MAX_ATTEMPTS,
    MAX_DELAY_MS,
    MAX_RATE_WINDOW_MS,
    POOLS,
    Backoff,
    Confirm,
    InvalidNameError,
    JobOptions,
    PayloadError,
    RateLimit,
    RedisURLError,
    Retention,
    WorkerOptions,
    defaults,
    delay_until,
    parse_redis_url,
    validate_name,
)

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
    # Periodic jobs: name -> options, read by echomq_beat (schedules.py checks them).
    "SCHEDULES": {},
    # An enqueue inside a transaction writes the job to the database's outbox in that transaction,
    # sent to Redis after the commit (outbox.py); a queue's own OUTBOX overrides it.
    "OUTBOX": False,
    # Seconds an outbox row may wait to be sent; an older one is not sent (the record that keeps a
    # second send out lasts this long), and manage.py check --deploy reports it.
    "OUTBOX_MAX_AGE": 86_400,
    # Seconds a finished workflow's record and results are kept (docs/workflows.md).
    "WORKFLOW_TTL": 86_400,
    # With OpenTelemetry tracing on (the otel extra): a job's process spans are children of the span that
    # sent it, in its trace; False: each starts a trace of its own, linked to that span (core/producing/tracing.py).
    "TRACE_AS_CHILD": False,
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


# The most log lines a job may keep: at 10,000 characters a line, a job's log stays under 1 GB.
MAX_LOG_LINES = 100_000
# A metrics token shorter than this is easy to guess.
MIN_TOKEN_LENGTH = 24

# The longest duration a setting may give, as for a job's delay (nan fails every comparison).
MAX_SECONDS = MAX_DELAY_MS // 1000


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the settings, as a system check reports it."""

    id: str
    message: str
    hint: str
    warning: bool = False


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
        fields: dict[str, Any] = dict(
            prefix=top.prefix, concurrency=self.concurrency, lock_duration_ms=self.lock_duration_ms,
            renew_interval_ms=self.renew_interval_ms, default_attempts=self.attempts,
            keep_completed=self.keep_completed, keep_failed=self.keep_failed, confirm=top.confirm,
            metrics_minutes=top.metrics_minutes, max_log_lines=self.max_log_lines, pool=self.pool,
            time_limit_ms=self.time_limit_ms, soft_time_limit_ms=self.soft_time_limit_ms,
            max_jobs_per_child=self.max_jobs_per_child, max_memory_per_child_kb=self.max_memory_per_child_mb * 1024,
            rate_limit=self.rate_limit, max_active=self.max_active, group_max_active=self.group_max_active,
            trace_as_child=top.trace_as_child)
        fields.update((key, value) for key, value in overrides.items() if value is not None)
        if fields["pool"] != "processes":
            fields.update(max_jobs_per_child=0, max_memory_per_child_kb=0, child_init=None)
        return WorkerOptions(**fields)


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


def _seconds_to_ms(value: Any, where: str, problems: list[Problem], *, allow_none: bool = False,
                   most_s: float = MAX_SECONDS, most: str = f"{MAX_SECONDS:,} (ten years)",
                   hint: str = "") -> int | None:
    """Seconds (fractions allowed, at most `most_s`, said as `most`) in ms; None, and a problem, when wrong."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= most_s:
        hint = hint or "Use a number such as 30 or 0.5" + (", or None." if allow_none else ".")
        problems.append(Problem("echomq.E005", f"{where} must be a positive number of seconds up to "
                                f"{most}, not {value!r}.", hint))
        return None
    return max(1, round(value * 1000))


def _limit_ms(value: Any, where: str, problems: list[Problem]) -> int | None:
    """A time limit in ms, 0 for None (no limit); None when it is wrong."""
    if value is None:
        return 0
    return _seconds_to_ms(value, where, problems, allow_none=True)


def _rate_limit(value: Any, where: str, problems: list[Problem]) -> RateLimit | None:
    if value is None:
        return None
    hint = 'Use {"MAX": jobs, "DURATION": seconds}, e.g. {"MAX": 10, "DURATION": 1} for 10 jobs a second.'
    if not isinstance(value, dict) or set(value) != {"MAX", "DURATION"}:
        problems.append(Problem("echomq.E006", f"{where} must be a dict with MAX and DURATION, not {value!r}.", hint))
        return None
    jobs = _count(value["MAX"], f"{where}['MAX']", problems, minimum=1)
    window_ms = _seconds_to_ms(value["DURATION"], f"{where}['DURATION']", problems,
                               most_s=MAX_RATE_WINDOW_MS / 1000, most=f"a day ({MAX_RATE_WINDOW_MS // 1000:,})",
                               hint="The window keeps a record of every start in it; for a daily quota use 86400.")
    if jobs is None or window_ms is None:
        return None
    return RateLimit(jobs, window_ms)


def _flag(value: Any, where: str, problems: list[Problem], *, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, bool):
        problems.append(Problem("echomq.E006", f"{where} must be True or False{' or None' if allow_none else ''}, "
                                f"not {value!r}.", "Use True or False."))
        return None
    return value


def _pool(value: Any, where: str, problems: list[Problem]) -> str:
    if not isinstance(value, str) or value not in POOLS:
        problems.append(Problem("echomq.E006", f"{where} must be one of {', '.join(map(repr, POOLS))}, "
                                f"not {value!r}.",
                                '"threads" (the default) runs jobs on threads of the worker; "processes" in '
                                "child processes, which use every core and can be killed at a time limit."))
    return value


def _count(value: Any, where: str, problems: list[Problem], *, minimum: int, maximum: int | None = None,
           allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum:,}"
        problems.append(Problem("echomq.E005", f"{where} must be a whole number {bounds}, not {value!r}.",
                                "Use a whole number."))
        return None
    return value


def _retention(value: Any, where: str, problems: list[Problem], *, fallback: dict[str, Any]) -> Retention:
    if not isinstance(value, dict) or set(value) - {"COUNT", "AGE"}:
        problems.append(Problem("echomq.E006", f"{where} must be a dict with COUNT and/or AGE.",
                                'For example {"COUNT": 1000, "AGE": 86400}; None means no limit.'))
        return Retention()  # a wrong value: the caller falls back to the default
    # A limit left out keeps its default (KEEP_COMPLETED's COUNT is 1000); None says "no limit".
    count = _count(value.get("COUNT", fallback["COUNT"]), f"{where}['COUNT']", problems, minimum=0, allow_none=True)
    age_ms = _seconds_to_ms(value.get("AGE", fallback["AGE"]), f"{where}['AGE']", problems, allow_none=True)
    return Retention(count=-1 if count is None else count, age_ms=age_ms or 0)


def _backoff(value: Any, where: str, problems: list[Problem]) -> Backoff:
    hint = 'Use {"TYPE": "fixed" or "exponential", "DELAY": seconds}.'
    if not isinstance(value, dict) or set(value) - {"TYPE", "DELAY"}:
        problems.append(Problem("echomq.E006", f"{where} must be a dict with TYPE and DELAY.", hint))
        return Backoff()
    delay = value.get("DELAY", 0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= MAX_SECONDS:
        problems.append(Problem("echomq.E005", f"{where}['DELAY'] must be seconds from 0 to {MAX_SECONDS:,} "
                                f"(ten years), not {delay!r}.", hint))
        delay = 0
    try:
        return Backoff(str(value.get("TYPE", "fixed")), round(delay * 1000))
    except ValueError as error:
        problems.append(Problem("echomq.E006", f"{where}: {error}.", hint))
        return Backoff()


# How one option is read: (value, where, problems) -> the resolved value; a wrong
# value adds to `problems`.
Parse = Callable[[Any, str, list[Problem]], Any]


def _option(values: dict[str, Any], known: dict[str, Any], key: str, where: str, problems: list[Problem],
            parse: Parse) -> Any:
    """The option `key` of `values`, parsed; a wrong value is reported and its default used instead.

    A value with only warnings (a short token) is reported and kept.
    """
    found: list[Problem] = []
    value = parse(values[key], f"{where}[{key!r}]", found)
    problems += found
    if all(problem.warning for problem in found):
        return value
    return parse(known[key], f"{where}[{key!r}]", [])


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
        return _option(values, QUEUE_DEFAULTS, key, where, problems, parse)

    lock_ms = option("LOCK_DURATION", _seconds_to_ms)
    renew_ms = option("LOCK_RENEW_INTERVAL", functools.partial(_seconds_to_ms, allow_none=True)) or lock_ms // 2
    if not 0 < renew_ms < lock_ms:  # a lock of 1 ms has no shorter whole interval: the worker refuses it
        problems.append(Problem(
            "echomq.E004", f"{where}: the lock is renewed every {renew_ms / 1000:g} s, which is not between 0 "
            f"and the lock duration of {lock_ms / 1000:g} s, so live jobs would look stalled.",
            "Make LOCK_RENEW_INTERVAL at most half of LOCK_DURATION (of at least 2 ms), or leave it None."))
    config = QueueConfig(
        name=name,
        lock_duration_ms=lock_ms,
        renew_interval_ms=renew_ms,
        sweep_interval_ms=option("SWEEP_INTERVAL", _seconds_to_ms),
        max_stalled_count=option("MAX_STALLED_COUNT", functools.partial(_count, minimum=0)),
        attempts=option("ATTEMPTS", functools.partial(_count, minimum=1, maximum=MAX_ATTEMPTS)),
        backoff=option("BACKOFF", _backoff),
        concurrency=option("CONCURRENCY", functools.partial(_count, minimum=1)),
        keep_completed=option("KEEP_COMPLETED", functools.partial(_retention,
                                                                  fallback=QUEUE_DEFAULTS["KEEP_COMPLETED"])),
        keep_failed=option("KEEP_FAILED", functools.partial(_retention, fallback=QUEUE_DEFAULTS["KEEP_FAILED"])),
        max_log_lines=option("MAX_LOG_LINES", _max_log_lines),
        pool=option("POOL", _pool),
        max_jobs_per_child=option("MAX_JOBS_PER_CHILD", functools.partial(_count, minimum=0)),
        max_memory_per_child_mb=option("MAX_MEMORY_PER_CHILD", functools.partial(_count, minimum=0)),
        rate_limit=option("RATE_LIMIT", _rate_limit),
        max_active=option("MAX_ACTIVE", functools.partial(_count, minimum=1, allow_none=True)) or 0,
        group_max_active=option("GROUP_MAX_ACTIVE", functools.partial(_count, minimum=1, allow_none=True)) or 0,
        outbox=option("OUTBOX", functools.partial(_flag, allow_none=True)),
        result_ttl_ms=option("RESULT_TTL", functools.partial(_seconds_to_ms, allow_none=True)) or 0,
        **_time_limits(option, where, problems),
    )
    if config.pool == "threads" and config.time_limit_ms:
        problems.append(threads_time_limit_warning(
            f"{where}['TIME_LIMIT'] is {config.time_limit_ms / 1000:g} s", name))
    return config, problems


def _time_limits(option: Callable[[str, Parse], Any], where: str, problems: list[Problem]) -> dict[str, int]:
    """TIME_LIMIT and SOFT_TIME_LIMIT in ms (0: none); a soft limit not under the hard one is an error."""
    hard, soft = option("TIME_LIMIT", _limit_ms), option("SOFT_TIME_LIMIT", _limit_ms)
    if hard and soft >= hard:
        problems.append(Problem(
            "echomq.E022", f"{where}: the SOFT_TIME_LIMIT of {soft / 1000:g} s is not shorter than the TIME_LIMIT "
            f"of {hard / 1000:g} s, so the job would never get its warning before it is stopped.",
            "Make SOFT_TIME_LIMIT shorter than TIME_LIMIT (the time the job has to clean up is the difference), "
            "or leave one of them None."))
        hard = soft = 0  # a wrong pair falls back to the defaults, as a wrong value does
    return {"time_limit_ms": hard, "soft_time_limit_ms": soft}


def threads_time_limit_warning(what: str, queue: str) -> Problem:
    """echomq.W017: `what` (a hard time limit) applies on `queue`, whose jobs run on threads, which cannot be killed."""
    return Problem(
        "echomq.W017", f"{what}, but queue {queue!r} runs its jobs on threads (POOL \"threads\"), and a thread "
        "cannot be killed.",
        "At the limit the worker fails the attempt (retried per its attempts) and stops renewing its lock, but the "
        "thread runs on, keeping its worker slot taken, until the job returns (or checks current_job()). Set the "
        "queue's POOL to \"processes\" (or run echomq_worker --pool processes) to enforce the limit.",
        warning=True)


def _redis_url(value: Any, where: str, problems: list[Problem]) -> str:
    try:
        parse_redis_url(value)
    except RedisURLError as error:
        problems.append(Problem("echomq.E002", f"{where} is wrong: {error}.",
                                "Use redis://host:port/db (rediss:// for TLS, unix:///path.sock), "
                                "redis+cluster://host:port,host:port or redis+sentinel://host:port/service."))
    return value


def _prefix(value: Any, where: str, problems: list[Problem]) -> str:
    try:
        validate_name(value, where)
    except InvalidNameError as error:
        problems.append(Problem("echomq.E003", f"{error}.", f"Use {ALPHABET}."))
    return value


def _max_log_lines(value: Any, where: str, problems: list[Problem]) -> int | None:
    lines = _count(value, where, problems, minimum=1)
    if lines is not None and lines > MAX_LOG_LINES:
        problems.append(Problem("echomq.E005", f"{where} must be at most {MAX_LOG_LINES:,}, not {lines!r}.",
                                "The default, 1000, keeps a job's newest 1,000 lines."))
        return None
    return lines


def _metrics_minutes(value: Any, where: str, problems: list[Problem]) -> int | None:
    minutes = _count(value, where, problems, minimum=0)
    if minutes is not None and minutes > defaults.MAX_METRICS_MINUTES:
        # (the scripts keep no more, whatever they are asked)
        problems.append(Problem("echomq.E005", f"{where} must be at most {defaults.MAX_METRICS_MINUTES:,} (a year), "
                                f"not {minutes!r}.", "The default, 1440, keeps a day."))
        return None
    return minutes


def _token(value: Any, where: str, problems: list[Problem]) -> str | None:
    # `env.str("METRICS_TOKEN", default="")` is the natural way to read it: empty or blank means none,
    # never a token that an empty "Authorization: Bearer" header would match.
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str) or not value.isascii() or not value.isprintable() or " " in value:
        problems.append(Problem("echomq.E015", f"{where} must be None or a token of printable ASCII without "
                                "spaces (the scraper sends it as 'Authorization: Bearer <token>').",
                                "Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'."))
        return None
    return value


def short_token_problem(token: str | None, *, debug: bool) -> Problem | None:
    """The problem of a METRICS_TOKEN too short to be safe: a warning under DEBUG, an error in production.

    Read apart from the settings (DEBUG can change without ECHOMQ changing): the
    check reports it, and the metrics view refuses such a token in production.
    """
    if token is None or len(token) >= MIN_TOKEN_LENGTH:
        return None
    hint = "Generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'."
    message = f"ECHOMQ['METRICS_TOKEN'] is {len(token)} characters long; a token shorter than {MIN_TOKEN_LENGTH} " \
              "is easy to guess"
    if debug:
        return Problem("echomq.W015", f"{message}.", hint, warning=True)
    return Problem("echomq.E023", f"{message}, and with DEBUG = False /echomq/metrics/ refuses it.", hint)


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
        return _option(values, TOP_LEVEL_DEFAULTS, key, "ECHOMQ", problems, parse)

    url = option("REDIS_URL", _redis_url)
    prefix = option("PREFIX", _prefix)
    max_payload = option("MAX_PAYLOAD_BYTES", functools.partial(_count, minimum=1))
    replicas = option("CONFIRM_REPLICAS", functools.partial(_count, minimum=0))
    confirm_ms = option("CONFIRM_TIMEOUT", _seconds_to_ms)
    enqueue_timeout_ms = option("ENQUEUE_TIMEOUT", _seconds_to_ms)
    metrics_minutes = option("METRICS_MINUTES", _metrics_minutes)
    metrics_token = option("METRICS_TOKEN", _token)
    outbox = option("OUTBOX", _flag)
    outbox_max_age_ms = option("OUTBOX_MAX_AGE", _seconds_to_ms)
    workflow_ttl_ms = option("WORKFLOW_TTL", _seconds_to_ms)
    trace_as_child = option("TRACE_AS_CHILD", _flag)
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
                              workflow_ttl_ms=workflow_ttl_ms, trace_as_child=trace_as_child)
    return resolved, problems


@functools.cache
def _cached() -> tuple[EchoMQSettings, list[Problem]]:
    return parse_settings(getattr(settings, "ECHOMQ", {}))


def settings_problems() -> list[Problem]:
    """Every problem in the current ECHOMQ setting (for the system checks)."""
    return _cached()[1]


_NO_TIME_LIMITS: dict[str, int | None] = {"time_limit_ms": None, "soft_time_limit_ms": None}


def time_limits_ms(time_limit: Any, soft_time_limit: Any) -> dict[str, int | None]:
    """A job's own time limits, given in seconds, as JobOptions.overridden takes them (None: the queue's).

    PayloadError for a limit that is not a positive number of seconds up to ten
    years, or a soft limit not shorter than the hard one.
    """
    if time_limit is None and soft_time_limit is None:
        return _NO_TIME_LIMITS  # most jobs: nothing to check (callers only unpack it)
    limits: dict[str, int | None] = {}
    for key, what, seconds in (("time_limit_ms", "time_limit", time_limit),
                               ("soft_time_limit_ms", "soft_time_limit", soft_time_limit)):
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                    or not 0 < seconds <= MAX_DELAY_MS / 1000 or not math.isfinite(seconds)):
            raise PayloadError(f"{what} must be a positive number of seconds up to ten years, or None, "
                               f"not {seconds!r}")
        limits[key] = None if seconds is None else max(1, round(seconds * 1000))
    JobOptions(time_limit_ms=limits["time_limit_ms"] or 0,
               soft_time_limit_ms=limits["soft_time_limit_ms"] or 0)  # the soft limit is the shorter
    return limits


def own_time_limits_ms(target: Any) -> dict[str, int | None]:
    """The time limits (ms, for JobOptions.overridden) a @job function or an EchoMQTask sets for its jobs."""
    return time_limits_ms(getattr(target, "time_limit", None), getattr(target, "soft_time_limit", None))


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


def delay_to(moment: datetime | None, from_ms: int) -> int:
    """The delay (ms) from `from_ms` to `moment` (an eta, a run_after); 0 without one or once past.

    A naive datetime means TIME_ZONE when USE_TZ is False (as Django reads one); with USE_TZ it is refused.
    """
    if isinstance(moment, datetime) and timezone.is_naive(moment) and not settings.USE_TZ:
        moment = timezone.make_aware(moment)
    return delay_until(moment, from_ms)


def expiry_ms(expires: float | timedelta | datetime | None, from_ms: int) -> int:
    """ms from `from_ms` (the job's creation) past which it never starts: `expires` in seconds, a timedelta, or a
    datetime (as for an eta); 0 for None. PayloadError for anything not ahead of `from_ms`."""
    if expires is None:
        return 0
    if isinstance(expires, datetime):
        ms = delay_to(expires, from_ms)
        if ms <= 0:
            raise PayloadError(f"expires {expires.isoformat()} is in the past: the job could never run")
        return ms
    seconds = expires.total_seconds() if isinstance(expires, timedelta) else expires
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_SECONDS:
        raise PayloadError(f"expires is a positive number of seconds (up to ten years), a timedelta or a datetime, "
                           f"not {expires!r}")
    return math.ceil(seconds * 1000)

