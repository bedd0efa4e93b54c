"""The scheduler: the Beat loop that fires each schedule's due ticks, each tick once, however many run.

Which tick is due is the schedule's arithmetic (ticks.py); each tick is one
fireSchedule call, which decides in Redis whether it becomes a job
(records.py); the time is Redis's (clock.py), and the schedules are read on a
thread of their own (reader.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from .. import defaults
from ..protocol.connection import require_text_replies
from ..protocol.keys import QueueKeys
from ..protocol.scripts import Scripts
from ..protocol.times import now_ms, seconds_text
from ..worker.stopping import TwoStages
from .clock import RedisClock
from .reader import ScheduleReader
from .records import UNDECIDED, Firing, firing_from, read_floors, send_ticks, transient
from .ticks import Schedule

logger = logging.getLogger("echomq.beat")


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
        self._redis_clock = RedisClock(client, clock)
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
        return self._redis_clock.now()

    def measure_clock(self) -> None:
        """Measure how far Redis's clock is from ours (one TIME call)."""
        self._redis_clock.measure()

    def _look_at_new(self, names: list[str], now: int) -> None:
        """Ready schedules new to this beat (or changed) for firing: their since, and their floor.

        The floor is the newest tick decided on another queue (records.read_floors).
        """
        floors = read_floors(self.client, {name: sorted((self.queues | self._seen_on[name])
                                                        - {self.schedules[name].queue}) for name in names},
                             now, prefix=self.prefix)
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
                    self._redis_clock.forget()
                    self._due_at[schedule.name] = 0
                    continue
                else:
                    firings.append(firing_from(schedule, tick, answered, reply))
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
        reader = ScheduleReader(self.load, self._wake, self.close_reader)
        try:
            self._run(report, reader)
        finally:
            reader.stop()

    def _run(self, report: Callable[[Firing], None], reader: ScheduleReader) -> None:
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
                self._redis_clock.forget()  # measured again once Redis answers
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

    def _read_after_a_freeze(self, reader: ScheduleReader) -> None:
        """Read the schedules before firing again: this beat stood still for over an interval.

        A beat that was frozen (SIGSTOP, a suspended VM) holds schedules read
        before: one disabled, or moved to another queue, meanwhile must not
        fire from them. The reading waits at most an interval (a database that
        does not answer then leaves the known schedules, as any failed reading).
        """
        logger.warning("scheduler: stood still for over %s s; reading the schedules before firing",
                       seconds_text(self.reload_interval_ms))
        deadline = time.monotonic() + self.reload_interval_ms / 1000
        # A reading begun before the freeze may hold what was read then: its result goes, and one more is made.
        if not reader.wait_ended(deadline, self._stopping):
            return
        reader.take()
        reader.ask()
        self._reload_at = self.now() + self.reload_interval_ms
        if reader.wait_ended(deadline, self._stopping) and (loaded := reader.take()) is not None:
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
