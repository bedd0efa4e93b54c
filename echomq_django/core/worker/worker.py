"""The consumer side: a worker made of parts that fetch jobs, run them, keep their locks and finish them.

The parts, each with one job, talk through one queue of events:

- the fetch loop (fetching.py), the only caller of moveToActive and
  moveToFinished, runs on the thread of a free slot: each round trip writes
  the results of the jobs that ended and takes jobs for the free slots (run()'s
  own thread only waits for the end);
- the job slots (slots.py), a thread each, run handlers on that thread or in
  a child process (pool.py), and put each job's end on the queue;
- the marker waiter (marker.py) blocks on the queue's marker while jobs run,
  and puts a wake-up on the queue when work is signalled;
- the lock renewer (locks.py) extends the held locks, and stops an attempt
  whose job was cancelled or whose lock was lost; at each of its rounds the
  worker's record in the workers registry (registry.py) is written again.
"""

from __future__ import annotations

import logging
import os
import queue as threadqueue
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from .. import defaults
from ..errors import InvalidNameError
from ..protocol.connection import UNREACHABLE, require_text_replies
from ..protocol.job import Job
from ..protocol.keys import QueueKeys, validate_stored_id
from ..protocol.registry import Heartbeat, WorkerInfo
from ..protocol.scripts import Scripts
from ..protocol.times import now_ms
from . import durable
from .fetching import FetchLoop
from .locks import LockRenewer
from .marker import MarkerWaiter
from .options import DEFAULTS, WorkerOptions
from .pool import Handler
from .round_trips import RoundTrips
from .slots import AbandonedShown, Events, JobSlots
from .stopping import TwoStages

logger = logging.getLogger("echomq.worker")
# How often run(), which waits while the parts work, lets a Ctrl-C in.
SIGNAL_CHECK_S = 0.5


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

    def step(self, job: Job, op: str, name: str, kind: str, text: str, deadline: int) -> Any:
        """A durable step's read or write (core/worker/durable.py); unlike a report, an error reaches the job."""
        if op == "read":
            return self.scripts.read_step(self.keys, job.id, name)
        return self.scripts.record_step(self.keys, job.id, job.token or "", name, kind, text,
                                        max_steps=defaults.MAX_STEPS, now=durable.now_ms(), deadline=deadline)

    def _written(self, job: Job, what: str, write: Callable[[], bool]) -> bool:
        try:
            return write()
        except (*UNREACHABLE, ResponseError) as error:
            logger.warning("job %s of queue %s: its %s was not recorded (%s)", job.id, self.keys.queue, what, error)
            return False


