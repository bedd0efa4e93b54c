"""The consumer side: fetch jobs, run them (on threads or child processes), keep their locks, finish them."""

from __future__ import annotations

import logging
import os
import pickle
import queue as threadqueue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from . import defaults
from .connection import UNREACHABLE, socket_timeout
from .errors import InvalidNameError, JobCancelled, JobNotFoundError, LockLostError, QueueStateError
from .job import Job, JobOptions
from .keys import QueueKeys, validate_stored_id
from .locks import RETRY_PAUSE_S, LockRenewer
from .marker import MarkerWaiter
from .pool import POOLS, AbandonedThreads, ChildStartError, Handler, ProcessSlot, ThreadSlot, class_path
from .queue import now_ms
from .scripts import Confirm, Finish, RateLimit, Scripts, Wait
from .stopping import TwoStages

logger = logging.getLogger("echomq.worker")
# How often a worker that found its queue at MAX_ACTIVE looks again (a job of its own that ends wakes it sooner).
CAP_POLL_S = 0.25

# How often run() at concurrency 1, which waits while its loop runs beside it, lets a Ctrl-C in.
SIGNAL_CHECK_S = 0.5

# moveToFinished's status codes for a failed attempt, in words.
_FAILURE_OUTCOMES = {2: "for good", 3: "retrying now", 4: "retrying after its backoff"}


@dataclass
class _Outcome:
    """A job thread's result, waiting to be written (`finish` None: there is nothing to write)."""

    job: Job
    finish: Finish | None


@dataclass(frozen=True)
class _Reporter:
    """A running job's writes of its own progress and log, each for its attempt's token only.

    A report is not the job's result: when Redis is out of reach (past the
    client's retries) or refuses the write, it is dropped with a warning and
    the job goes on, as the worker itself rides out the outage.
    """

    scripts: Scripts
    keys: QueueKeys
    max_log_lines: int

    def progress(self, job: Job, progress_json: str) -> bool:
        return self._written(job, "progress", lambda: self.scripts.update_progress(
            self.keys, job.id, job.token or "", progress_json) == 1)

    def log(self, job: Job, line: str) -> bool:
        return self._written(job, "log line", lambda: self.scripts.add_log(
            self.keys, job.id, job.token or "", line, self.max_log_lines) > 0)

    def _written(self, job: Job, what: str, write: Callable[[], bool]) -> bool:
        try:
            return write()
        except (*UNREACHABLE, ResponseError) as error:
            logger.warning("job %s of queue %s: its %s was not recorded (%s)", job.id, self.keys.queue, what, error)
            return False


@dataclass(frozen=True)
class Retention:
    """How many finished jobs a set keeps: `count` newest (-1 = all), none older than `age_ms` (0 = any)."""

    count: int = -1
    age_ms: int = 0


def abandoned_threads(client: Any, keys: QueueKeys, now: int | None = None) -> list[tuple[str, str]]:
    """(worker id, job id) of each job thread past its hard limit that still runs and holds a slot of its worker.

    As the workers write them (Worker._show_abandoned), oldest first; those
    of a worker that stopped writing (it died) count until `now` (ms) is past them.
    """
    members = client.zrangebyscore(keys.abandoned, now_ms() if now is None else now, "+inf")
    found = []
    for member in members:
        job_id, _, token = member.partition(" ")
        try:
            validate_stored_id(job_id)
        except InvalidNameError:  # not a worker's: another client wrote it
            continue
        found.append((token.rpartition(":")[0] or token, job_id))  # a token is "<worker id>:<hex>"
    return found


