"""A queue's metrics as its scripts keep them (lua/includes/metrics.lua), and a few live gauges; reads only.

Every worker and sweeper counts into the same per-minute hashes inside the
scripts that finish, start and recover jobs, so what is read here covers
every process on every host.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..producing.queue import Queue
from ..protocol.keys import MINUTE_MS
from ..protocol.times import now_ms

# The all-time counters (QueueKeys.metrics_total).
TOTALS = ("completed", "failed", "retried", "recovered")


@dataclass(frozen=True)
class Minute:
    """What one minute of a queue saw: job counts, and the wait and run times (ms) of the jobs it started and ran."""

    start_ms: int
    completed: int = 0
    failed: int = 0  # for good
    retried: int = 0  # failed attempts that run again
    recovered: int = 0  # by a sweep
    wait_count: int = 0  # first starts
    wait_sum_ms: int = 0
    wait_max_ms: int = 0
    run_count: int = 0  # attempts finished by a worker
    run_sum_ms: int = 0
    run_max_ms: int = 0
    waiting: int | None = None  # jobs ready but not taken when a sweep last looked; None: no sweep did

    @property
    def mean_wait_ms(self) -> float | None:
        return self.wait_sum_ms / self.wait_count if self.wait_count else None

    @property
    def mean_run_ms(self) -> float | None:
        return self.run_sum_ms / self.run_count if self.run_count else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "mean_wait_ms": self.mean_wait_ms, "mean_run_ms": self.mean_run_ms}

    @classmethod
    def from_hash(cls, start_ms: int, fields: dict[str, str]) -> Minute:
        """A minute from its hash; a field another client made unreadable reads as 0 (or no sample)."""
        def number(name: str) -> int | None:
            try:
                return int(float(fields[name])) if name in fields else None
            except (ValueError, OverflowError):
                return None

        counts = {name: number(field) or 0 for name, field in _COUNT_FIELDS.items()}
        return cls(start_ms, **counts, waiting=number("waiting"))


# Minute's attributes and the hash fields they come from.
_COUNT_FIELDS = {
    "completed": "completed", "failed": "failed", "retried": "retried", "recovered": "recovered",
    "wait_count": "wait_count", "wait_sum_ms": "wait_sum", "wait_max_ms": "wait_max",
    "run_count": "run_count", "run_sum_ms": "run_sum", "run_max_ms": "run_max",
}


def recent_minutes(queue: Queue, count: int, now: int | None = None) -> list[Minute]:
    """The last `count` minutes, oldest first; the last is the minute now, still counting."""
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    current = (now_ms() if now is None else now) // MINUTE_MS
    minutes = range(current - count + 1, current + 1)
    pipe = queue.client.pipeline(transaction=False)
    for minute in minutes:
        pipe.hgetall(queue.keys.metrics_minute(minute))
    replies = pipe.execute(raise_on_error=False)
    return [Minute.from_hash(minute * MINUTE_MS, fields if isinstance(fields, dict) else {})
            for minute, fields in zip(minutes, replies)]


def totals(queue: Queue) -> dict[str, int]:
    """The all-time counters: jobs completed, failed (for good), retried and recovered."""
    # A key of another type raises (WRONGTYPE), as a count of the queue does:
    # zeros would read as a counter reset to a scraper.
    counts = Minute.from_hash(0, queue.client.hgetall(queue.keys.metrics_total))
    return {name: getattr(counts, name) for name in TOTALS}


def oldest_waiting_age_ms(queue: Queue, now: int | None = None) -> int | None:
    """How long the oldest ready job has waited, in ms; None when none is waiting.

    Looked at: the oldest of `wait` and of `paused`, and the next job of
    `prioritized` (a low-priority job behind it can be older). A job's wait
    counts from its creation, or from the end of its delay.
    """
    keys = queue.keys
    pipe = queue.client.pipeline(transaction=False)
    pipe.lindex(keys.wait, -1)
    pipe.lindex(keys.paused, -1)
    pipe.zrange(keys.prioritized, 0, 0)
    oldest_wait, oldest_paused, next_prioritized = pipe.execute(raise_on_error=False)
    ids = [job_id for job_id in (oldest_wait, oldest_paused, *_list(next_prioritized)) if isinstance(job_id, str)]
    if not ids:
        return None
    for job_id in ids:
        pipe.hmget(keys.job(job_id), "timestamp", "due")
    since = []
    for reply in pipe.execute(raise_on_error=False):
        if isinstance(reply, list):
            for value in (reply[1], reply[0]):  # the end of the delay when there was one
                try:
                    since.append(int(float(value)))
                    break
                except (TypeError, ValueError, OverflowError):
                    continue
    if not since:
        return None
    return max((now_ms() if now is None else now) - min(since), 0)


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
