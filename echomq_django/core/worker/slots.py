"""A worker's job slots: one thread each, running a handler (there, or in a child) one job at a time.

Each slot's thread takes from one queue, in turn: a job, which it runs
through a ThreadSlot or a ProcessSlot (pool.py: the same interface), putting
its end, an `Outcome`, on the worker's queue of events for the fetch loop to
write; or the turn to lead, `LEAD`, when it runs the fetch loop itself
(fetching.py) until a round trip takes a job for it.
"""

from __future__ import annotations

import logging
import pickle
import queue as threadqueue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from ..errors import JobCancelled, LockLostError
from ..producing.tracing import process_traced
from ..protocol.connection import UNREACHABLE
from ..protocol.job import Job, Reporter
from ..protocol.keys import QueueKeys
from ..protocol.scripts import Finish
from ..protocol.times import now_ms
from .pool import Handler
from .process_slot import ChildStartError, ProcessSlot
from .stopping import TwoStages
from .thread_slot import AbandonedThreads, ThreadSlot

logger = logging.getLogger("echomq.worker")


@dataclass
class Outcome:
    """A slot's result, waiting to be written (`finish` None: there is nothing to write)."""

    job: Job
    finish: Finish | None


# What wakes the fetch loop: an Outcome from a slot, or None (the marker, a stop, a slot freed).
Events = threadqueue.SimpleQueue[Outcome | None]

LEAD = "lead"  # the turn to run the fetch loop, passed from slot to slot in their queue of jobs


@dataclass(frozen=True)
class SlotOptions:
    """How a worker's slots run jobs: the pool, the worker's time limits, the children's life."""

    pool: str = "threads"
    time_limit_ms: int = 0
    soft_time_limit_ms: int = 0
    max_jobs_per_child: int = 0
    max_memory_per_child_kb: int = 0
    child_init: Callable[[], None] | None = None
    trace_as_child: bool = False  # an attempt's process span is its send span's child (tracing.py), not linked only


