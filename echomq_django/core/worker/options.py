"""A worker's options in one frozen, typed object: what the settings hand the core, checked once, whole.

    Worker("default", handler, client, WorkerOptions(concurrency=8, pool="processes", time_limit_ms=60_000))

The Django layer builds one per queue from its settings (conf.QueueConfig.worker_options); a script using the
core alone writes its own. The worker's parts each take their share: the slots (SlotOptions: the pool, the time
limits, the children's life) and the fetch loop (FetchOptions: locks, attempts, retention, flow control).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .. import defaults
from ..protocol.options import JobOptions
from ..protocol.scripts import Confirm, RateLimit
from .pool import POOLS
from .round_trips import FetchOptions
from .slots import SlotOptions


@dataclass(frozen=True)
class Retention:
    """How many finished jobs a set keeps: `count` newest (-1 = all), none older than `age_ms` (0 = any)."""

    count: int = -1
    age_ms: int = 0


@dataclass(frozen=True)
class WorkerOptions:
    """Everything a Worker is told, each with the runtime's default; ValueError on construction says what is wrong.

    Durations are in ms, child memory in KB. `renew_interval_ms` None renews at half the lock duration; 0 for a
    time limit, a cap or a child's recycling means none.
    """

    prefix: str = defaults.PREFIX
    concurrency: int = defaults.CONCURRENCY
    # Locks and attempts.
    lock_duration_ms: int = defaults.LOCK_DURATION_MS
    renew_interval_ms: int | None = None
    default_attempts: int = defaults.ATTEMPTS
    block_timeout_s: float = 1.0  # the longest a fetch waits for work in one call
    # What is kept of finished jobs, and where results are confirmed.
    keep_completed: Retention = Retention(count=defaults.KEEP_COMPLETED_COUNT)
    keep_failed: Retention = Retention()
    confirm: Confirm | None = None
    metrics_minutes: int = defaults.METRICS_MINUTES
    max_log_lines: int = defaults.MAX_LOG_LINES
    # How the slots run jobs.
    pool: str = "threads"
    time_limit_ms: int = 0
    soft_time_limit_ms: int = 0
    max_jobs_per_child: int = 0
    max_memory_per_child_kb: int = 0
    child_init: Callable[[], None] | None = None
    trace_as_child: bool = False
    # Flow control, held across every worker of the queue.
    rate_limit: RateLimit | None = None
    max_active: int = 0
    group_max_active: int = 0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {self.concurrency}")
        if self.pool not in POOLS:
            raise ValueError(f"pool must be one of {', '.join(POOLS)}, not {self.pool!r}")
        JobOptions(time_limit_ms=self.time_limit_ms, soft_time_limit_ms=self.soft_time_limit_ms)  # the same bounds
        if self.max_jobs_per_child < 0 or self.max_memory_per_child_kb < 0:
            raise ValueError("max_jobs_per_child and max_memory_per_child_kb must be 0 (no limit) or more")
        if self.max_active < 0 or self.group_max_active < 0:
            raise ValueError(f"max_active and group_max_active must be 0 (no cap) or more, not {self.max_active} "
                             f"and {self.group_max_active}")
        if self.max_log_lines < 1:
            raise ValueError(f"a job must keep at least 1 log line, not {self.max_log_lines}")
        if not 0 < self.renew_ms < self.lock_duration_ms:
            raise ValueError(f"lock renewal every {self.renew_ms} ms must be shorter than the "
                             f"lock duration of {self.lock_duration_ms} ms")

    @property
    def renew_ms(self) -> int:
        """The interval between lock renewals: the one given, or half the lock duration."""
        return self.renew_interval_ms or self.lock_duration_ms // 2

    def slots(self) -> SlotOptions:
        """The slots' share: the pool, the time limits, the children's life."""
        return SlotOptions(self.pool, self.time_limit_ms, self.soft_time_limit_ms, self.max_jobs_per_child,
                           self.max_memory_per_child_kb, self.child_init, self.trace_as_child)

    def fetching(self) -> FetchOptions:
        """The fetch loop's share: what each fetch asks of moveToActive and each finish of moveToFinished."""
        return FetchOptions(self.lock_duration_ms, self.default_attempts,
                            (self.keep_completed.count, self.keep_completed.age_ms),
                            (self.keep_failed.count, self.keep_failed.age_ms), self.metrics_minutes, self.confirm,
                            self.rate_limit, self.max_active, self.group_max_active)


DEFAULTS = WorkerOptions()  # a Worker given no options: the runtime's defaults (core/defaults.py)
