"""A worker's fetch loop: the only caller of moveToActive and moveToFinished.

Each round trip (`RoundTrips`) writes the results of every job that ended
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
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from ..errors import JobNotFoundError, LockLostError, QueueStateError
from ..producing.handoff import deliver_handoffs, hands_off
from ..producing.workflow import read_inputs
from ..protocol.connection import UNREACHABLE, socket_timeout
from ..protocol.job import Job, JobOptions, Reporter
from ..protocol.keys import QueueKeys
from ..protocol.scripts import Confirm, Finish, RateLimit, Scripts, Wait
from ..protocol.times import now_ms
from .locks import RETRY_PAUSE_S, LockRenewer
from .marker import MarkerWaiter
from .pool import class_path
from .slots import Events, JobSlots, Outcome
from .stopping import TwoStages

logger = logging.getLogger("echomq.worker")
# How often a worker that found its queue at MAX_ACTIVE looks again (a job of its own that ends wakes it sooner).
CAP_POLL_S = 0.25

# moveToFinished's status codes for a failed attempt, in words.
_FAILURE_OUTCOMES = {2: "for good", 3: "retrying now", 4: "retrying after its backoff"}


@dataclass(frozen=True)
class FetchOptions:
    """What each fetch asks of moveToActive and each finish of moveToFinished (the worker's options)."""

    lock_duration_ms: int
    default_attempts: int
    keep_completed: tuple[int, int]  # (count, age_ms): see Retention (worker.py)
    keep_failed: tuple[int, int]
    metrics_minutes: int
    confirm: Confirm | None
    rate_limit: RateLimit | None
    max_active: int
    group_max_active: int


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


class RoundTrips:
    """The loop's round trips to Redis, and what they leave to remember across one another.

    `running` counts the jobs taken and not yet written back, `processed`
    the results written, `failed` those of them that were failures. Through a Redis outage a fetch whose reply never
    came is sent again (`unanswered_token`); `held_back_ms` is the last
    fetch's flow control (0; ms until its rate limit or pause lets a job
    start; -1 capped).
    """

    def __init__(self, scripts: Scripts, keys: QueueKeys, worker_id: str, options: FetchOptions, *,
                 locks: LockRenewer, stages: TwoStages, reporter: Reporter) -> None:
        self.scripts, self.keys, self.worker_id, self.options = scripts, keys, worker_id, options
        self.locks, self.stages, self.reporter = locks, stages, reporter
        self.running = 0
        self.processed = 0
        self.failed = 0
        self.wait = Wait()  # an idle loop's wait for work, which stop() cuts short
        # The token of a fetch whose reply never came: sent again with the next
        # fetch, so the script answers with the jobs it took (see moveToActive).
        self.unanswered_token: str | None = None
        self.unreachable = False  # the last round trip failed to reach Redis
        self.held_back_ms = 0
        self.left_ready = True  # the last fetch may have left jobs ready (False: it took all there were)
        # What fetches found broken in the queue's flow-control keys, reported once each (a fetch says it again).
        self._reported_broken: set[str] = set()

    def exchange(self, ended: list[Outcome], want: int, wait_s: float | None = None, *,
                 unblock: int | None = None) -> tuple[list[Job], int | None]:
        """One round trip: write the results in `ended` and take up to `want` jobs.

        With `wait_s`, the fetch waits up to that long for a producer's signal
        first, in the same round trip (it then runs on Redis's clock).

        Returns (the jobs taken, next delayed due time); `unblock` is the
        marker waiter's connection, whose wait a wait of the loop's ends. Through a Redis outage the
        results stay in `ended` to be sent again (a finish sent twice is
        answered "already done"), and an unanswered fetch's token is sent
        again, however long the outage: a lapsed lock does not make a job the
        sweeper's (its hold waits for the owner after an outage), and a result
        dropped then would have the job run again.
        """
        writing = [outcome for outcome in ended if outcome.finish]
        # The lock token of this fetch: the unanswered one first, whatever `want` is now.
        token = self.unanswered_token or (f"{self.worker_id}:{uuid.uuid4().hex}" if want else "")
        calls = self._calls(writing, token, want, wait_s is not None)
        sent = time.monotonic()
        try:
            replies = self._send(calls, wait_s, len(writing), unblock)
        except UNREACHABLE as error:
            self.unanswered_token = token or None
            if wait_s is not None and self.wait.cut_short:
                return [], None  # a stop ended the wait: the token is sent again, taking nothing new
            if self.stages.stopping.is_set() and token:
                # Stopped, and Redis cannot say whether the unanswered fetch took jobs: whatever it took
                # never ran here, so it is left to the sweeper rather than waited for through an outage.
                # The results in `ended` are not given up: they stay to be written (a second stop leaves).
                logger.warning("worker %s: Redis unreachable (%s) while it stops; a job its last fetch may "
                               "have taken is left to the sweeper", self.worker_id, error)
                self.unanswered_token = None
                self.unreachable = True
                return [], None
            logger.error("worker %s: Redis unreachable (%s); retrying", self.worker_id, error)
            self.unreachable = True
            self.stages.aborted.wait(RETRY_PAUSE_S)
            return [], None
        if self.unreachable:
            self.unreachable = False
            self.locks.renew_soon()  # back after an outage: renew every held lock now
        self.unanswered_token = None
        codes = replies.pop(0) if writing else []
        if isinstance(codes, Exception):
            codes = [codes] * len(writing)
        for outcome, code in zip(writing, codes):
            self._written(outcome, code)
        for outcome in ended:
            if not outcome.finish:
                self._written(outcome, None)
        ended.clear()
        if hands_off(((outcome.job.next_steps, code == 2) for outcome, code in zip(writing, codes)
                      if code in (1, 2)), self.keys):
            self._hand_off()
        self.held_back_ms, self.left_ready = 0, True
        if not token:
            return [], None
        [reply] = replies
        return self._take(reply, token, sent, ended)

    def _calls(self, writing: list[Outcome], token: str, want: int, waits: bool) -> list[Any]:
        """The round trip's script calls: the finish of `writing`, then the fetch of `token` (if any)."""
        calls = []
        if writing:
            options = self.options
            calls.append(self.scripts.finish_call(
                self.keys, [outcome.finish for outcome in writing if outcome.finish], now_ms(),
                default_attempts=options.default_attempts,
                keep_completed=options.keep_completed, keep_failed=options.keep_failed,
                metrics_minutes=options.metrics_minutes))
        if token:
            calls.append(self.scripts.fetch_call(
                self.keys, token, self.options.lock_duration_ms, None if waits else now_ms(), want, self.worker_id,
                self.options.metrics_minutes, rate_limit=self.options.rate_limit,
                max_active=self.options.max_active, group_max_active=self.options.group_max_active))
        return calls

    def _send(self, calls: list[Any], wait_s: float | None, writes: int, unblock: int | None) -> list[Any]:
        """Send the calls (after a wait for work, with `wait_s`) and confirm them; their replies."""
        confirm = self.options.confirm
        if wait_s is not None:
            waited = self.scripts.wait_then_run(self.keys.marker, wait_s, calls, confirm, self.wait,
                                                unblock=unblock)
            assert waited is not None  # the loop waits so only where the client can (waits_then_runs)
            woken, replies, acked = waited
            if isinstance(woken, ResponseError):  # the marker's key holds another type; UNBLOCKED by a failover
                logger.error("worker %s: waiting for work failed (%s)", self.worker_id, woken)
                self.stages.aborted.wait(1.0)
        else:
            replies, acked = self.scripts.run_confirmed(calls, confirm)
        if confirm and writes and acked < confirm.replicas:
            logger.warning("worker %s: %d of %d replicas confirmed the results of %d job(s) within %d ms",
                           self.worker_id, acked, confirm.replicas, writes, confirm.timeout_ms)
        return list(replies)

    def _take(self, reply: Any, token: str, sent: float, ended: list[Outcome]) -> tuple[list[Job], int | None]:
        """The jobs a fetch took, their locks held (one that cannot run ends in `ended`); the next due time."""
        if isinstance(reply, Exception):  # e.g. a queue key of the wrong type: say so, keep trying
            logger.error("worker %s: fetching from queue %s failed: %s", self.worker_id, self.keys.queue, reply)
            self.stages.aborted.wait(1.0)
            return [], None
        next_due, self.held_back_ms, jobs = self.scripts.fetched(reply)
        self.left_ready = self.scripts.left_ready(reply)
        for broken in self.scripts.broken_keys(reply):
            if broken not in self._reported_broken:
                self._reported_broken.add(broken)
                logger.error("worker %s: queue %s: %s", self.worker_id, self.keys.queue, broken)
        # Redis took the jobs somewhen during the round trip (at its end, after a wait): a round trip
        # within half a lock leaves them half a lock at least, a longer one (the worker was frozen
        # meanwhile, say) maybe none.
        took_s = time.monotonic() - sent
        if jobs and took_s > self.options.lock_duration_ms / 2000:
            jobs = self._still_ours(jobs, token, took_s)
        taken = []
        for job_id, flat in jobs:
            self.running += 1
            self.locks.hold(job_id, token)
            try:
                job = Job.from_flat(self.keys.queue, job_id, flat, strict=True)  # job.token: this fetch's
                if job.inputs_mode:
                    job.workflow_args = read_inputs(self.scripts.client, self.keys, job, job.inputs_mode)
            except UNREACHABLE as error:  # its inputs could not be read: this attempt fails, to be retried
                ended.append(self._unrunnable(job_id, token, error, final=False))
                continue
            except Exception as error:  # a hash no producer of ours wrote: it fails alone
                ended.append(self._unrunnable(job_id, token, error))
                continue
            job.attach(self.reporter)
            taken.append(job)
        return taken, next_due

    def _hand_off(self) -> None:
        """Deliver the ends of this queue's workflow members bound for other queues (core/producing/workflow.py)."""
        try:
            deliver_handoffs(self.scripts, self.keys, now_ms())
        except (*UNREACHABLE, ResponseError) as error:  # they wait in the list, for the sweep or the next finish
            logger.warning("worker %s: could not hand workflow results of queue %s on (%s); the sweep will",
                           self.worker_id, self.keys.queue, error)

    def _still_ours(self, jobs: list[tuple[str, list[str]]], token: str, took_s: float) -> list[tuple[str, list[str]]]:
        """The jobs of a fetch whose round trip took `took_s` that are still this fetch's, their locks renewed.

        Redis may have run the fetch long before the worker read the reply:
        an idle worker's wait carries its fetch, which Redis runs when a job
        comes, frozen worker or not (SIGSTOP, a paused container), and any
        round trip can stall. Meanwhile the locks may have lapsed and the
        sweeper recovered the jobs, which then run elsewhere; those must not
        start here too. A job not renewed (or not known to be) is not
        started, and its lock lapses, as any dead worker's.
        """
        try:
            codes = self.scripts.lock_codes(self.keys, [(job_id, token) for job_id, _ in jobs],
                                            self.options.lock_duration_ms)
        except (*UNREACHABLE, ResponseError) as error:
            logger.error("worker %s: could not check the locks of %d job(s) fetched up to %.1f s ago (%s); not "
                         "starting them", self.worker_id, len(jobs), took_s, error)
            return []
        for (job_id, _), code in zip(jobs, codes):
            if code not in (1, 2):  # 2: ours, and cancelled meanwhile (the renewals stop it)
                logger.warning("worker %s: job %s of queue %s was fetched up to %.1f s before this worker read it "
                               "(was it frozen?) and is no longer its own; not starting it", self.worker_id, job_id,
                               self.keys.queue, took_s)
        return [job for job, code in zip(jobs, codes) if code in (1, 2)]

    def _unrunnable(self, job_id: str, token: str, error: Exception, *, final: bool = True) -> Outcome:
        """The end of an attempt that cannot start: the job's hash cannot be decoded into a job, or
        (not `final`) its workflow inputs could not be read."""
        job = Job(self.keys.queue, job_id, name="", data=None, opts=JobOptions(), token=token)
        logger.error("worker %s: job %s of queue %s cannot run: %s", self.worker_id, job_id, self.keys.queue, error)
        finish = Finish(job_id, token, completed=False, value=f"cannot run the job: {error}", final=final,
                        error_class=class_path(error))
        return Outcome(job, finish)

    def _written(self, outcome: Outcome, code: Any) -> None:
        """Account for one job whose result was just written (or could not be)."""
        job, finish = outcome.job, outcome.finish
        self.running -= 1
        self.locks.release(job.id, job.token or "")
        if finish is None:
            return
        try:
            if isinstance(code, Exception):
                raise code
            status = self.scripts.finished(code, self.keys, job.id)
        except LockLostError as lost:
            logger.warning("worker %s: %s", self.worker_id, lost)
            return
        except JobNotFoundError as gone:
            logger.warning("worker %s: %s; it was removed while running", self.worker_id, gone)
            return
        except (ResponseError, QueueStateError) as error:
            logger.error("worker %s: could not finish job %s (%s); the sweeper will recover it",
                         self.worker_id, job.id, error)
            return
        self.processed += 1
        if status == 6:
            logger.info("job %s of queue %s was rate limited: back in the queue, its fetching paused for %g s",
                        job.id, self.keys.queue, finish.backoff_ms / 1000)
        elif not finish.completed:
            self.failed += 1
            logger.info("job %s of queue %s failed, %s: %s", job.id, self.keys.queue,
                        _FAILURE_OUTCOMES.get(status, "failed"), finish.value)