class JobSlots:
    """`concurrency` slots, each a thread that runs the jobs handed to it, one at a time.

    A running job is "in hand" with the slot that runs it, so that a renewal
    that finds it cancelled or its lock lost can stop it there (stop_attempt).
    A processes slot that cannot start a child (ChildStartError) aborts the
    worker: `broken` says why, and the job is left to the sweeper.
    """

    def __init__(self, handler: Handler, reporter: Reporter, concurrency: int, options: SlotOptions,
                 events: Events, stages: TwoStages, worker_id: str, *, on_abandoned: Callable[[], None],
                 lead: Callable[[], Job | None]) -> None:
        self.options, self.events, self.stages, self.worker_id = options, events, stages, worker_id
        self._lead = lead
        self.abandoned = AbandonedThreads(on_change=on_abandoned)
        self.broken: ChildStartError | None = None
        try:
            self.slots: list[ThreadSlot | ProcessSlot] = [
                ProcessSlot(handler, reporter, child_init=options.child_init, max_jobs=options.max_jobs_per_child,
                            max_memory_kb=options.max_memory_per_child_kb, name=f"echomq-child-{i}",
                            aborted=stages.aborted)
                if options.pool == "processes" else ThreadSlot(handler, self.abandoned) for i in range(concurrency)]
        except (pickle.PicklingError, TypeError, AttributeError) as error:  # ProcessSlot pickles the handler
            raise ValueError(f"the processes pool needs a handler it can send to a child process "
                             f"(a module-level function): {error}") from None
        self._jobs: threadqueue.SimpleQueue[Job | str | None] = threadqueue.SimpleQueue()
        # The jobs handed over and not yet ended, with the slot running each (None until one takes it).
        self._in_hand: dict[tuple[str, str], tuple[Job, ThreadSlot | ProcessSlot | None]] = {}
        self._in_hand_lock = threading.Lock()

    @property
    def count(self) -> int:
        return len(self.slots)

    def threads(self) -> list[threading.Thread]:
        """The slots' threads, to start."""
        return [threading.Thread(target=self._serve, args=(slot,), name=f"echomq-job-{i}", daemon=True)
                for i, slot in enumerate(self.slots)]

    def take(self, job: Job) -> None:
        """Hold `job` in hand until a slot runs it, so that a renewal meanwhile can stop it (stop_attempt)."""
        with self._in_hand_lock:
            self._in_hand[(job.id, job.token or "")] = (job, None)

    def start(self, job: Job) -> None:
        """Have the first free slot run `job`."""
        self.take(job)
        self._jobs.put(job)

    def pass_lead(self) -> None:
        """Give the turn to lead to the next free slot (behind the jobs handed out before)."""
        self._jobs.put(LEAD)

    def start_children(self) -> bool:
        """Start the processes pool's children; False when the worker was stopped meanwhile."""
        children = [slot for slot in self.slots if isinstance(slot, ProcessSlot)]
        try:
            for slot in children:
                slot.launch()
            for slot in children:
                slot.wait_ready(self.stages.stopping)
        except BaseException as error:
            for slot in children:
                slot.close(kill=True)
            if isinstance(error, ChildStartError):
                if error.stopped:
                    return False
                raise RuntimeError(str(error)) from None
            raise
        return True

    def close(self, *, kill: bool) -> None:
        """Close the slots (`kill`: the children of jobs left running too); each thread ends after its job."""
        # The children first, while the threads that started some still live (a child is
        # killed when the thread that started it ends).
        for slot in self.slots:
            try:
                slot.close(kill=kill)
            except Exception:  # the other slots must still be closed
                logger.exception("worker %s: could not stop a child process", self.worker_id)
        for _ in self.slots:
            self._jobs.put(None)  # each thread's last

    def _serve(self, slot: ThreadSlot | ProcessSlot) -> None:
        while (job := self._jobs.get()) is not None:
            if isinstance(job, str):  # LEAD: run the loop until it takes a job for this slot, or ends
                if (job := self._lead()) is None:
                    continue
            outcome = Outcome(job, None)
            try:
                outcome = self._run(slot, job)
            finally:  # even for SystemExit from a handler: the loop must free the slot
                self.events.put(outcome)

    def _run(self, slot: ThreadSlot | ProcessSlot, job: Job) -> Outcome:
        finish = None
        key = (job.id, job.token or "")
        with self._in_hand_lock:
            self._in_hand[key] = (job, slot)
        try:
            finish = process_traced(job, lambda: slot.run(job, *self.limits(job)),
                                    child_of_send=self.options.trace_as_child)
        except ChildStartError as error:  # no child to run jobs in: stop, leaving this job to the sweeper
            if not error.stopped:
                logger.error("worker %s: %s; stopping, and leaving job %s to the sweeper", self.worker_id,
                             error, job.id)
                self.broken = self.broken or error
                self.stages.abort()
        except Exception:  # the thread must live on for the next job; the lock lapses
            logger.exception("worker %s: could not finish job %s; the sweeper will recover it",
                             self.worker_id, job.id)
        finally:
            with self._in_hand_lock:
                self._in_hand.pop(key, None)
        return Outcome(job, finish)

    def limits(self, job: Job) -> tuple[int, int]:
        """(soft, hard) time limit of a job in ms, 0 for none: its own, else the worker's."""
        hard = job.opts.time_limit_ms or self.options.time_limit_ms
        soft = job.opts.soft_time_limit_ms or self.options.soft_time_limit_ms
        return (0 if hard and soft >= hard else soft), hard

    def stop_attempt(self, job_id: str, token: str, lost: bool) -> None:
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
                        job.queue)
            job.interrupt(JobCancelled(f"job {job_id} was cancelled"))
        if slot is not None:
            slot.stop(job)


class AbandonedShown:
    """A worker's abandoned threads as keys.abandoned shows them (read by abandoned_threads, worker.py).

    Each is a member "<job id> <token>" scored by when it stops counting
    unless written again (this worker's clock): the renewer writes them at
    each round (`show`), so those of a worker that died go within a lock duration.
    """

    def __init__(self, client: Any, keys: QueueKeys, abandoned: AbandonedThreads, lock_duration_ms: int,
                 worker_id: str) -> None:
        self.client, self.keys, self.abandoned = client, keys, abandoned
        self.lock_duration_ms, self.worker_id = lock_duration_ms, worker_id
        self._shown: set[str] = set()  # the members this worker wrote last
        self._lock = threading.Lock()
        self.closed = False  # the worker ended: it has none left to show

    def show(self) -> None:
        """Write this worker's abandoned threads (or that it has none left) to keys.abandoned, if that changed."""
        with self._lock:
            shown = set() if self.closed else {f"{job_id} {token}" for job_id, token in self.abandoned.jobs()}
            if not shown and not self._shown:
                return
            until = now_ms() + self.lock_duration_ms
            pipe = self.client.pipeline(transaction=False)
            if gone := self._shown - shown:
                pipe.zrem(self.keys.abandoned, *gone)
            if shown:
                pipe.zadd(self.keys.abandoned, dict.fromkeys(shown, until))
            pipe.zremrangebyscore(self.keys.abandoned, "-inf", f"({now_ms()}")  # left by workers that died
            try:
                pipe.execute()
            except (*UNREACHABLE, ResponseError) as error:
                logger.warning("worker %s: could not show its abandoned threads (%s)", self.worker_id, error)
                return
            self._shown = shown
