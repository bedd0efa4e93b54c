"""The stalled-job sweeper: runs the two-phase sweep of each queue on an interval."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .job import DEFAULT_ATTEMPTS
from .keys import QueueKeys
from .queue import now_ms
from .scripts import Scripts

logger = logging.getLogger("echomq.sweeper")

DEFAULT_INTERVAL_MS = 30_000
DEFAULT_MAX_STALLED_COUNT = 1
# Ids of `active` one script call may examine: small enough that no call
# blocks Redis for more than a few milliseconds, whatever the queue's size.
DEFAULT_BUDGET = 1000


@dataclass(frozen=True)
class SweepReport:
    """What one sweep of one queue did."""

    queue: str
    skipped: bool
    marked: int = 0
    recovered: int = 0
    failed: int = 0
    unmarked: int = 0
    duration_ms: float = 0.0
    calls: int = 0
    longest_call_ms: float = 0.0

    def summary(self) -> str:
        """One line for a log or a terminal."""
        if self.skipped:
            return f"queue {self.queue}: skipped, another sweep ran within the interval"
        return (
            f"queue {self.queue}: marked {self.marked}, recovered {self.recovered} to wait, "
            f"failed {self.failed}, unmarked {self.unmarked} "
            f"in {self.duration_ms:.1f} ms ({self.calls} script call{'s' * (self.calls != 1)}, "
            f"longest {self.longest_call_ms:.1f} ms)"
        )


class Sweeper:
    """Sweeps the given queues every `interval_ms` until stopped.

    The sweep's gate (`stalled-check`, PX = the interval) makes extra sweepers
    on other hosts harmless: each queue is swept once per interval however
    many run. `force=True` skips the gate, as an operator's "sweep now" does.
    """

    def __init__(
        self, client: Any, queues: Iterable[str], *, prefix: str = "emq",
        interval_ms: int = DEFAULT_INTERVAL_MS,
        max_stalled_count: int = DEFAULT_MAX_STALLED_COUNT,
        default_attempts: int = DEFAULT_ATTEMPTS, budget: int = DEFAULT_BUDGET,
        scripts: Scripts | None = None,
    ) -> None:
        if interval_ms < 1:
            raise ValueError(f"the sweep interval must be at least 1 ms, not {interval_ms}")
        if max_stalled_count < 0:
            raise ValueError(f"max_stalled_count must be >= 0, not {max_stalled_count}")
        self.client = client
        self.queues = [QueueKeys(name, prefix) for name in queues]
        if not self.queues:
            raise ValueError("the sweeper needs at least one queue")
        self.interval_ms = interval_ms
        self.max_stalled_count = max_stalled_count
        self.default_attempts = default_attempts
        self.budget = budget
        self.scripts = scripts or Scripts(client)
        self._stopping = threading.Event()
        self._aborted = threading.Event()

    def sweep(self, keys: QueueKeys, *, force: bool = False) -> SweepReport:
        """Run one whole sweep of one queue (one or more atomic script calls)."""
        phase, cursor = "start", 0
        totals = [0, 0, 0, 0]
        calls, longest, started = 0, 0.0, time.perf_counter()
        while phase != "done" and not self._aborted.is_set():
            call_started = time.perf_counter()
            phase, cursor, *counts = self.scripts.move_stalled_jobs_to_wait(
                keys, max_stalled_count=self.max_stalled_count, now=now_ms(),
                interval_ms=self.interval_ms, phase=phase, cursor=cursor, budget=self.budget,
                default_attempts=self.default_attempts, force=force,
            )
            calls += 1
            longest = max(longest, (time.perf_counter() - call_started) * 1000)
            if phase == "skipped":
                return SweepReport(keys.queue, skipped=True, calls=calls)
            totals = [total + count for total, count in zip(totals, counts)]
        marked, recovered, failed, unmarked = totals
        return SweepReport(
            keys.queue, skipped=False, marked=marked, recovered=recovered, failed=failed,
            unmarked=unmarked, duration_ms=(time.perf_counter() - started) * 1000,
            calls=calls, longest_call_ms=longest,
        )

    def sweep_all(self, *, force: bool = False) -> list[SweepReport]:
        """Sweep every queue once, in order; stops early once `stop()` was called."""
        reports = []
        for keys in self.queues:
            if self._stopping.is_set():
                break
            reports.append(self.sweep(keys, force=force))
        return reports

    def run(self, on_report: Callable[[SweepReport], None] | None = None, *, force: bool = False) -> None:
        """Sweep all queues, wait an interval after the sweep ends, repeat until stopped.

        Waiting after the sweep (not on a fixed cadence) means this sweeper's
        own gate has always expired when its next sweep starts.
        """
        report_to = on_report or (lambda report: logger.info("%s", report.summary()))
        while not self._stopping.is_set():
            for report in self.sweep_all(force=force):
                report_to(report)
            self._stopping.wait(self.interval_ms / 1000 + 0.005)

    def stop(self) -> None:
        """First call: finish the sweep in progress, then return. Second call: return now."""
        if self._stopping.is_set():
            self._aborted.set()
        self._stopping.set()
