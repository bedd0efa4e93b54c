"""Schedules (cron and interval jobs) and the scheduler that fires them: each tick once, however many run.

A schedule's ticks are instants every scheduler computes alike: an interval
schedule ticks at whole multiples of its period since the Unix epoch (tick n
is at n x EVERY, so ticks never drift), a cron schedule at the times its
expression names in its time zone (cronsim, which on a daylight-saving day
fires a daily job once: at the next valid time on the spring-forward day, at
the first of the two on the fall-back day). Which tick becomes a job is
decided in Redis by fireSchedule (one script call per tick), so any number
of schedulers on any number of hosts add each tick's job once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from redis.exceptions import ClusterDownError, OutOfMemoryError, ReadOnlyError, ResponseError, TryAgainError

from .. import defaults
from ..errors import EchoMQError, PayloadError
from ..producing.tracing import send_traced, with_trace
from ..protocol.codec import encode_json
from ..protocol.connection import UNREACHABLE, require_text_replies
from ..protocol.keys import QueueKeys, validate_job_id, validate_job_name, validate_name
from ..protocol.options import MAX_DELAY_MS, JobOptions
from ..protocol.script_args import script_argv
from ..protocol.scripts import Call, Scripts
from ..protocol.times import now_ms, seconds_text
from ..worker.stopping import TwoStages

logger = logging.getLogger("echomq.beat")

# A tick's job id is "<schedule name>@<tick ms>", within the 128 characters of an id.
MAX_SCHEDULE_NAME = 100
MIN_EVERY_MS = 100
# How late a tick may fire when it is not caught up (CATCH_UP False, or a
# schedule that never fired before): this, or half the gap to the next tick
# when that is shorter. Later than that, it is recorded as missed.
MISSED_AFTER_MS = 60_000
OUTCOMES = ("fired", "skipped", "missed", "new", "superseded")
# Answers that decided nothing: the call ran too late (it waited in a frozen Redis or a
# stalled network past its deadline), or the tick lies ahead of Redis's clock.
UNDECIDED = ("expired", "early")
# Errors that pass (Redis unreachable, a failover under way, a Redis refusing writes for a
# while): the tick stays due and is sent again. Other errors (a record of another type) are
# the data's, and would only repeat.
TRANSIENT = (*UNREACHABLE, ReadOnlyError, TryAgainError, ClusterDownError, OutOfMemoryError)
TRANSIENT_REPLIES = ("NOREPLICAS", "MISCONF", "BUSY")
# Steps through a cron expression's times before giving up (a repeated hour needs two).
MAX_STEPS = 8
# A host clock that moves this far from the monotonic clock between two looks was stepped (NTP, a
# restored VM): Redis's clock is measured again rather than followed from the old offset.
CLOCK_STEP_MS = 500


def transient(error: BaseException) -> bool:
    """Whether `error` passes, so the tick stays due (see TRANSIENT)."""
    return isinstance(error, TRANSIENT) or (
        isinstance(error, ResponseError) and str(error).split(" ", 1)[0] in TRANSIENT_REPLIES)


class ScheduleError(EchoMQError, ValueError):
    """A schedule that cannot be: a bad cron expression, interval, time zone or name."""


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


@dataclass(frozen=True)
class Firing:
    """How one tick (or a run now: `tick_ms` None) of one schedule was decided."""

    schedule: str
    queue: str
    tick_ms: int | None
    outcome: str  # one of OUTCOMES
    job_id: str  # "" when no job was added
    decided: bool  # False: an earlier call had decided the tick (another scheduler, or a re-send)
    late_ms: int

    def summary(self) -> str:
        """One line for a log or a terminal."""
        if self.tick_ms is None:
            return f"schedule {self.schedule}: ran now as job {self.job_id} on queue {self.queue}"
        tick = datetime.fromtimestamp(self.tick_ms / 1000, UTC).isoformat(timespec="milliseconds")
        if not self.decided:
            return f"schedule {self.schedule}: tick {tick} was decided before ({self.outcome})"
        what = {"fired": f"fired job {self.job_id} on queue {self.queue}, {self.late_ms} ms late",
                "skipped": "skipped: the previous tick's job has not finished (SKIP_IF_RUNNING)",
                "missed": f"missed: found {self.late_ms / 1000:.1f} s late, and not caught up",
                "new": f"not fired: it fell {self.late_ms / 1000:.1f} s before the schedule was first seen; "
                       "its next tick is fired"}
        return f"schedule {self.schedule}: tick {tick} {what.get(self.outcome, self.outcome)}"


class Beat:
    """The scheduler: fires each schedule's due ticks until stopped.

    `load` returns the schedules; it is called again every
    `reload_interval_ms`, so changes take effect within that time. A beat
    that finds several ticks of a schedule passed (it was down, or Redis
    was) sends only the newest: missed ticks are coalesced into one.

    A schedule's record lives in its queue (so that the tick's job and the
    record are one script). A schedule that moves to another queue would
    find no record there, or an old one, so before a beat first fires a
    schedule (new to it, or changed) it reads the schedule's records on the
    other `queues` (and on any queue it saw the schedule on): each call
    carries the newest tick decided there, which fireSchedule takes as
    decided (and as the record's last tick, for catching up).
    """

    def __init__(
        self, client: Any, load: Callable[[], Iterable[Schedule]], *, prefix: str = defaults.PREFIX,
        scripts: Scripts | None = None, reload_interval_ms: int = 5000,
        max_payload_bytes: int = defaults.MAX_PAYLOAD_BYTES, clock: Callable[[], int] = now_ms,
        call_timeout_ms: int = 2000, close_reader: Callable[[], None] | None = None, queues: Iterable[str] = (),
    ) -> None:
        if reload_interval_ms < 1:
            raise ValueError(f"the reload interval must be at least 1 ms, not {reload_interval_ms}")
        self.client = client
        self.load = load
        self.prefix = prefix
        require_text_replies(client)
        self.scripts = scripts or Scripts(client)
        self.reload_interval_ms = reload_interval_ms
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        self.call_timeout_ms = call_timeout_ms
        self.queues = frozenset(queues)
        self._offset_ms: int | None = None  # Redis's clock minus ours, measured at each reading
        self._clock_drift_ms = 0  # our clock minus the monotonic clock when the offset was measured
        self.schedules: dict[str, Schedule] = {}  # as loaded
        self._firing: dict[str, Schedule] = {}  # as fired: since_ms no later than when first looked at
        self._floor: dict[str, int] = {}  # the newest tick decided on another queue
        self._seen_on: dict[str, set[str]] = {}  # the queues this beat saw each schedule on
        self._due_at: dict[str, int] = {}  # when this beat next sends a call for the schedule
        self._reload_at = 0
        self._stages = TwoStages()  # what stop() and abort() set
        self._stopping, self._aborted = self._stages.stopping, self._stages.aborted
        self._wake = threading.Event()  # set by stop() and by a reading that has ended
        # run() reads the schedules on a thread of its own, so a slow or locked database (a
        # SQLite write lock waits out its 5 s timeout) never holds a tick back; `close_reader`
        # runs on that thread as it ends (Django: connections.close_all, that thread's own).
        self.close_reader = close_reader

    def reload(self) -> None:
        """Read the schedules again; a new or changed one is looked at now, its newest tick first.

        The next reading falls due a reload interval from now, whether this one succeeds or not.
        """
        self._reload_at = self.now() + self.reload_interval_ms
        self._apply(list(self.load()))

    def _apply(self, loaded: list[Schedule]) -> None:
        schedules = {schedule.name: schedule for schedule in loaded}
        for name, schedule in schedules.items():
            if self.schedules.get(name) != schedule:
                self._due_at[name] = 0
                self._firing.pop(name, None)  # looked at afresh: its since and its floor
            self._seen_on.setdefault(name, set()).add(schedule.queue)
        for kept in (self._due_at, self._firing, self._floor, self._seen_on):
            for name in kept.keys() - schedules.keys():
                del kept[name]
        self.schedules = schedules

    def now(self) -> int:
        """The time by Redis's clock (ms), which every scheduler follows whatever its host's clock says."""
        local = self.clock()
        if self._offset_ms is None or abs(local - time.monotonic_ns() // 1_000_000 - self._clock_drift_ms) \
                > CLOCK_STEP_MS:
            self.measure_clock()  # never measured, or our clock was stepped since
            local = self.clock()
        return local + (self._offset_ms or 0)

    def measure_clock(self) -> None:
        """Measure how far Redis's clock is from ours (one TIME call)."""
        before = self.clock()
        seconds, micros = self.client.time()
        after = self.clock()
        self._offset_ms = int(seconds) * 1000 + int(micros) // 1000 - (before + after) // 2
        self._clock_drift_ms = after - time.monotonic_ns() // 1_000_000

    def _look_at_new(self, names: list[str], now: int) -> None:
        """Ready schedules new to this beat (or changed) for firing: their since, and their floor.

        The floor is the newest tick decided on another queue, read in one
        pipelined round trip (a record tick ahead of Redis's clock does not
        count, as in fireSchedule).
        """
        asked: list[tuple[str, str]] = []
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            for queue in sorted((self.queues | self._seen_on[name]) - {self.schedules[name].queue}):
                pipe.hget(QueueKeys(queue, self.prefix).schedule(name), "tick")
                asked.append((name, queue))
        replies = pipe.execute(raise_on_error=False) if asked else []
        floors = dict.fromkeys(names, 0)
        for (name, queue), reply in zip(asked, replies):
            if isinstance(reply, Exception):
                if transient(reply):
                    raise reply
                logger.error("schedule %s: its record on queue %s cannot be read (%s)", name, queue, reply)
            elif reply is not None and str(reply).isdigit() and int(reply) <= now + defaults.EARLY_MS:
                floors[name] = max(floors[name], int(reply))
        for name in names:
            schedule = self.schedules[name]
            self._floor[name] = floors[name]
            self._firing[name] = replace(schedule, since_ms=min(schedule.since_ms, now))

    def fire_due(self, now: int | None = None) -> list[Firing]:
        """Send the newest due tick of every schedule whose tick is due; how each was decided.

        One pipelined round trip per queue. Raises the error when Redis does
        not answer or refuses for a while (`transient`): nothing is lost, the
        ticks stay due. Without `now` the time is Redis's, and each call
        carries a deadline: if it runs later than `call_timeout_ms` after it
        was sent, or once the schedule's next tick is due (it waited in a
        frozen Redis or a stalled network), it decides nothing, and the
        newest tick is sent instead. A given `now` (a test's clock) sends no
        deadline.
        """
        deadline = 0
        if now is None:
            now = self.now()
            deadline = now + self.call_timeout_ms
        due_names = [name for name in self.schedules if self._due_at.get(name, 0) <= now]
        if new := [name for name in due_names if name not in self._firing]:
            self._look_at_new(new, now)
        by_queue: dict[str, list[tuple[Schedule, int]]] = {}
        firings = []
        for name in due_names:
            schedule = self._firing[name]
            try:
                tick = schedule.tick_at_or_before(now)
            except Exception:  # a cron expression the library cannot step back through: not a loop of errors
                logger.exception("schedule %s: cannot work out its ticks; looked at again on the next reading", name)
                self._due_at[name] = now + self.reload_interval_ms
                continue
            by_queue.setdefault(schedule.queue, []).append((schedule, tick))
        for queue, due in by_queue.items():
            if self._aborted.is_set():
                break
            sent, replies, refused = send_ticks(
                self.scripts, QueueKeys(queue, self.prefix), [(schedule, tick, self._floor[schedule.name])
                                                              for schedule, tick in due],
                now, deadline, self.max_payload_bytes)
            for schedule in refused:  # data too large for the queue: nothing to retry until it changes
                self._due_at[schedule.name] = schedule.tick_after(now)
            answered = self.now() if deadline else now  # lateness as of the answer, not of the round's start
            unreachable = None
            for (schedule, tick), reply in zip(sent, replies):
                if isinstance(reply, Exception) and transient(reply):
                    unreachable = reply  # the tick stays due: sent again once Redis answers
                    continue
                if isinstance(reply, Exception):  # e.g. a record key of another type: this tick is lost, logged
                    logger.error("schedule %s: tick %s failed: %s", schedule.name, tick, reply)
                elif reply[0] in UNDECIDED:
                    # It ran too late (a newer tick is due by now), or our clock jumped away from
                    # Redis's: the clock is measured again, and the schedule looked at again at once.
                    logger.warning("schedule %s: tick %s was %s; looked at again", schedule.name, tick, reply[0])
                    self._offset_ms = None
                    self._due_at[schedule.name] = 0
                    continue
                else:
                    firings.append(_firing(schedule, tick, answered, reply))
                self._due_at[schedule.name] = schedule.tick_after(now)
            if unreachable is not None:
                raise unreachable
        return firings

    def next_wake_ms(self) -> int:
        """When the loop next has something to do: a due tick, or reading the schedules again."""
        return min(min(self._due_at.values(), default=self._reload_at), self._reload_at)

    def _reading_due(self) -> bool:
        """Whether to ask for a reading now: it is due, or nearly (then it follows the round just made).

        A reading runs on a thread of its own, but its CPU would slow a round
        of calls beside it: one due within a tenth of an interval after a
        round is asked right away, so readings stay one interval apart at most.
        """
        return self.now() >= self._reload_at - self.reload_interval_ms // 10

    def run(self, on_firing: Callable[[Firing], None] | None = None) -> None:
        """Fire due ticks until stopped, reading the schedules every reload interval and riding out outages."""
        report = on_firing or (lambda firing: logger.info("%s", firing.summary()))
        reader = _Reader(self.load, self._wake, self.close_reader)
        try:
            self._run(report, reader)
        finally:
            reader.stop()

    def _run(self, report: Callable[[Firing], None], reader: _Reader) -> None:
        outage_since: float | None = None
        interval_s = self.reload_interval_ms / 1000
        # By when the loop should be back at its top (monotonic): much later means it stood still,
        # and the schedules are read again before the next round (once Redis answers, if it does not).
        back_by = time.monotonic()
        stood_still = False
        while not self._stopping.is_set():
            self._wake.clear()
            stood_still = stood_still or time.monotonic() - back_by > interval_s
            back_by = time.monotonic()
            try:
                if stood_still:
                    self._read_after_a_freeze(reader)
                    stood_still = False
                for firing in self.fire_due():
                    report(firing)
                if (loaded := reader.take()) is not None:
                    self._apply(loaded)
                    continue  # a new or changed schedule is due now
                if self._reading_due() and not reader.busy:
                    self.measure_clock()
                    self._reload_at = self.now() + self.reload_interval_ms
                    reader.ask()  # the ticks go on while the reading runs; its result is taken when it ends
            except Exception as error:
                if not transient(error):
                    raise
                self._offset_ms = None  # measured again once Redis answers
                if outage_since is None:
                    outage_since = time.monotonic()
                    logger.error("Redis unreachable (%s); the scheduler keeps retrying", error)
                pause_s = min(5.0, 0.2 + (time.monotonic() - outage_since) / 4)
                back_by = time.monotonic() + pause_s  # a freeze during the pause counts too
                self._stopping.wait(pause_s)
                back_by = min(back_by, time.monotonic())
                continue
            if outage_since is not None:
                logger.warning("Redis is back after %.0f s; firing again", time.monotonic() - outage_since)
                outage_since = None
            if time.monotonic() - back_by > interval_s:
                continue  # the round stood still (frozen while it ran): read again before the next
            wait_s = max(0.0, (self.next_wake_ms() - self.now()) / 1000)
            back_by = time.monotonic() + wait_s
            if self._stopping.is_set():
                break  # a stop since the loop's top: the clear there may have wiped its wake-up
            self._wake.wait(wait_s)
            back_by = min(back_by, time.monotonic())  # woken early (a reading ended, a stop)

    def _read_after_a_freeze(self, reader: _Reader) -> None:
        """Read the schedules before firing again: this beat stood still for over an interval.

        A beat that was frozen (SIGSTOP, a suspended VM) holds schedules read
        before: one disabled, or moved to another queue, meanwhile must not
        fire from them. The reading waits at most an interval (a database that
        does not answer then leaves the known schedules, as any failed reading).
        """
        logger.warning("scheduler: stood still for over %s s; reading the schedules before firing",
                       seconds_text(self.reload_interval_ms))
        deadline = time.monotonic() + self.reload_interval_ms / 1000

        def reading_ended() -> bool:
            while reader.busy and time.monotonic() < deadline and not self._stopping.is_set():
                self._wake.wait(0.05)
                self._wake.clear()
            return not reader.busy

        # A reading begun before the freeze may hold what was read then: its result goes, and one more is made.
        if not reading_ended():
            return
        reader.take()
        reader.ask()
        self._reload_at = self.now() + self.reload_interval_ms
        if reading_ended() and (loaded := reader.take()) is not None:
            self._apply(loaded)

    def stop(self) -> None:
        """First call: finish the round of calls in progress, then return. A second call aborts.

        Thread-safe, not signal-safe: from a signal, use run_until_signalled (signals.py).
        """
        if self._stages.stop():
            self.abort()
            return
        logger.info("scheduler: stopping after the round of calls in progress (stop again to leave now)")
        self._wake.set()

    def abort(self) -> None:
        """Return now; a tick whose call is in flight is decided once, by that call or another scheduler's."""
        if self._stages.abort():
            logger.warning("scheduler: leaving now")
        self._wake.set()


class _Reader:
    """Reads the schedules on a daemon thread, one reading at a time, for Beat.run.

    A reading that fails keeps the schedules known (a database that is down, a
    bug in a loader): firing what is known beats firing nothing.
    """

    def __init__(self, load: Callable[[], Iterable[Schedule]], done: threading.Event,
                 close: Callable[[], None] | None) -> None:
        self._load, self._done, self._close = load, done, close
        self._asked = threading.Event()
        self._lock = threading.Lock()
        self._result: list[Schedule] | None = None
        self._stopped = False
        self.busy = False
        threading.Thread(target=self._serve, name="echomq-beat-reader", daemon=True).start()

    def ask(self) -> None:
        self.busy = True
        self._asked.set()

    def take(self) -> list[Schedule] | None:
        """The schedules of the latest reading that ended since the last take, else None."""
        with self._lock:
            result, self._result = self._result, None
        return result

    def stop(self) -> None:
        self._stopped = True
        self._asked.set()

    def _serve(self) -> None:
        try:
            while True:
                self._asked.wait()
                self._asked.clear()
                if self._stopped:
                    return
                try:
                    found: list[Schedule] | None = list(self._load())
                except Exception:
                    logger.exception("could not read the schedules; keeping those known")
                    found = None
                with self._lock:
                    self._result = found
                self.busy = False
                self._done.set()
        finally:
            if self._close is not None:
                self._close()



def send_ticks(scripts: Scripts, keys: QueueKeys, due: list[tuple[Schedule, int, int]], now: int, deadline: int,
               max_payload_bytes: int) -> tuple[list[tuple[Schedule, int]], list[Any], list[Schedule]]:
    """Send the due ticks (schedule, tick, floor) of one queue in one round trip (see Beat.fire_due).

    The ticks sent, their replies, and the schedules whose job cannot be sent
    (logged). With tracing on, the round trip is a send span, whose context the jobs it fires carry.
    """
    sent: list[tuple[Schedule, int]] = []
    replies: list[Any] = []
    refused: list[Schedule] = []

    def fire(trace: str) -> list[str]:
        calls = []
        for schedule, tick, floor in due:
            try:
                # Once the next tick is due this call is stale: that tick is sent instead (coalesced).
                call_deadline = min(deadline, schedule.tick_after(tick)) if deadline else 0
                calls.append(fire_call(keys, schedule, now, tick, max_payload_bytes=max_payload_bytes,
                                       deadline=call_deadline, floor=floor, trace=trace))
                sent.append((schedule, tick))
            except PayloadError as error:
                logger.error("schedule %s: cannot add its job: %s", schedule.name, error)
                refused.append(schedule)
        replies.extend(scripts.run_batch(calls))
        return [str(reply[1]) for reply in replies  # the jobs this call added (decided, fired)
                if not isinstance(reply, Exception) and reply[0] == "fired" and str(reply[2]) == "1"]

    send_traced(keys.queue, fire, len(due))
    return sent, replies, refused


def fire_call(keys: QueueKeys, schedule: Schedule, now: int, tick: int | None, job_id: str = "", *,
              max_payload_bytes: int = defaults.MAX_PAYLOAD_BYTES, deadline: int = 0, floor: int = 0,
              trace: str = "") -> Call:
    """The fireSchedule call for one tick, or with `tick` None for a run now under `job_id`.

    `deadline`: the latest time by Redis's clock the call may run at and
    decide (0: no limit, and no look at Redis's clock). `floor`: the newest
    tick decided on a queue the schedule moved from (see Beat). `trace`: the
    context of the send span the job carries (tracing.py). PayloadError
    when the schedule's data is not JSON or too large for the queue.
    """
    data = encode_json(schedule.data, f"data of schedule {schedule.name!r}", max_payload_bytes)
    if tick is None:
        timing: dict[str, Any] = {"tick": "", "job_id": job_id, "missed_after_ms": 0, "catch_up": 0}
    else:
        catch_up = schedule.catch_up and tick >= schedule.since_ms
        timing = {"tick": tick, "job_id": schedule.job_id(tick), "missed_after_ms": schedule.missed_after_ms(tick),
                  "catch_up": int(catch_up)}
    return ("fireSchedule-6", keys.for_script("fireSchedule-6", name=schedule.name), script_argv(
        "fireSchedule-6", prefix=keys.base, now=now, **timing, name=schedule.job_name, data=data,
        opts=with_trace(schedule.opts.encoded(), trace), priority=schedule.opts.priority,
        skip_if_running=int(schedule.skip_if_running),
        deadline=deadline, group=schedule.opts.group, floor=floor, expires_ms=schedule.opts.expires_ms))


def _firing(schedule: Schedule, tick: int | None, now: int, reply: list[Any]) -> Firing:
    outcome, job_id, decided = reply
    return Firing(schedule.name, schedule.queue, tick, str(outcome), str(job_id), bool(int(decided)),
                  now - tick if tick is not None else 0)


def run_now(scripts: Scripts, schedule: Schedule, job_id: str, *, prefix: str = defaults.PREFIX,
            max_payload_bytes: int = defaults.MAX_PAYLOAD_BYTES) -> Firing:
    """Add the schedule's job now under `job_id`, outside its ticks (the admin's "run now").

    It becomes the schedule's latest job (which SKIP_IF_RUNNING waits for).
    """
    now = now_ms()
    keys, job_id = QueueKeys(schedule.queue, prefix), validate_job_id(job_id)
    replies: list[Any] = []

    def fire(trace: str) -> list[str]:
        call = fire_call(keys, schedule, now, None, job_id, max_payload_bytes=max_payload_bytes, trace=trace)
        replies.extend(scripts.run_batch([call], raise_on_error=True))
        return [str(replies[0][1])]

    send_traced(schedule.queue, fire)
    return _firing(schedule, None, now, replies[0])


@dataclass(frozen=True)
class Record:
    """What Redis remembers of a schedule: its latest tick decided, and its latest job."""

    tick_ms: int | None = None
    outcome: str = ""
    job_id: str = ""
    fired_at_ms: int | None = None
    counts: dict[str, int] = field(default_factory=dict)  # ticks per outcome
    ran_now: bool = False  # the latest job was a run now, not a tick's


def read_records(client: Any, schedules: Iterable[Schedule], *, prefix: str = defaults.PREFIX) -> list[Record]:
    """The records of these schedules, in order, in one pipelined round trip (a broken one reads as empty)."""
    schedules = list(schedules)
    pipe = client.pipeline(transaction=False)
    for schedule in schedules:
        pipe.hgetall(QueueKeys(schedule.queue, prefix).schedule(schedule.name))
    return [_record(fields if isinstance(fields, dict) else {})
            for fields in pipe.execute(raise_on_error=False)]


def _record(fields: dict[str, str]) -> Record:
    def number(name: str) -> int | None:
        try:
            return int(fields[name])
        except (KeyError, ValueError):
            return None

    return Record(tick_ms=number("tick"), outcome=fields.get("outcome", ""), job_id=fields.get("job", ""),
                  fired_at_ms=number("firedAt"),
                  counts={outcome: number(outcome) or 0 for outcome in OUTCOMES[:3]},
                  ran_now="job" in fields and fields.get("firedTick") == "")