class Worker:
    """Runs the jobs of one queue, `concurrency` at a time, until stopped.

    One loop does the worker's Redis work in batches: each round trip writes
    the results of every job that ended since the last one and takes new jobs
    for the free slots, in one pipeline. Each slot runs one job at a time
    (see pool.py): with `pool="threads"` on a thread of this process (at
    concurrency 1 the loop's own, which saves two thread wake-ups a job), with
    `pool="processes"` in a child process of its own, started once and reused
    (retired after `max_jobs_per_child` jobs, or once it grew past
    `max_memory_per_child_kb`). A slot only runs handlers. When
    nothing is ready, a waiting thread blocks on the queue's marker (no
    polling) and wakes the loop when a producer signals work or a delayed job
    is due. A renewal thread (LockRenewer) extends all held locks in one call
    every `renew_interval_ms` (half the lock duration by default). A job's result is
    written with the token it was fetched with, so a worker whose lock lapsed
    and whose job was recovered gets LockLostError and overwrites nothing.
    With `confirm`, each round trip ends with a WAIT for that many replicas,
    so a failover cannot undo a finish (and run the job a second time).

    Time limits are a job's own (its options) or else the worker's
    `time_limit_ms` and `soft_time_limit_ms`. Past the soft limit the job
    gets SoftTimeLimitExceeded; past the hard one its attempt fails ("time
    limit of N s exceeded") and is retried per its attempts and backoff: a
    child is killed; a thread, which cannot be, runs on and keeps its slot
    taken until it ends (AbandonedThreads; shown in keys.abandoned). A job cancelled
    while it runs (Queue.cancel) is seen at the next renewal: its child is
    killed, or its thread gets JobCancelled at its next check (Job.check).

    Flow control travels with each fetch and is decided in moveToActive, so
    it holds across every worker of the queue (which must share it):
    `rate_limit` (a RateLimit: jobs started per window), `max_active` (jobs
    running at once) and `group_max_active` (per group). Held back, the loop
    sleeps as long as the script says, without calling Redis; a job that
    raises RateLimited pauses the whole queue for its `retry_after`.

    Shutdown has two stages: the first `stop()` stops fetching and lets
    running jobs finish; a second `stop()` makes `run()` return at once, and
    the jobs still running are left to their lapsing locks and the sweeper.
    """

    def __init__(
        self, queue: str, handler: Handler, client: Any, *, prefix: str = defaults.PREFIX,
        concurrency: int = defaults.CONCURRENCY, lock_duration_ms: int = defaults.LOCK_DURATION_MS,
        renew_interval_ms: int | None = None, block_timeout_s: float = 1.0,
        default_attempts: int = defaults.ATTEMPTS,
        keep_completed: Retention = Retention(count=defaults.KEEP_COMPLETED_COUNT),
        keep_failed: Retention = Retention(),
        worker_id: str | None = None, scripts: Scripts | None = None, confirm: Confirm | None = None,
        metrics_minutes: int = defaults.METRICS_MINUTES, max_log_lines: int = defaults.MAX_LOG_LINES,
        pool: str = "threads", time_limit_ms: int = 0, soft_time_limit_ms: int = 0,
        max_jobs_per_child: int = 0, max_memory_per_child_kb: int = 0,
        child_init: Callable[[], None] | None = None, rate_limit: RateLimit | None = None, max_active: int = 0,
        group_max_active: int = 0,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        if pool not in POOLS:
            raise ValueError(f"pool must be one of {', '.join(POOLS)}, not {pool!r}")
        JobOptions(time_limit_ms=time_limit_ms, soft_time_limit_ms=soft_time_limit_ms)  # the same bounds
        if max_jobs_per_child < 0 or max_memory_per_child_kb < 0:
            raise ValueError("max_jobs_per_child and max_memory_per_child_kb must be 0 (no limit) or more")
        if max_active < 0 or group_max_active < 0:
            raise ValueError(f"max_active and group_max_active must be 0 (no cap) or more, not {max_active} "
                             f"and {group_max_active}")
        if max_log_lines < 1:
            raise ValueError(f"a job must keep at least 1 log line, not {max_log_lines}")
        renew_interval_ms = renew_interval_ms or lock_duration_ms // 2
        if not 0 < renew_interval_ms < lock_duration_ms:
            raise ValueError(
                f"lock renewal every {renew_interval_ms} ms must be shorter than the "
                f"lock duration of {lock_duration_ms} ms"
            )
        self.keys = QueueKeys(queue, prefix)
        self.handler = handler
        self.client = client
        self.scripts = scripts or Scripts(client)
        self.confirm = confirm
        self.concurrency = concurrency
        self.lock_duration_ms = lock_duration_ms
        self.renew_interval_ms = renew_interval_ms
        self.block_timeout_s = block_timeout_s
        self.default_attempts = default_attempts
        self.keep_completed = keep_completed
        self.keep_failed = keep_failed
        self.metrics_minutes = metrics_minutes
        self.rate_limit, self.max_active, self.group_max_active = rate_limit, max_active, group_max_active
        self.pool, self.time_limit_ms, self.soft_time_limit_ms = pool, time_limit_ms, soft_time_limit_ms
        self._reporter = _Reporter(self.scripts, self.keys, max_log_lines)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.processed = 0
        self._stages = TwoStages()  # what stop() and abort() set
        self._stopping, self._aborted = self._stages.stopping, self._stages.aborted
        self._done = threading.Event()
        self._broken: ChildStartError | None = None  # a child could not be started mid-run: the worker stops
        self._abandoned = AbandonedThreads(on_change=self._abandoned_changed)
        self._shown_abandoned: set[str] = set()  # the members of keys.abandoned this worker wrote last
        self._show_abandoned_lock = threading.Lock()
        try:
            self._slots: list[ThreadSlot | ProcessSlot] = [
                ProcessSlot(handler, self._reporter, child_init=child_init, max_jobs=max_jobs_per_child,
                            max_memory_kb=max_memory_per_child_kb, name=f"echomq-child-{i}", aborted=self._aborted)
                if pool == "processes" else ThreadSlot(handler, self._abandoned) for i in range(concurrency)]
        except (pickle.PicklingError, TypeError, AttributeError) as error:  # ProcessSlot pickles the handler
            raise ValueError(f"the processes pool needs a handler it can send to a child process "
                             f"(a module-level function): {error}") from None
        # The jobs fetched and not yet written back, with the slot running each (None until one takes it).
        self._in_hand: dict[tuple[str, str], tuple[Job, ThreadSlot | ProcessSlot | None]] = {}
        self._in_hand_lock = threading.Lock()
        self._locks = LockRenewer(self.scripts, self.keys, lock_duration_ms, renew_interval_ms, self.worker_id,
                                  on_stop=self._stop_attempt, beside=self._show_abandoned)
        self._running = 0  # jobs fetched and not yet written back; only the loop changes it
        # One job at a time on threads: the loop runs it on its own thread, not on a job thread, which
        # saves the two hand-offs per job between them (a thread's wake-up each); run() then runs the
        # loop on a thread beside the caller's, so that a second stop can still return at once.
        self._inline = concurrency == 1 and pool == "threads"
        self._running_inline = False  # the loop runs a job (inline only)
        # Why run() may return (inline only): "ended" (the loop, closed), or "left" (an abort left a job running).
        self._left: threadqueue.SimpleQueue[str] = threadqueue.SimpleQueue()
        self._jobs: threadqueue.SimpleQueue[Job | None] = threadqueue.SimpleQueue()
        # What wakes the loop: an _Outcome from a job thread, or None (marker, stop).
        self._events: threadqueue.SimpleQueue[_Outcome | None] = threadqueue.SimpleQueue()
        self._wait = Wait()  # an idle loop's wait for work, which stop() cuts short
        self._idle = threading.Event()  # the loop has free slots and found nothing to take (stop() clears it)
        self._marker = MarkerWaiter(self.worker_id, self.client, self.scripts, self.keys, self._events, self._idle,
                                    self._done, block_timeout_s)
        # The token of a fetch whose reply never came: sent again with the next
        # fetch, so the script answers with the jobs it took (see moveToActive).
        self._unanswered_token: str | None = None
        self._cut_token = ""  # the token of the wait a stop cut, sent again once to learn what it took
        self._unreachable = False  # the last round trip failed to reach Redis
        # The last fetch's flow control: 0, ms until its rate limit or pause lets a job start, -1 capped.
        self._held_back_ms = 0
        # What fetches found broken in the queue's flow-control keys, reported once each (a fetch says it again).
        self._reported_broken: set[str] = set()

    # -- control ---------------------------------------------------------

    def stop(self) -> None:
        """First call: finish running jobs, fetch no more. A second call aborts.

        Thread-safe, not signal-safe: from a signal, use run_until_signalled (signals.py).
        """
        if self._stages.stop():
            self.abort()
            return
        logger.info("worker %s: stopping after %d running job(s)", self.worker_id, self._running)
        self._idle.clear()
        self._wait.cut()
        self._events.put(None)

    def abort(self) -> None:
        """Make run() return now (writing what it holds if Redis answers), leaving running jobs to the sweeper."""
        if self._stages.abort():
            logger.warning("worker %s: leaving now, %d running job(s) to the sweeper", self.worker_id, self._running)
        if self._running_inline:  # (the loop raises it before it looks at _aborted: see _run_inline)
            self._left.put("left")  # run() returns now, leaving the job the loop runs
        self._wait.cut()
        self._events.put(None)

    def run(self, *, burst: bool = False, max_jobs: int | None = None) -> int:
        """Process jobs until stopped (or, in burst mode, until none is ready); returns the count.

        With the processes pool, the children start first: RuntimeError when
        one cannot, then or later (the jobs in hand are left to the sweeper: a
        worker that cannot start children must not fail job after job).
        A Ctrl-C (Python's KeyboardInterrupt) aborts, and is raised. (A script
        that wants the two stages on its signals runs the worker through
        run_until_signalled, which handles them.)
        """
        return self._run(burst, max_jobs)

    def _run(self, burst: bool, max_jobs: int | None) -> int:
        if not self._start_children():
            return 0  # stopped while they started
        threads = [threading.Thread(target=self._locks.run, name="echomq-renew", daemon=True),
                   threading.Thread(target=self._marker.run, name="echomq-marker", daemon=True)]
        if not self._inline:
            threads += [threading.Thread(target=self._job_thread, args=(slot,), name=f"echomq-job-{i}", daemon=True)
                        for i, slot in enumerate(self._slots)]
        # Whatever cuts run() short (a Ctrl-C, say, also while the threads start) is a second stop: none of
        # them may run on, the renewer would for good. After _loop_beside's own cleanup it changes nothing.
        try:
            for thread in threads:
                thread.start()
            if self._inline:
                self._loop_beside(burst, max_jobs)  # which closes the worker, whatever ends it
            else:
                self._loop(burst, max_jobs)
                self._close()
        except BaseException:
            self._abandon()
            raise
        if self._broken is not None:
            raise RuntimeError(str(self._broken))
        return self.processed

    def _loop_beside(self, burst: bool, max_jobs: int | None) -> None:
        """Run the loop, which runs the jobs too, on a thread of its own, until it ends or a second stop.

        That thread is not the caller's so that a second stop still returns
        at once while a job runs: the job is left to run out, as a job
        thread's would be, and its result to be dropped.
        """
        failed: list[BaseException] = []

        def loop() -> None:
            try:
                self._loop(burst, max_jobs)
            except BaseException as error:  # raised in the caller, as the loop's own errors are
                failed.append(error)
            finally:
                self._close()
                self._left.put("ended")

        why = ""
        try:
            # Inside the try: start() waits for the thread to run, and a Ctrl-C may land meanwhile.
            threading.Thread(target=loop, name="echomq-loop", daemon=True).start()
            why = self._wait_to_return()
        finally:
            # Unless the loop ended, it runs on: its renewals, its marker wait must end now.
            if why == "left":
                self._close()
            elif not why:  # a Ctrl-C cut the caller's wait short: a second stop of its own
                self._abandon()
        if failed:
            raise failed[0]

    def _wait_to_return(self) -> str:
        """Why run() may return (see _left), on the caller's thread, which handles its signals meanwhile.

        A loop of its own, outside the caller's try: CPython 3.13 raises a
        Ctrl-C that lands on the condition of a `while` past that loop's
        enclosing `finally` (python/cpython#130279); it does run the
        `finally` of a caller.
        """
        while True:
            try:
                # In slices: a signal (Ctrl-C) that another thread received is handled here between two.
                return self._left.get(timeout=SIGNAL_CHECK_S)
            except threadqueue.Empty:
                pass

    def _loop(self, burst: bool, max_jobs: int | None) -> None:
        fetched = 0
        ended: list[_Outcome] = []  # jobs whose results are still to be written
        next_due: int | None = None
        waited = False  # the last round trip was a wait that took nothing: the next one waits at once
        while not self._aborted.is_set():
            if self._inline:
                self._run_inline(ended)  # the job the last round trip took, if it took one
            want = free = 0
            if not self._stopping.is_set():
                # Writing the ended jobs' results frees their slots in the same round trip.
                free = self.concurrency - self._running + len(ended)
                want = free if max_jobs is None else min(free, max_jobs - fetched)
            if not want and not self._running and not ended and not self._unanswered_token:
                break  # stopping, or max_jobs reached, and nothing left to write
            # Not the jobs left to take (max_jobs) but the free slots are what a thread past its limit
            # holds: its end wakes the loop (see _abandoned_changed).
            want = max(min(want, free - self._abandoned.count), 0)
            wrote = bool(ended)
            got = 0
            if (want and not waited) or ended or self._unanswered_token:
                got, next_due = self._exchange(ended, want)
            waited = False
            fetched += got
            if got or wrote or self._collect(ended, wait_s=None):
                continue  # slots may have freed, more may be ready: go round again
            if want and self._held_back_ms:
                # Flow control held jobs back: wait as long as the script said (a cap: a while), not
                # on the marker, which every add sets; a job of this worker that ends wakes it sooner.
                held_s = self._held_back_ms / 1000 if self._held_back_ms > 0 else CAP_POLL_S
                self._collect(ended, wait_s=held_s)
                continue
            if burst and (want or free) and not self._running and not self._unanswered_token:
                # Nothing is ready and nothing is running (nor a fetch whose reply is owed); or every free
                # slot is held by a thread past its limit, which may never end: burst leaves it behind.
                break
            if want and not burst and not self._running and not self._unanswered_token \
                    and self.scripts.waits_then_runs and (next_due is None or next_due > now_ms()):
                # Nothing runs, so nothing can end meanwhile: the loop itself waits for work and
                # takes it in the same round trip (one wake-up for the worker, not two), ending the
                # marker thread's wait if one is left from while jobs ran (a signal it took meanwhile
                # it puts back, as the loop is not idle on it).
                self._idle.clear()
                got, next_due = self._exchange(ended, want, wait_s=self._wait_s(next_due))
                fetched += got
                waited = not got
                continue
            if want and not burst:
                self._arm_marker(next_due)
            self._collect(ended, wait_s=self.block_timeout_s + 1)
        if ended and not self._unreachable:
            # A second stop: still write what already ended, once, rather than rerun it; not when the
            # last round trip failed, as the write would wait out the outage ("a second stop leaves now").
            self._exchange(ended, 0)

    def _abandon(self) -> None:
        """An abort that run() makes itself, on a Ctrl-C or an error: the running jobs are left."""
        self._stages.abort()
        self._wait.cut()
        self._events.put(None)
        self._close()

    def _close(self) -> None:
        """The worker's end, once its loop ended or a second stop left it (inline: maybe both, so twice)."""
        self._stopping.set()
        self._idle.clear()
        self._done.set()
        self._locks.stop()
        if not self._aborted.is_set():  # (a second stop returns at once: they go within a lock duration)
            self._show_abandoned()  # none: the worker's slots are gone
        self._marker.release()
        # The children first, while the job threads that started some still live (a child is
        # killed when the thread that started it ends); a second stop kills those of jobs left running.
        for slot in self._slots:
            try:
                slot.close(kill=self._aborted.is_set())
            except Exception:  # the other slots must still be closed
                logger.exception("worker %s: could not stop a child process", self.worker_id)
        if not self._inline:
            for _ in range(self.concurrency):
                self._jobs.put(None)  # each job thread's last

    def _start_children(self) -> bool:
        """Start the processes pool's children; False when the worker was stopped meanwhile."""
        children = [slot for slot in self._slots if isinstance(slot, ProcessSlot)]
        try:
            for slot in children:
                slot.launch()
            for slot in children:
                slot.wait_ready(self._stopping)
        except BaseException as error:
            for slot in children:
                slot.close(kill=True)
            if isinstance(error, ChildStartError):
                if error.stopped:
                    return False
                raise RuntimeError(str(error)) from None
            raise
        return True

    # -- the loop's Redis work ---------------------------------------------

    def _exchange(self, ended: list[_Outcome], want: int, wait_s: float | None = None) -> tuple[int, int | None]:
        """One round trip: write the results in `ended` and take up to `want` jobs.

        With `wait_s`, the fetch waits up to that long for a producer's signal
        first, in the same round trip (it then runs on Redis's clock).

        Returns (jobs taken, next delayed due time). Through a Redis outage the
        results stay in `ended` to be sent again (a finish sent twice is
        answered "already done"), and an unanswered fetch's token is sent
        again, however long the outage: a lapsed lock does not make a job the
        sweeper's (its hold waits for the owner after an outage), and a result
        dropped then would have the job run again.
        """
        writing = [outcome for outcome in ended if outcome.finish]
        finishes = [outcome.finish for outcome in ended if outcome.finish]
        calls = []
        if writing:
            calls.append(self.scripts.finish_call(
                self.keys, finishes, now_ms(),
                default_attempts=self.default_attempts,
                keep_completed=(self.keep_completed.count, self.keep_completed.age_ms),
                keep_failed=(self.keep_failed.count, self.keep_failed.age_ms),
                metrics_minutes=self.metrics_minutes))
        # The lock token of this fetch: the unanswered one first, whatever `want` is now.
        token = self._unanswered_token or (f"{self.worker_id}:{uuid.uuid4().hex}" if want else "")
        if token:
            calls.append(self.scripts.fetch_call(self.keys, token, self.lock_duration_ms,
                                                 None if wait_s is not None else now_ms(), want,
                                                 self.worker_id, self.metrics_minutes, rate_limit=self.rate_limit,
                                                 max_active=self.max_active,
                                                 group_max_active=self.group_max_active))
        sent = time.monotonic()
        try:
            if wait_s is not None:
                waited = self.scripts.wait_then_run(self.keys.marker, wait_s, calls, self.confirm, self._wait,
                                                    unblock=self._marker.blocking)
                assert waited is not None  # the loop waits so only where the client can (waits_then_runs)
                woken, replies, acked = waited
                if isinstance(woken, ResponseError):  # the marker's key holds another type; UNBLOCKED by a failover
                    logger.error("worker %s: waiting for work failed (%s)", self.worker_id, woken)
                    self._aborted.wait(1.0)
            else:
                replies, acked = self.scripts.run_confirmed(calls, self.confirm)
            if self.confirm and writing and acked < self.confirm.replicas:
                logger.warning("worker %s: %d of %d replicas confirmed the results of %d job(s) within %d ms",
                               self.worker_id, acked, self.confirm.replicas, len(writing), self.confirm.timeout_ms)
        except UNREACHABLE as error:
            self._unanswered_token = token or None
            if wait_s is not None and self._wait.cut_short:
                self._cut_token = token
                return 0, None  # a stop ended the wait: the token is sent again, taking nothing new
            if self._stopping.is_set() and token == self._cut_token:
                # Stopped, and Redis cannot say whether the wait it cut took jobs: whatever it took is
                # left to the sweeper, as a second stop leaves running jobs, rather than wait on Redis.
                logger.warning("worker %s: Redis unreachable (%s) while it stops; a job its last wait may "
                               "have taken is left to the sweeper", self.worker_id, error)
                self._unanswered_token = None
                return 0, None
            logger.error("worker %s: Redis unreachable (%s); retrying", self.worker_id, error)
            self._unreachable = True
            self._aborted.wait(RETRY_PAUSE_S)
            return 0, None
        if self._unreachable:
            self._unreachable = False
            self._locks.renew_soon()  # back after an outage: renew every held lock now
        self._unanswered_token = None
        codes = replies.pop(0) if writing else []
        if isinstance(codes, Exception):
            codes = [codes] * len(writing)
        for outcome, code in zip(writing, codes):
            self._written(outcome, code)
        for outcome in ended:
            if not outcome.finish:
                self._written(outcome, None)
        ended.clear()
        self._held_back_ms = 0
        if not token:
            return 0, None
        [reply] = replies
        if isinstance(reply, Exception):  # e.g. a queue key of the wrong type: say so, keep trying
            logger.error("worker %s: fetching from queue %s failed: %s", self.worker_id, self.keys.queue, reply)
            self._aborted.wait(1.0)
            return 0, None
        next_due, self._held_back_ms, jobs = self.scripts.fetched(reply)
        for broken in self.scripts.broken_keys(reply):
            if broken not in self._reported_broken:
                self._reported_broken.add(broken)
                logger.error("worker %s: queue %s: %s", self.worker_id, self.keys.queue, broken)
        # Redis took the jobs somewhen during the round trip (at its end, after a wait): a round trip
        # within half a lock leaves them half a lock at least, a longer one (the worker was frozen
        # meanwhile, say) maybe none.
        took_s = time.monotonic() - sent
        if jobs and took_s > self.lock_duration_ms / 2000:
            jobs = self._still_ours(jobs, token, took_s)
        if jobs:
            self._idle.clear()
        for job_id, flat in jobs:
            self._running += 1
            self._locks.hold(job_id, token)
            try:
                job = Job.from_flat(self.keys.queue, job_id, flat, strict=True)  # job.token: this fetch's
            except Exception as error:  # a hash no producer of ours wrote: it fails alone
                ended.append(self._unrunnable(job_id, token, error))
                continue
            job.attach(self._reporter)
            with self._in_hand_lock:
                self._in_hand[(job.id, token)] = (job, None)
            self._jobs.put(job)
        return len(jobs), next_due

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
            codes = self.scripts.lock_codes(self.keys, [(job_id, token) for job_id, _ in jobs], self.lock_duration_ms)
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

    def _unrunnable(self, job_id: str, token: str, error: Exception) -> _Outcome:
        """The end of an attempt that cannot start: the job's hash cannot be decoded into a job."""
        job = Job(self.keys.queue, job_id, name="", data=None, opts=JobOptions(), token=token)
        logger.error("worker %s: job %s of queue %s cannot run: %s", self.worker_id, job_id, self.keys.queue, error)
        finish = Finish(job_id, token, completed=False, value=f"cannot run the job: {error}", final=True,
                        error_class=class_path(error))
        return _Outcome(job, finish)

    def _written(self, outcome: _Outcome, code: Any) -> None:
        """Account for one job whose result was just written (or could not be)."""
        job, finish = outcome.job, outcome.finish
        self._running -= 1
        self._locks.release(job.id, job.token or "")
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
            logger.info("job %s of queue %s failed, %s: %s", job.id, self.keys.queue,
                        _FAILURE_OUTCOMES.get(status, "failed"), finish.value)

    def _collect(self, ended: list[_Outcome], wait_s: float | None) -> bool:
        """Move ended jobs from the job threads into `ended`, waiting up to `wait_s` for the first.

        Returns whether anything arrived (a wake-up from the marker or a stop counts).
        """
        try:
            event = self._events.get_nowait() if wait_s is None else self._events.get(timeout=wait_s)
        except threadqueue.Empty:
            return False
        while True:
            if event is not None:
                ended.append(event)
            try:
                event = self._events.get_nowait()
            except threadqueue.Empty:
                return True

    # -- waiting for work ------------------------------------------------

    def _wait_s(self, next_due: int | None) -> float:
        """How long to wait for work: the block timeout, or until the next delayed job is due if sooner.

        Never as long as the client's socket timeout, which would end the
        wait with a TimeoutError (and retries) instead of an empty reply
        (redis-py's own default socket timeout is 5 s).
        """
        timeout = self.block_timeout_s
        if next_due is not None:
            timeout = min(timeout, max((next_due - now_ms()) / 1000, 0.001))
        return min(timeout, max((socket_timeout(self.client) or 5.0) - 1, 0.1))

    def _arm_marker(self, next_due: int | None) -> None:
        """Ask the marker thread to block until work is signalled or the next delayed job is due."""
        self._marker.arm(self._wait_s(next_due))

    # -- slots -------------------------------------------------------------

    def _job_thread(self, slot: ThreadSlot | ProcessSlot) -> None:
        while (job := self._jobs.get()) is not None:
            outcome = _Outcome(job, None)
            try:
                outcome = self._run_job(slot, job)
            finally:  # even for SystemExit from a handler: the loop must free the slot
                self._events.put(outcome)

    def _run_inline(self, ended: list[_Outcome]) -> None:
        """Run the job the loop took, on the loop's own thread (concurrency 1 on threads: see __init__)."""
        while not self._jobs.empty():
            job = self._jobs.get_nowait()
            assert job is not None  # only job threads get None
            # Raised first, then _aborted read: an abort either is seen here, or sees the flag raised
            # and lets run() return.
            self._running_inline = True
            if self._aborted.is_set():
                self._running_inline = False
                return  # a second stop came after the fetch: the job is left to the sweeper
            try:
                outcome = self._run_job(self._slots[0], job)
            finally:
                self._running_inline = False
            if self._aborted.is_set():
                return  # a second stop meanwhile, and run() has returned: the result is dropped
            ended.append(outcome)

    def _run_job(self, slot: ThreadSlot | ProcessSlot, job: Job) -> _Outcome:
        finish = None
        key = (job.id, job.token or "")
        with self._in_hand_lock:
            self._in_hand[key] = (job, slot)
        try:
            finish = slot.run(job, *self._limits(job))
        except ChildStartError as error:  # no child to run jobs in: stop, leaving this job to the sweeper
            if not error.stopped:
                logger.error("worker %s: %s; stopping, and leaving job %s to the sweeper", self.worker_id,
                             error, job.id)
                self._broken = self._broken or error
                self._stages.abort()
        except Exception:  # the thread must live on for the next job; the lock lapses
            logger.exception("worker %s: could not finish job %s; the sweeper will recover it",
                             self.worker_id, job.id)
        finally:
            with self._in_hand_lock:
                self._in_hand.pop(key, None)
        return _Outcome(job, finish)

    def _abandoned_changed(self) -> None:
        """A thread past its hard limit was abandoned, or one ended: show it now, and let the loop count its slots."""
        self._locks.renew_soon()  # whose round goes on to _show_abandoned
        self._events.put(None)

    def _show_abandoned(self) -> None:
        """Write this worker's abandoned threads (or that it has none left) to keys.abandoned, if that changed.

        Each is a member "<job id> <token>" scored by when it stops counting
        unless written again (this worker's clock): the renewer writes them
        at each round, so those of a worker that died go within a lock duration.
        """
        with self._show_abandoned_lock:
            shown = set() if self._done.is_set() else {f"{job_id} {token}" for job_id, token in self._abandoned.jobs()}
            if not shown and not self._shown_abandoned:
                return
            until = now_ms() + self.lock_duration_ms
            pipe = self.client.pipeline(transaction=False)
            if gone := self._shown_abandoned - shown:
                pipe.zrem(self.keys.abandoned, *gone)
            if shown:
                pipe.zadd(self.keys.abandoned, dict.fromkeys(shown, until))
            pipe.zremrangebyscore(self.keys.abandoned, "-inf", f"({now_ms()}")  # left by workers that died
            try:
                pipe.execute()
            except (*UNREACHABLE, ResponseError) as error:
                logger.warning("worker %s: could not show its abandoned threads (%s)", self.worker_id, error)
                return
            self._shown_abandoned = shown

    def _limits(self, job: Job) -> tuple[int, int]:
        """(soft, hard) time limit of a job in ms, 0 for none: its own, else the worker's."""
        hard = job.opts.time_limit_ms or self.time_limit_ms
        soft = job.opts.soft_time_limit_ms or self.soft_time_limit_ms
        return (0 if hard and soft >= hard else soft), hard

    def _stop_attempt(self, job_id: str, token: str, lost: bool) -> None:
        """A renewal found this held job cancelled, or its lock lost: stop the attempt.

        A cancelled attempt then fails for good. A lost one may be running
        elsewhere already (the sweeper recovered it): its child is killed, or
        its thread gets LockLostError at its next check, so that the two runs
        overlap as briefly as this worker can make them.
        """
        with self._in_hand_lock:
            job, slot = self._in_hand.get((job_id, token), (None, None))
        if job is None:
            return  # it ended meanwhile
        if isinstance(job._interrupt, (JobCancelled, LockLostError)):
            if slot is not None:
                slot.stop(job)  # once more, in case its child was being replaced the last time
            return
        if lost:
            job.interrupt(LockLostError(f"job {job_id} was recovered by the sweeper: this attempt lost its lock"))
        else:
            logger.info("worker %s: job %s of queue %s was cancelled; stopping it", self.worker_id, job_id,
                        self.keys.queue)
            job.interrupt(JobCancelled(f"job {job_id} was cancelled"))
        if slot is not None:
            slot.stop(job)
