"""A schedule and its ticks: the arithmetic every scheduler computes alike, with no Redis.

A schedule's ticks are instants every scheduler computes alike: an interval
schedule ticks at whole multiples of its period since the Unix epoch (tick n
is at n x EVERY, so ticks never drift), a cron schedule at the times its
expression names in its time zone (cronsim, which on a daylight-saving day
fires a daily job once: at the next valid time on the spring-forward day, at
the first of the two on the fall-back day). Which tick becomes a job is
decided in Redis by fireSchedule (one script call per tick, see records.py),
so any number of schedulers on any number of hosts add each tick's job once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ..errors import ScheduleError
from ..protocol.keys import validate_job_name, validate_name
from ..protocol.options import MAX_DELAY_MS, JobOptions
from ..protocol.times import seconds_text

# A tick's job id is "<schedule name>@<tick ms>", within the 128 characters of an id.
MAX_SCHEDULE_NAME = 100
MIN_EVERY_MS = 100
# How late a tick may fire when it is not caught up (CATCH_UP False, or a
# schedule that never fired before): this, or half the gap to the next tick
# when that is shorter. Later than that, it is recorded as missed.
MISSED_AFTER_MS = 60_000
# Steps through a cron expression's times before giving up (a repeated hour needs two).
MAX_STEPS = 8


@dataclass(frozen=True)
class Schedule:
    """One periodic job: what to add (job name, data, options) to which queue, and when.

    Exactly one of `cron` (five fields, in `timezone`) and `every_ms`.
    `since_ms`: ticks before it are not caught up (the time the schedule was
    created, changed or enabled), so re-enabling a schedule does not fire
    the tick it slept through. A beat takes it as no later than when it
    first saw this version of the schedule, by Redis's clock: a web host
    whose clock runs ahead does not make on-time ticks "missed".
    """

    name: str
    queue: str
    job_name: str
    data: Any = None
    opts: JobOptions = field(default_factory=JobOptions)
    cron: str | None = None
    every_ms: int | None = None
    timezone: str = "UTC"
    catch_up: bool = True
    skip_if_running: bool = False
    since_ms: int = 0

    def __post_init__(self) -> None:
        validate_name(self.name, "schedule name")
        if len(self.name) > MAX_SCHEDULE_NAME:
            raise ScheduleError(f"schedule name {self.name[:20]!r}... is {len(self.name)} characters long; "
                                f"the limit is {MAX_SCHEDULE_NAME}")
        validate_name(self.queue, "queue name")
        validate_job_name(self.job_name)
        if (self.cron is None) == (self.every_ms is None):
            raise ScheduleError(f"schedule {self.name!r} needs exactly one of a cron expression and an interval")
        zone(self.timezone)
        if self.cron is not None:
            check_cron(self.cron)
        elif (isinstance(self.every_ms, bool) or not isinstance(self.every_ms, int)
              or not MIN_EVERY_MS <= self.every_ms <= MAX_DELAY_MS):
            raise ScheduleError(f"the interval of schedule {self.name!r} must be from {MIN_EVERY_MS} ms to ten "
                                f"years, not {self.every_ms!r} ms")

    def tick_at_or_before(self, at_ms: int) -> int:
        """The latest tick no later than `at_ms` (ms since the epoch)."""
        if self.every_ms is not None:
            return at_ms // self.every_ms * self.every_ms
        # cronsim's steps are strict, so start just after `at_ms` to include a tick at it. In the
        # second pass of a repeated (fall-back) hour, stepping back may skip the tick of the first
        # pass; stepping forward from what it found puts that right.
        tick = _ms(next(CronSim(str(self.cron), self._local(at_ms + 1), reverse=True)))
        for _ in range(MAX_STEPS):
            following = self.tick_after(tick)
            if following > at_ms:
                return tick
            tick = following
        return tick

    def tick_after(self, at_ms: int) -> int:
        """The first tick later than `at_ms`."""
        if self.every_ms is not None:
            return (at_ms // self.every_ms + 1) * self.every_ms
        # In the second pass of a repeated (fall-back) hour, cronsim's next local time can be an
        # instant of the first pass, before `at_ms`: those are skipped.
        ticks = CronSim(str(self.cron), self._local(at_ms))
        for _ in range(MAX_STEPS):
            tick = _ms(next(ticks))
            if tick > at_ms:
                return tick
        raise ScheduleError(f"schedule {self.name!r}: no tick after {at_ms} ms within {MAX_STEPS} steps")

    def next_ticks(self, at_ms: int, count: int) -> list[int]:
        """The `count` ticks after `at_ms`."""
        ticks = []
        for _ in range(count):
            at_ms = self.tick_after(at_ms)
            ticks.append(at_ms)
        return ticks

    def job_id(self, tick_ms: int) -> str:
        """The id of the job a tick adds: the same for every scheduler, so a tick is one job."""
        return f"{self.name}@{tick_ms}"

    def missed_after_ms(self, tick_ms: int) -> int:
        """How late the tick may fire when it is not caught up: never, for a tick from before `since_ms`.

        A tick from before a change may already have been fired under the
        schedule's old version (its old name, say), or slept through while
        it was disabled. (One fired on another queue is the beat's floor.)
        """
        if tick_ms < self.since_ms:
            return 0
        return min(MISSED_AFTER_MS, (self.tick_after(tick_ms) - tick_ms) // 2)

    def describe(self) -> str:
        """"every 5 s" or "cron 0 3 * * 1-5 (Europe/Berlin)"."""
        if self.every_ms is not None:
            return f"every {seconds_text(self.every_ms)} s"
        return f"cron {self.cron} ({self.timezone})"

    def _local(self, at_ms: int) -> datetime:
        return datetime.fromtimestamp(at_ms / 1000, UTC).astimezone(zone(self.timezone))


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def zone(name: str) -> ZoneInfo:
    """The time zone named `name`; ScheduleError when there is none, or when it is each host's own."""
    if name == "localtime":
        # /etc/localtime of whichever host reads it: schedulers on hosts in other zones would disagree on the ticks.
        raise ScheduleError("time zone 'localtime' is each host's own; name the zone (e.g. 'Europe/Berlin')")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError, OSError):  # OSError: a folder of zones ("Europe")
        raise ScheduleError(f"unknown time zone {name!r} (use an IANA name such as 'Europe/Berlin' or 'UTC')"
                            ) from None


def check_cron(expression: object) -> str:
    """`expression` if it is a five-field cron expression that has a next time; else ScheduleError."""
    if not isinstance(expression, str) or len(expression.split()) != 5:
        raise ScheduleError(f"cron expression {expression!r} must have five fields: minute hour "
                            "day-of-month month day-of-week, e.g. '0 3 * * 1-5'")
    try:
        next(CronSim(expression, datetime.now(UTC)))
    except (CronSimError, StopIteration) as error:
        raise ScheduleError(f"cron expression {expression!r} is wrong: {error or 'it never fires'}") from None
    return expression
