"""The stalled-job sweeper: runs the two-phase sweep of each queue on its interval."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from redis.exceptions import ResponseError

from .. import defaults
from ..errors import QueueStateError
from ..producing.handoff import deliver_handoffs
from ..protocol.codec import decode_stored
from ..protocol.connection import UNREACHABLE, require_text_replies
from ..protocol.keys import QueueKeys
from ..protocol.scripts import Scripts
from ..protocol.times import now_ms
from .stopping import TwoStages

logger = logging.getLogger("echomq.sweeper")

# Ids of `active` one script call may examine: small enough that no call
# blocks Redis for more than a few milliseconds, whatever the queue's size.
DEFAULT_BUDGET = 1000
# Field of the queue's meta hash where each sweep leaves its report.
LAST_SWEEP_FIELD = "lastSweep"


@dataclass(frozen=True)
class SweepTarget:
    """One queue to sweep, with its own interval and ceilings."""

    queue: str
    interval_ms: int = defaults.SWEEP_INTERVAL_MS
    max_stalled_count: int = defaults.MAX_STALLED_COUNT
    default_attempts: int = defaults.ATTEMPTS
    # The workers' lock duration: after a gap in sweeping (Redis was away) no
    # sweep marks or recovers for this long, so live workers can renew first.
    lock_duration_ms: int = defaults.LOCK_DURATION_MS

    def __post_init__(self) -> None:
        if self.interval_ms < 1:
            raise ValueError(f"the sweep interval must be at least 1 ms, not {self.interval_ms}")
        if self.lock_duration_ms < 1:
            raise ValueError(f"the lock duration must be at least 1 ms, not {self.lock_duration_ms}")
        if self.max_stalled_count < 0:
            raise ValueError(f"max_stalled_count must be >= 0, not {self.max_stalled_count}")


@dataclass(frozen=True)
class SweepReport:
    """What one sweep of one queue did."""

    queue: str
    skipped: bool
    held_ms: int = 0  # > 0: the hold after a gap in sweeping; nothing was marked or recovered
    marked: int = 0
    recovered: int = 0
    failed: int = 0
    unmarked: int = 0
    duration_ms: float = 0.0
    calls: int = 0
    longest_call_ms: float = 0.0
    finished_at_ms: int = 0

    def summary(self) -> str:
        """One line for a log or a terminal."""
        if self.skipped:
            return f"queue {self.queue}: skipped, another sweep ran within the interval"
        if self.held_ms:
            return (f"queue {self.queue}: held for {self.held_ms / 1000:.1f} s more: sweeps stopped for a while "
                    "(Redis was unreachable, or no sweeper ran), so live workers get one lock duration to "
                    "renew before anything is marked or recovered")
        return (
            f"queue {self.queue}: marked {self.marked}, recovered {self.recovered} to wait, "
            f"failed {self.failed}, unmarked {self.unmarked} "
            f"in {self.duration_ms:.1f} ms ({self.calls} script call{'s' * (self.calls != 1)}, "
            f"longest {self.longest_call_ms:.1f} ms)"
        )


class Sweeper:
    """Sweeps each target queue every its interval until stopped.

    The sweep's gate (`stalled-check`, PX = the interval) makes extra sweepers
    on other hosts harmless: each queue is swept once per interval however
    many run. `force=True` sweeps whatever the gate says, as an operator's
    "sweep now" does, and closes the gate for an interval afterwards.
    Queues given by name use the sweeper's own interval and ceilings.
    After a gap in sweeping (Redis restarted or unreachable), the script holds
    every sweep for one lock duration: see SweepTarget.lock_duration_ms.
    """

    def __init__(
        self, client: Any, queues: Iterable[str | SweepTarget], *, prefix: str = defaults.PREFIX,
        interval_ms: int = defaults.SWEEP_INTERVAL_MS,
        max_stalled_count: int = defaults.MAX_STALLED_COUNT,
        default_attempts: int = defaults.ATTEMPTS, budget: int = DEFAULT_BUDGET,
        lock_duration_ms: int = defaults.LOCK_DURATION_MS, scripts: Scripts | None = None,
        metrics_minutes: int = defaults.METRICS_MINUTES,
    ) -> None:
        self.client = client
        self.metrics_minutes = metrics_minutes
        self.targets = [
            queue if isinstance(queue, SweepTarget)
            else SweepTarget(queue, interval_ms, max_stalled_count, default_attempts, lock_duration_ms)
            for queue in queues
        ]
        if not self.targets:
            raise ValueError("the sweeper needs at least one queue")
        if budget < 1:
            raise ValueError(f"the budget per script call must be at least 1 id, not {budget}")
        self._keys = {target.queue: QueueKeys(target.queue, prefix) for target in self.targets}
        self.budget = budget
        require_text_replies(client)
        self.scripts = scripts or Scripts(client)
        self._stages = TwoStages()  # what stop() and abort() set
        self._stopping, self._aborted = self._stages.stopping, self._stages.aborted

    def sweep(self, target: SweepTarget, *, force: bool = False) -> SweepReport:
        """Run one whole sweep of one queue (one or more atomic script calls)."""
        keys = self._keys[target.queue]
        phase, cursor, held_ms = "start", 0, 0
        totals = [0, 0, 0, 0]
        calls, longest, started = 0, 0.0, time.perf_counter()
        while phase != "done" and not self._aborted.is_set():
            call_started = time.perf_counter()
            phase, cursor, *counts, repairs = self.scripts.move_stalled_jobs_to_wait(
                keys, max_stalled_count=target.max_stalled_count, now=now_ms(),
                interval_ms=target.interval_ms, phase=phase, cursor=cursor, budget=self.budget,
                default_attempts=target.default_attempts, force=force, lock_ms=target.lock_duration_ms,
                metrics_minutes=self.metrics_minutes,
            )
            calls += 1
            longest = max(longest, (time.perf_counter() - call_started) * 1000)
            for repair in repairs:  # made once: the next sweep finds it right
                logger.warning("queue %s: another client's writes had left the groups wrong; repaired: %s",
                               target.queue, repair)
            if phase == "skipped":
                return SweepReport(target.queue, skipped=True, calls=calls, finished_at_ms=now_ms())
            if phase == "held":
                phase = "done"
                held_ms = cursor
            totals = [total + count for total, count in zip(totals, counts)]
        marked, recovered, failed, unmarked = totals
        # Workflow ends bound for other queues that their worker could not deliver (it died, Redis went away),
        # and those of the jobs this sweep failed.
        deliver_handoffs(self.scripts, keys, now_ms())
        report = SweepReport(
            target.queue, skipped=False, held_ms=held_ms, marked=marked, recovered=recovered, failed=failed,
            unmarked=unmarked, duration_ms=(time.perf_counter() - started) * 1000,
            calls=calls, longest_call_ms=longest, finished_at_ms=now_ms(),
        )
        # Its interval too: `echomq_sweep --interval` may differ from the settings, and "no sweeper" is late by it.
        record = {**asdict(report), "host": socket.gethostname(), "forced": force, "interval_ms": target.interval_ms}
        self.client.hset(keys.meta, LAST_SWEEP_FIELD, json.dumps(record))
        return report

    def sweep_all(self, *, force: bool = False) -> list[SweepReport]:
        """Sweep every queue once, in order; stops early once `stop()` was called."""
        reports = []
        for target in self.targets:
            if self._stopping.is_set():
                break
            reports.append(self.sweep(target, force=force))
        return reports

    def run(self, on_report: Callable[[SweepReport], None] | None = None, *, force: bool = False) -> None:
        """Sweep each queue every its interval until stopped, riding out Redis outages.

        A queue's next sweep is scheduled one interval after its sweep ends (not
        on a fixed cadence), so this sweeper's own gate has always expired by then.
        """
        report_to = on_report or (lambda report: logger.info("%s", report.summary()))
        due = {target.queue: 0.0 for target in self.targets}
        outage_since: float | None = None
        while not self._stopping.is_set():
            for target in self.targets:
                if self._stopping.is_set() or time.monotonic() < due[target.queue]:
                    continue
                # The one place that decides "Redis is unreachable, wait and retry":
                # the sweep and whatever `on_report` does with Redis (the mirror) both
                # go through it, so no outage of any length ends the loop.
                try:
                    report = self.sweep(target, force=force)
                    report_to(report)
                except UNREACHABLE as error:
                    if outage_since is None:
                        outage_since = time.monotonic()
                        logger.error("Redis unreachable (%s); the sweeper keeps retrying", error)
                    self._stopping.wait(min(5.0, 1.0 + time.monotonic() - outage_since))
                    break
                except (QueueStateError, ResponseError) as error:
                    # One broken queue must not stop the sweeps of the others.
                    logger.error("queue %s: sweep failed: %s", target.queue, error)
                    due[target.queue] = time.monotonic() + target.interval_ms / 1000
                    continue
                if outage_since is not None:
                    logger.warning("Redis is back after %.0f s; sweeping again", time.monotonic() - outage_since)
                    outage_since = None
                due[target.queue] = time.monotonic() + target.interval_ms / 1000 + 0.005
            else:
                self._stopping.wait(max(0.0, min(due.values()) - time.monotonic()))

    def stop(self) -> None:
        """First call: finish the sweep in progress, then return. A second call aborts.

        Thread-safe, not signal-safe: from a signal, use run_until_signalled (signals.py).
        """
        if self._stages.stop():
            self.abort()
        else:
            logger.info("sweeper: stopping after the sweep in progress (stop again to leave now)")

    def abort(self) -> None:
        """Return now, between two script calls of the sweep in progress (each handles whole jobs)."""
        if self._stages.abort():
            logger.warning("sweeper: leaving now")


def last_sweep(client: Any, keys: QueueKeys) -> dict[str, Any] | None:
    """The report the most recent sweep of this queue left, by any sweeper, or None."""
    raw = client.hget(keys.meta, LAST_SWEEP_FIELD)
    try:
        report = decode_stored(raw) if raw else None
    except ValueError:  # written by some other client (or nested past decoding)
        return None
    return report if isinstance(report, dict) else None
