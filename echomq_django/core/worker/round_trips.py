"""The worker's round trips to Redis: each one writes the results of the jobs that ended (moveToFinished) and
takes new jobs for the free slots (moveToActive) in one pipeline, with the options the worker was given.

The fetch loop (fetching.py) decides when to make one; this module makes it and reads its replies.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from ..errors import JobNotFoundError, LockLostError, QueueStateError
from ..producing.handoff import deliver_handoffs, hands_off
from ..producing.workflow_tree import read_inputs
from ..protocol.connection import UNREACHABLE
from ..protocol.job import Job, Reporter
from ..protocol.keys import QueueKeys
from ..protocol.options import JobOptions
from ..protocol.scripts import Confirm, Finish, RateLimit, Scripts, Wait
from ..protocol.times import now_ms
from .locks import RETRY_PAUSE_S, LockRenewer
from .pool import class_path
from .slots import Outcome
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
        elif status == 7:
            logger.info("job %s of queue %s was postponed %g s (%s)", job.id, self.keys.queue,
                        finish.backoff_ms / 1000, finish.value)
        elif status in (8, 9):
            logger.info("job %s of queue %s waits for its signal %r%s", job.id, self.keys.queue, finish.value,
                        ": parked" if status == 8 else ", which has come: back in the queue")
        elif not finish.completed:
            self.failed += 1
            logger.info("job %s of queue %s failed, %s: %s", job.id, self.keys.queue,
                        _FAILURE_OUTCOMES.get(status, "failed"), finish.value)