def abandoned_threads(client: Any, keys: QueueKeys, now: int | None = None) -> list[tuple[str, str]]:
    """(worker id, job id) of each job thread past its hard limit that still runs and holds a slot of its worker.

    As the workers write them (AbandonedShown, slots.py), oldest first; those
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
    """Runs the jobs of one queue, `concurrency` at a time, until stopped; what it is told is one WorkerOptions.

    One loop does the worker's Redis work in batches: each round trip writes
    the results of every job that ended since the last one and takes new jobs
    for the free slots, in one pipeline. Each slot runs one job at a time, on
    a thread of its own (see slots.py), the same at every concurrency: with
    `pool="threads"` on that thread, with `pool="processes"` in a child
    process of its own, started once and reused (retired after
    `max_jobs_per_child` jobs, or once it grew past `max_memory_per_child_kb`).
    A slot only runs handlers. When nothing is ready and nothing runs, the
    loop's own fetch waits for a producer's signal (no polling); while jobs
    run, a marker thread waits instead and wakes the loop when work is
    signalled or a delayed job is due. A renewal thread (LockRenewer) extends
    all held locks in one call every `renew_interval_ms` (half the lock
    duration by default). A job's result is written with the token it was
    fetched with, so a worker whose lock lapsed and whose job was recovered
    gets LockLostError and overwrites nothing. With `confirm`, each round
    trip ends with a WAIT for that many replicas, so a failover cannot undo a
    finish (and run the job a second time).

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

    With OpenTelemetry tracing on (tracing.py), each attempt is a process span,
    linked to the span that sent the job, and its child with `trace_as_child`.

    Shutdown has two stages: the first `stop()` stops fetching and lets
    running jobs finish; a second `stop()` makes `run()` return at once, and
    the jobs still running are left to their lapsing locks and the sweeper.
    """

    def __init__(self, queue: str, handler: Handler, client: Any, options: WorkerOptions = DEFAULTS, *,
                 scripts: Scripts | None = None, worker_id: str | None = None, queues: tuple[str, ...] = ()) -> None:
        """`queues`: every queue the worker's process serves, as the registry shows it (default: `queue`)."""
        self.options = options
        self.keys = QueueKeys(queue, options.prefix)
        self.handler = handler
        require_text_replies(client)
        self.client = client
        self.scripts = scripts or Scripts(client)
        self._reporter = _Reporter(self.scripts, self.keys, options.max_log_lines)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.queues = queues or (queue,)
        self.started_at_ms = now_ms()
        self._stages = TwoStages()  # what stop() and abort() set
        self._events: Events = Events()  # the parts' one queue: the loop reads it
        # Why run() may return: "ended" (the loop), "aborted" (abort()), or the loop's error.
        self._returned: threadqueue.SimpleQueue[str | BaseException] = threadqueue.SimpleQueue()
        self._slots = JobSlots(handler, self._reporter, options.concurrency, options.slots(), self._events,
                               self._stages, self.worker_id, on_abandoned=self._abandoned_changed, lead=self._lead)
        lock_ms = options.lock_duration_ms
        self._shown = AbandonedShown(client, self.keys, self._slots.abandoned, lock_ms, self.worker_id)
        self._heartbeat = Heartbeat(client, self.keys, self.describe, lock_ms)
        self._locks = LockRenewer(self.scripts, self.keys, lock_ms, options.renew_ms, self.worker_id,
                                  on_stop=self._slots.stop_attempt, beside=self._each_round)
        self._marker = MarkerWaiter(client, self.scripts, self.keys, self._events, self.worker_id)
        self._trips = RoundTrips(self.scripts, self.keys, self.worker_id, options.fetching(), locks=self._locks,
                                 stages=self._stages, reporter=self._reporter)
        self._fetch = FetchLoop(client, self._trips, slots=self._slots, marker=self._marker, events=self._events,
                                stages=self._stages, block_timeout_s=options.block_timeout_s,
                                on_end=lambda: self._returned.put("ended"))

    @property
    def processed(self) -> int:
        """Job attempts whose results this worker wrote."""
        return self._trips.processed

    def describe(self) -> WorkerInfo:
        """This worker as the workers registry shows it, as of now."""
        return WorkerInfo(
            id=self.worker_id, queue=self.keys.queue, host=socket.gethostname(), pid=os.getpid(),
            queues=self.queues, pool=self.options.pool, concurrency=self.options.concurrency,
            version=defaults.__version__, started_at_ms=self.started_at_ms, heartbeat_at_ms=now_ms(),
            done=self._trips.processed, failed=self._trips.failed, running=tuple(self._locks.running()))

    # -- control ---------------------------------------------------------

    def stop(self) -> None:
        """First call: finish running jobs, fetch no more. A second call aborts.

        Thread-safe, not signal-safe: from a signal, use run_until_signalled (signals.py).
        """
        if self._stages.stop():
            self.abort()
            return
        logger.info("worker %s: stopping after %d running job(s)", self.worker_id, self._trips.running)
        self._marker.idle.clear()
        self._wake()

    def abort(self) -> None:
        """Make run() return now (writing what it holds if Redis answers), leaving running jobs to the sweeper."""
        if self._stages.abort():
            logger.warning("worker %s: leaving now, %d running job(s) to the sweeper", self.worker_id,
                           self._trips.running)
        self._wake()
        self._returned.put("aborted")

    def run(self, *, burst: bool = False, max_jobs: int | None = None) -> int:
        """Process jobs until stopped (or, in burst mode, until none is ready); returns the count.

        With the processes pool, the children start first: RuntimeError when
        one cannot, then or later (the jobs in hand are left to the sweeper: a
        worker that cannot start children must not fail job after job).
        A Ctrl-C (Python's KeyboardInterrupt) aborts, and is raised. (A script
        that wants the two stages on its signals runs the worker through
        run_until_signalled, which handles them.)
        """
        if not self._slots.start_children():
            return 0  # stopped while they started
        self.started_at_ms = now_ms()
        self._locks.renew_soon()  # its first round writes the worker's record: in the registry until it stops
        threads = [threading.Thread(target=self._locks.run, name="echomq-renew", daemon=True),
                   threading.Thread(target=self._marker.run, name="echomq-marker", daemon=True),
                   *self._slots.threads()]
        # Whatever cuts run() short (a Ctrl-C, say, also while the threads start) is a second stop: none of
        # them may run on, the renewer would for good.
        self._fetch.begin(burst, max_jobs)
        try:
            for thread in threads:
                thread.start()
            self._slots.pass_lead()  # to the first free slot: the loop starts
            self._until_it_ends()
            self._close()
        except BaseException:
            self._stages.abort()
            self._wake()
            self._close()
            raise
        if self._slots.broken is not None:
            raise RuntimeError(str(self._slots.broken))
        return self.processed

    def _until_it_ends(self) -> None:
        """Wait, on run()'s thread, until the loop ends or an abort leaves it; raise the loop's error.

        In slices: a signal (Ctrl-C) that another thread received is handled
        here between two. A loop of its own, outside the caller's try:
        CPython 3.13 raises a Ctrl-C that lands on the condition of a `while`
        past that loop's enclosing `finally` (python/cpython#130279).
        """
        while True:
            try:
                why = self._returned.get(timeout=SIGNAL_CHECK_S)
            except threadqueue.Empty:
                continue
            if isinstance(why, BaseException):
                raise why
            if why == "aborted":
                self._fetch.conclude()  # once the slot that leads (if one does) saw the abort
            return

    def _lead(self) -> Job | None:
        """A free slot's turn to run the loop (see FetchLoop.lead); its error goes to run()."""
        try:
            return self._fetch.lead()
        except BaseException as error:  # run() raises it, as the loop's own error
            self._returned.put(error)
            return None

    def _wake(self) -> None:
        """Have the loop look at the stages now: end its wait for work, and wake it."""
        self._trips.wait.cut()
        self._events.put(None)

    def _close(self) -> None:
        """The worker's end, once its loop ended (or a Ctrl-C or an error cut it short)."""
        self._stages.stopping.set()
        self._marker.close()
        self._shown.closed = True  # none left to show: the worker's slots are gone
        self._locks.stop()
        aborted = self._stages.aborted.is_set()
        if not aborted:  # (a second stop returns at once: they go within a lock duration)
            self._shown.show()
            self._heartbeat.leave()
        # A second stop kills the children of jobs left running.
        self._slots.close(kill=aborted)

    def _each_round(self) -> None:
        """The renewer's other periodic writes, after each of its rounds."""
        self._shown.show()
        self._heartbeat.beat()

    def _abandoned_changed(self) -> None:
        """A thread past its hard limit was abandoned, or one ended: show it now, and let the loop count its slots."""
        self._locks.renew_soon()  # whose round goes on to AbandonedShown.show
        self._events.put(None)

