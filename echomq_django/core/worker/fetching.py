"""A worker's fetch loop: the only caller of moveToActive and moveToFinished.

Each round trip (`RoundTrips`, round_trips.py) writes the results of every job that ended
since the last one and takes new jobs for the free slots, in one pipeline.
The loop (`FetchLoop`) decides when to make one and when to wait, on the
worker's one queue of events: a slot's result, or a wake-up (the marker
waiter, a stop, a freed slot). It runs on the thread of a free slot, which
then runs the first job it took (see FetchLoop.lead).
"""

from __future__ import annotations

import logging
import queue as threadqueue
import threading
from collections.abc import Callable
from typing import Any

from ..protocol.connection import socket_timeout
from ..protocol.job import Job
from ..protocol.times import now_ms
from .marker import MarkerWaiter
from .round_trips import RoundTrips
from .slots import Events, JobSlots, Outcome
from .stopping import TwoStages

logger = logging.getLogger("echomq.worker")
# How often a worker that found its queue at MAX_ACTIVE looks again (a job of its own that ends wakes it sooner).
CAP_POLL_S = 0.25


class FetchLoop:
    """Decides, turn by turn, to make a round trip, to wait for what comes next, or to end.

    There is no thread of its own: the loop runs on the thread of a free
    slot, which holds the turn to lead (JobSlots.pass_lead), until a round
    trip takes jobs. The first is that thread's to run, the others go to the
    other free slots, and the turn to the next free slot, behind them. At
    concurrency 1 the one slot's thread thus writes a result, takes the next
    job and runs it with no hand-off to another thread. Held back by flow
    control, the loop sleeps as long as the script says, without calling
    Redis. `on_end` is called once the loop is done (stopped and nothing
    left to write, max_jobs, burst, or an abort).
    """

    def __init__(self, client: Any, trips: RoundTrips, *, slots: JobSlots, marker: MarkerWaiter, events: Events,
                 stages: TwoStages, block_timeout_s: float, on_end: Callable[[], None]) -> None:
        self.client, self.trips, self.slots, self.marker, self.events = client, trips, slots, marker, events
        self.stages, self.block_timeout_s, self.on_end = stages, block_timeout_s, on_end
        self._turn_lock = threading.Lock()  # held by the slot that leads (or by conclude)
        self._burst = False
        self._max_jobs: int | None = None
        self._fetched = 0
        self._results: list[Outcome] = []  # jobs whose results are still to be written
        self._next_due: int | None = None
        # The last fetch took fewer jobs than it asked for (none were left ready), and no signal came since:
        # the next fetch waits for one first (every script that makes a job ready sets the marker, so one
        # made ready meanwhile ends the wait at once). A wake-up from the marker waiter clears it.
        self._drained = False
        self._mine: Job | None = None  # the job the last round trip took for the leading slot
        self._ended = False

    def begin(self, burst: bool, max_jobs: int | None) -> None:
        """Set the loop's bounds, before the turn to lead is first passed."""
        self._burst, self._max_jobs = burst, max_jobs

    def lead(self) -> Job | None:
        """Run the loop on this slot's thread until it takes a job for it (returned) or ends (None)."""
        with self._turn_lock:
            while not self._ended:
                if self.stages.aborted.is_set() or not self._turn():
                    self._end()
                elif self._mine is not None:
                    mine, self._mine = self._mine, None
                    self.slots.pass_lead()  # behind the other jobs taken: the next free slot leads
                    return mine
            return None

    def conclude(self) -> None:
        """End the loop after an abort, once no slot leads it (it sees the abort at its next turn)."""
        with self._turn_lock:
            if not self._ended:
                self._end()

    def _end(self) -> None:
        if self._results and self.stages.aborted.is_set() and not self.trips.unreachable:
            # A second stop: still write what already ended, once, rather than rerun it; not when the
            # last round trip failed, as the write would wait out the outage ("a second stop leaves now").
            self.trips.exchange(self._results, 0)
        self._ended = True
        self.on_end()

    def _turn(self) -> bool:
        """One turn: a round trip, or a wait for what comes next; False when the loop is done."""
        trips, results, burst = self.trips, self._results, self._burst
        want = free = 0
        if not self.stages.stopping.is_set():
            # Writing the ended jobs' results frees their slots in the same round trip.
            free = self.slots.count - trips.running + len(results)
            want = free if self._max_jobs is None else min(free, self._max_jobs - self._fetched)
        if not want and not trips.running and not results and not trips.unanswered_token:
            return False  # stopping, or max_jobs reached, and nothing left to write
        # Not the jobs left to take (max_jobs) but the free slots are what a thread past its limit
        # holds: its end wakes the loop (see Worker._abandoned_changed).
        want = max(min(want, free - self.slots.abandoned.count), 0)
        wrote = bool(results)
        got = 0
        drained = self._drained
        if (want and not drained) or results or trips.unanswered_token:
            # Results written when nothing was left ready and nothing else runs: no fetch with them (it would
            # find nothing); the loop waits for a signal next, and fetches in the same round trip. Not in a
            # burst, which ends when a fetch finds nothing (a retry these results make ready must be taken).
            alone = drained and not burst and trips.running <= len(results)
            got = self._exchange(0 if alone else want)  # (alone, it fetches nothing: `_drained` stands)
        if got or wrote or self._collect(wait_s=None):
            return True  # slots may have freed, more may be ready: go round again
        if want and trips.held_back_ms:
            # Flow control held jobs back: wait as long as the script said (a cap: a while), not
            # on the marker, which every add sets; a job of this worker that ends wakes it sooner.
            self._collect(wait_s=trips.held_back_ms / 1000 if trips.held_back_ms > 0 else CAP_POLL_S)
            return True
        if burst and (want or free) and not trips.running and not trips.unanswered_token:
            # Nothing is ready and nothing is running (nor a fetch whose reply is owed); or every free
            # slot is held by a thread past its limit, which may never end: burst leaves it behind.
            return False
        if want and not burst and not trips.running and not trips.unanswered_token \
                and trips.scripts.waits_then_runs and (self._next_due is None or self._next_due > now_ms()):
            # Nothing runs, so nothing can end meanwhile: the loop itself waits for work and
            # takes it in the same round trip (one wake-up for the worker, not two), ending the
            # marker thread's wait if one is left from while jobs ran (a signal it took meanwhile
            # it puts back, as the loop is not idle on it).
            self.marker.idle.clear()
            self._exchange(want, wait_s=self._wait_s())
            return True
        if want and not burst:
            wait_s = self._wait_s()
            self.marker.arm(wait_s)
            if self._next_due is not None:
                # A delayed job is due by then: the loop wakes itself for it. The marker's wait may be a longer
                # one, armed while jobs ran, which on a cluster the loop cannot end (CLIENT UNBLOCK reaches one
                # node): its new timeout counts only from its next wait.
                if not self._collect(wait_s=wait_s):
                    self._drained = False
                return True
        self._collect(wait_s=self.block_timeout_s + 1)
        return True

    def _exchange(self, want: int, wait_s: float | None = None) -> int:
        """A round trip; the jobs it took go to the slots, the first kept for this one. How many it took."""
        trips = self.trips
        fetches = bool(want or trips.unanswered_token)  # else only results go: the due time and `_drained` stand
        jobs, next_due = trips.exchange(self._results, want, wait_s, unblock=self.marker.blocking)
        if fetches:
            self._next_due = next_due
            self._drained = want > 0 and (len(jobs) < want or not trips.left_ready) and not trips.held_back_ms
        self._fetched += len(jobs)
        if jobs:
            self.marker.idle.clear()
            self._mine = jobs[0]
            self.slots.take(jobs[0])  # in hand from now on, as the others, until this thread runs it
            for job in jobs[1:]:
                self.slots.start(job)
        return len(jobs)

    def _collect(self, wait_s: float | None) -> bool:
        """Move ended jobs from the slots into the results to write, waiting up to `wait_s` for the first.

        Returns whether anything arrived (a wake-up from the marker or a stop counts).
        """
        try:
            event = self.events.get_nowait() if wait_s is None else self.events.get(timeout=wait_s)
        except threadqueue.Empty:
            return False
        while True:
            if event is None:
                self._drained = False  # a signal (or a stop, or a freed slot): fetch again
            else:
                self._results.append(event)
            try:
                event = self.events.get_nowait()
            except threadqueue.Empty:
                return True

    def _wait_s(self) -> float:
        """How long to wait for work: the block timeout, or until the next delayed job is due if sooner.

        Never as long as the client's socket timeout, which would end the
        wait with a TimeoutError (and retries) instead of an empty reply
        (redis-py's own default socket timeout is 5 s).
        """
        timeout = self.block_timeout_s
        if self._next_due is not None:
            timeout = min(timeout, max((self._next_due - now_ms()) / 1000, 0.001))
        return min(timeout, max((socket_timeout(self.client) or 5.0) - 1, 0.1))


