"""The producer side: add jobs, look at them, retry, remove, pause."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .. import defaults
from ..errors import (
    InvalidNameError,
    JobNotFoundError,
    NotConfirmedError,
    PayloadError,
    QueueStateError,
    SignalRefused,
)
from ..protocol.codec import encode_json
from ..protocol.connection import require_text_replies
from ..protocol.job import Job
from ..protocol.keys import (
    ALPHABET,
    LIST_STATES,
    STATES,
    QueueKeys,
    validate_id,
    validate_job_id,
    validate_job_name,
    validate_name,
    validate_stored_id,
)
from ..protocol.options import MAX_TIMESTAMP_MS, JobOptions, whole_number
from ..protocol.registry import WorkerInfo, live_workers
from ..protocol.scripts import CHANGE_RECORD_MS, Call, Confirm, Scripts, change_token, pairs
from ..protocol.times import now_ms
from .handle import JobHandle
from .handoff import deliver_handoffs
from .new_jobs import Dedupe, EncodedJob, NewJob
from .outcomes import (
    BULK_BATCH,
    GONE,
    STOPPING,
    BulkOutcome,
    Cancel,
    JobRead,
    batched,
    batched_by_size,
    text_bytes,
)
from .tracing import send_traced, with_trace

# Jobs per addJob call in add_bulk: large enough that per-call costs vanish, small
# enough that one call never blocks Redis for long (about a millisecond).
JOBS_PER_CALL = 500


class Queue:
    """A named queue on one Redis: the producer's and the operator's handle.

    With `confirm`, an add returns only once that many replicas have the new
    jobs (Redis WAIT), and raises NotConfirmedError when they do not within
    the timeout: then a failover cannot lose a job whose add returned.
    """

    def __init__(
        self, name: str, client: Any, *, prefix: str = defaults.PREFIX,
        default_opts: JobOptions | None = None,
        max_payload_bytes: int = defaults.MAX_PAYLOAD_BYTES,
        scripts: Scripts | None = None, confirm: Confirm | None = None,
    ) -> None:
        require_text_replies(client)
        self.name = name
        self.client = client
        self.keys = QueueKeys(name, prefix)
        self.default_opts = default_opts or JobOptions()
        self.max_payload_bytes = max_payload_bytes
        self.scripts = scripts or Scripts(client)
        self.confirm = confirm

    def __repr__(self) -> str:
        return f"<Queue {self.name!r} prefix={self.keys.prefix!r}>"

    def encode(self, job: NewJob, trace: str = "") -> EncodedJob:
        """The job validated and encoded as an add sends it (PayloadError or InvalidNameError if it cannot be).

        `trace`: the trace context its opts carry, as `send_traced` gives it (core/producing/tracing.py).
        """
        validate_job_name(job.name)
        job_id = "" if job.job_id is None else validate_job_id(job.job_id)
        if job_id.startswith(self.name + ".") and job_id[len(self.name) + 1:].isdigit():
            raise InvalidNameError(f"job id {job_id!r} has the form of queue {self.name!r}'s generated ids "
                                   f"({self.name}.<n>); choose another")
        opts = job.opts or self.default_opts
        data = encode_json(job.data, f"data of job {job.name!r}", self.max_payload_bytes)
        opts_text = with_trace(opts.encoded(), trace)
        dedupe = job.dedupe
        if dedupe is None:
            return EncodedJob(job_id=job_id, name=job.name, data=data, opts=opts_text, delay_ms=opts.delay_ms,
                              priority=opts.priority, group=opts.group, expires_ms=opts.expires_ms)
        # A debounced job waits its window (a delay of its own would be the same thing, twice).
        delay_ms = dedupe.debounce_ms or opts.delay_ms
        if opts.expires_ms and opts.expires_ms <= delay_ms:
            raise PayloadError("the job would expire before its debounce window ends: it could never run")
        return EncodedJob(job_id=job_id, name=job.name, data=data, opts=opts_text, delay_ms=delay_ms,
                          priority=opts.priority, group=opts.group, expires_ms=opts.expires_ms, dedupe=dedupe.key,
                          dedupe_mode=dedupe.mode, dedupe_ms=dedupe.ttl_ms or dedupe.debounce_ms)

    def add(
        self, name: str, data: Any = None, *, opts: JobOptions | None = None,
        job_id: str | None = None, timestamp_ms: int | None = None, dedupe: Dedupe | None = None,
    ) -> str:
        """Add one job and return its id (an existing caller-given id is returned as is; with `dedupe`, the id of
        the job that holds the key, when one does).

        `timestamp_ms` is stored as the job's creation time (and a delay counts
        from it); now by default. With tracing on, the add is a send span (core/producing/tracing.py).
        """
        job = NewJob(name, data, opts, job_id, dedupe)
        [new_id] = send_traced(self.name, lambda trace: self._add([self.encode(job, trace)], timestamp_ms))
        return new_id

    def add_bulk(self, jobs: Iterable[NewJob]) -> list[str]:
        """Add many jobs in one pipelined round trip, JOBS_PER_CALL per script call; returns their ids in order.

        Every job is validated before anything is sent, so bad input adds nothing.
        """
        jobs = list(jobs)
        return send_traced(self.name, lambda trace: self._add([self.encode(job, trace) for job in jobs]), len(jobs))

    def add_calls(self, encoded: Sequence[EncodedJob], timestamp_ms: int | None = None, *,
                  sent_ms: int = 0) -> list[Call]:
        """The addJob calls that add `encoded` (JOBS_PER_CALL jobs, CALL_BYTES per call), sent in one round trip.

        `sent_ms` > 0 records each id added for that long, so that a second
        send adds nothing even after the job ended and was removed (an outbox's
        send, whose row may be sent twice).
        """
        # Checked here: the script would fail on text after taking an id, or, on NaN with a delay, after
        # writing the job's hash (a job in no state).
        timestamp = now_ms() if timestamp_ms is None else whole_number(
            timestamp_ms, "timestamp (ms)", 0, MAX_TIMESTAMP_MS)
        return [self.scripts.add_jobs_call(self.keys, timestamp, chunk, sent_ms)
                for chunk in batched_by_size(encoded, JOBS_PER_CALL, encoded_bytes)]

    def _add(self, encoded: list[EncodedJob], timestamp_ms: int | None = None) -> list[str]:
        if not encoded:
            return []
        replies, acked = self.scripts.run_confirmed(self.add_calls(encoded, timestamp_ms), self.confirm,
                                                    raise_on_error=True)
        ids = [job_id for reply in replies for job_id, _added in pairs(reply)]
        if self.confirm is not None and acked < self.confirm.replicas:
            raise NotConfirmedError(
                f"{len(ids)} job(s) were added to queue {self.name!r}, but {acked} of {self.confirm.replicas} "
                f"replicas confirmed them within {self.confirm.timeout_ms} ms; a failover now could lose them",
                ids)
        return ids

    def handle(self, job_id: str) -> JobHandle:
        """A handle on job `job_id` of this queue: its status, its result, a wait for it (a str: the id)."""
        return JobHandle(validate_id(job_id), self)

    def deduplicated_to(self, job_id: str) -> str | None:
        """The job that holds the dedupe key an add of `job_id` (a caller's id) found held, for a day; else None."""
        return self.client.get(self.keys.deduplicated_to(validate_id(job_id)))

    def get_job(self, job_id: str, *, log_lines: int = -1) -> Job | None:
        """The job with this id, with its progress and its newest `log_lines` log lines (-1: all), or None."""
        return self.get_job_with_state(job_id, log_lines=log_lines)[0]

    def get_state(self, job_id: str) -> str | None:
        """Which state holds the job: one of STATES, or None when it is in none."""
        return self.scripts.job_state(self.keys, validate_id(job_id))

    def get_job_with_state(self, job_id: str, *, log_lines: int = -1) -> tuple[Job | None, str | None]:
        """The job and the state that holds it, read in one atomic step (None for either that is missing).

        The job's `logs` are its newest `log_lines` lines (-1: all) and
        `log_count` how many it keeps. QueueStateError when its key is not a hash.
        """
        validate_id(job_id)
        state, fields, kept, lines = self.scripts.read_job(self.keys, job_id, log_lines)
        if fields is None:
            raise QueueStateError(f"the key of job {job_id!r} of queue {self.name!r} is not a hash")
        if not fields:
            return None, state
        job = Job.from_flat(self.name, job_id, fields)
        job.logs, job.log_count = lines, kept
        return job, state

    def get_jobs(self, state: str, start: int = 0, count: int = 50) -> list[Job]:
        """Jobs in one state, `count` of them from position `start`.

        Newest first, except `prioritized`: in the order workers will take them.
        """
        if state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}, not {state!r}")
        for value, what in ((start, "start"), (count, "count")):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{what} must be a whole number >= 0, not {value!r}")
        if count == 0:  # a stop of start - 1 would be Redis's -1: the last job, so every job from start on
            return []
        key = getattr(self.keys, state)
        stop = start + count - 1
        if state in LIST_STATES:
            ids = self.client.lrange(key, start, stop)
        elif state == "prioritized":
            ids = self.client.zrange(key, start, stop)
        else:
            ids = self.client.zrevrange(key, start, stop)
        # A key of another type (written by some other client) is skipped like a missing one.
        return [read.job for read in read_jobs(self, ids) if read.job]

    def counts(self) -> dict[str, int]:
        """Jobs per state, plus `stalled`: marked jobs (a subset of active)."""
        return self.scripts.get_counts(self.keys)

    def retry(self, job_id: str) -> bool:
        """Send a failed job back to wait; False when it is not in `failed` (any more)."""
        return self.scripts.retry_job(self.keys, validate_stored_id(job_id)) == 1

    def remove(self, job_id: str, *, only_from: str | None = None) -> bool:
        """Delete a job wherever it is (or only while in `only_from`: "failed", ...).

        Raises JobLockedError while a worker holds it.
        """
        removed = self.scripts.remove_job(self.keys, validate_stored_id(job_id), only_from)
        if removed:
            deliver_handoffs(self.scripts, self.keys, now_ms())  # a workflow's member: its workflow heard of it
        return removed

    def retry_all_failed(self, batch: int = 1000) -> int:
        """Send every failed job back to wait, `batch` per pipelined round trip; returns how many."""
        retried = stuck = 0  # stuck: ids that cannot run (no job hash; a step without its inputs), left in failed
        while ids := self.client.zrange(self.keys.failed, stuck, stuck + batch - 1):
            token = change_token()
            codes = self.scripts.run_batch([self.scripts.retry_call(self.keys, job_id, token) for job_id in ids],
                                           raise_on_error=True)
            retried += codes.count(1)
            stuck += codes.count(-1) + codes.count(-2)
            if 1 not in codes and -1 not in codes and -2 not in codes:
                break
        return retried

    def retry_many(self, job_ids: Iterable[str], batch: int = BULK_BATCH, *, token: str | None = None,
                   record_ms: int = CHANGE_RECORD_MS) -> BulkOutcome:
        """`retry` each of these jobs, `batch` script calls per pipelined round trip.

        Each job is answered once per token (a re-send answers as the first
        send did), for `record_ms`: a new token per round trip, or `token` for
        every one (a caller that may run the same ids again, core/reading/bulk_runs.py).
        """
        def sort(outcome: BulkOutcome, job_id: str, code: Any) -> None:
            outcome.add(job_id, {1: None, 0: GONE, -1: "it has no job hash to run (delete it)",
                                 -2: "a workflow's step whose inputs did not all come"}.get(code, _refused(code)))

        return bulk_calls(self, job_ids, batch, lambda job_id, each: self.scripts.retry_call(
            self.keys, job_id, each, record_ms), sort, token)

    def remove_many(self, job_ids: Iterable[str], *, only_from: str | None = None, batch: int = BULK_BATCH,
                    token: str | None = None, record_ms: int = CHANGE_RECORD_MS) -> BulkOutcome:
        """`remove` each of these jobs (only while in `only_from`, when given), `batch` calls per round trip.

        A job a live worker holds is left alone, as is one no longer in `only_from` (`gone`). `token` and
        `record_ms` as for `retry_many`.
        """
        def sort(outcome: BulkOutcome, job_id: str, code: Any) -> None:
            outcome.add(job_id, {1: None, 0: GONE, -4: GONE, -3: "a worker holds it"}.get(code, _refused(code)))

        outcome = bulk_calls(self, job_ids, batch, lambda job_id, each: self.scripts.remove_call(
            self.keys, job_id, each, only_from, record_ms), sort, token)
        if outcome.done:
            deliver_handoffs(self.scripts, self.keys, now_ms())  # workflows' members: their workflows heard of it
        return outcome

    def cancel_many(self, job_ids: Iterable[str], reason: str = "", batch: int = BULK_BATCH, *,
                    token: str | None = None, record_ms: int = CHANGE_RECORD_MS) -> BulkOutcome:
        """`cancel` each of these jobs, `batch` calls per round trip; a running one is flagged (see `cancel`).

        `token` and `record_ms` as for `retry_many`.
        """
        text = f"cancelled: {reason}" if reason else "cancelled"

        def sort(outcome: BulkOutcome, job_id: str, code: Any) -> None:
            outcome.add(job_id, {1: None, 2: STOPPING, 3: GONE, 0: GONE,
                                 -1: "its key is no job hash (its id left its state)"}.get(code, _refused(code)))

        outcome = bulk_calls(self, job_ids, batch, lambda job_id, each: self.scripts.cancel_call(
            self.keys, job_id, text, now_ms(), each, record_ms), sort, token)
        if outcome.done:
            deliver_handoffs(self.scripts, self.keys, now_ms())
        return outcome

    def clean(self, state: str, older_than_ms: int, batch: int = 1000) -> int:
        """Delete jobs of `state` ("completed"/"failed") finished more than `older_than_ms` ago."""
        cutoff, cleaned = now_ms() - older_than_ms, 0
        while removed := self.scripts.clean_jobs(self.keys, state, cutoff, batch):
            cleaned += removed
        return cleaned

    def promote(self, job_id: str) -> bool:
        """Make a delayed job ready now; False when it is not delayed (any more)."""
        return self.scripts.promote_job(self.keys, validate_stored_id(job_id), now_ms())

    def cancel(self, job_id: str, reason: str = "", *, stop_running: bool = True) -> Cancel:
        """Cancel a job: it fails for good with "cancelled" (": reason", when given), and is never retried.

        A job that has not started goes to `failed` at once (Cancel.CANCELLED).
        A running one is flagged (Cancel.STOPPING): its worker sees the flag at
        its next lock renewal and stops it (see Worker), and the attempt then
        fails with the reason. A finished or unknown job is left as it is
        (Cancel.FINISHED, Cancel.NOT_FOUND). The answer is true only for the
        first two. `retry` sends a cancelled job back to wait. With
        `stop_running=False` a running job is left to finish (Cancel.RUNNING), in the same atomic call.
        """
        text = f"cancelled: {reason}" if reason else "cancelled"
        code = self.scripts.cancel_job(self.keys, validate_stored_id(job_id), text, now_ms(),
                                       stop_running=stop_running)
        if code == 1:
            deliver_handoffs(self.scripts, self.keys, now_ms())  # a workflow's member: its workflow heard of it
        return _CANCEL_CODES.get(code, Cancel.NOT_FOUND)

    def signal(self, job_id: str, name: str, payload: Any = None) -> bool:
        """Send the job the signal `name` with a JSON payload, for its `wait_for_signal(name)` (send_signal)."""
        return send_signal(self, job_id, name, payload)

    def task_rate_wait(self, name: str, max_starts: int, window_ms: int, job_id: str) -> int:
        """One start of job `job_id` of function `name`, held to `max_starts` per `window_ms` across every worker
        (spaced evenly): 0 to start now, else the ms until the start held for it (lua/taskRate-1.lua)."""
        return self.scripts.task_rate(self.keys, name, max_starts, window_ms, validate_id(job_id))

    def pause(self) -> None:
        """Stop workers from taking jobs of this queue; running jobs finish."""
        self.scripts.pause(self.keys, True)

    def resume(self) -> None:
        """Let workers take jobs again."""
        self.scripts.pause(self.keys, False)

    def is_paused(self) -> bool:
        return bool(self.client.hexists(self.keys.meta, "paused"))

    def promote_delayed(self) -> int:
        """Move due delayed jobs to wait now; workers also do this as they fetch."""
        return self.scripts.promote_delayed(self.keys, now_ms())

    def workers(self) -> list[WorkerInfo]:
        """The live workers of this queue as the workers registry has them (registry.py), oldest first."""
        return live_workers(self.client, self.keys)

    def stalled_ids(self) -> set[str]:
        """Ids currently marked as stalled (recovered or failed by the next sweep)."""
        return set(self.client.smembers(self.keys.stalled))

    def obliterate(self) -> int:
        """Delete every key of this queue (for tests and teardown); returns how many."""
        return obliterate(self)


def send_signal(queue: Queue, job_id: str, name: str, payload: Any = None) -> bool:
    """Send job `job_id` the signal `name` with a JSON `payload`, for its `wait_for_signal(name)` (docs/durable.md).

    True: the job was parked waiting for it and is back in the queue; False: it was kept, and the job takes it
    when it reaches the wait. SignalRefused when a signal of that name was sent before, the wait timed out,
    or the job has finished; JobNotFoundError for no such job. Delivery and the job's return are one call.
    """
    code = queue.scripts.signal_job(
        queue.keys, validate_stored_id(job_id), validate_name(name, "a signal's name"),
        encode_json(payload, f"the payload of signal {name!r}", defaults.MAX_RESULT_BYTES),
        max_signals=defaults.MAX_SIGNALS)
    if code in (1, 2):
        return code == 2
    if code == -1:
        raise JobNotFoundError(f"job {job_id!r} of queue {queue.name!r} does not exist")
    raise SignalRefused(f"job {job_id!r} of queue {queue.name!r}: signal {name!r} refused: " + {
        0: "a signal of that name was sent to it before",
        -3: "the job has finished",
        -4: "its wait for that signal is over (it timed out)",
        -5: f"it keeps {defaults.MAX_SIGNALS:,} signals already"}.get(code, f"code {code}"))


def obliterate(queue: Queue) -> int:
    """Delete every key of `queue`; returns how many."""
    deleted = 0
    pattern = re.sub(r"([*?\[\]\\])", r"\\\1", queue.keys.base) + "*"
    for batch in batched(queue.client.scan_iter(match=pattern, count=1000), 500):
        deleted += queue.client.delete(*batch)
    return deleted


def bulk_calls(queue: Queue, job_ids: Iterable[str], batch: int, call: Callable[[str, str], Call],
               sort: Callable[[BulkOutcome, str, Any], None], token: str | None = None) -> BulkOutcome:
    """A bulk change of `queue`: `call` (id, token) for each id, a round trip per `batch`, each with a new token
    unless `token` is given."""
    outcome, seen = BulkOutcome(), set()
    for chunk in batched(job_ids, batch):
        valid = []
        for job_id in chunk:
            try:
                job_id = validate_stored_id(job_id)
            except InvalidNameError:
                outcome.add(str(job_id), f"no job can have its id (an id may hold only {ALPHABET}, and is "
                                         "no queue key's name)")
                continue
            # A round trip's record answers one call per id: an id named again is changed once, by its first
            # mention, and found gone by the others (as a second call would find it).
            if job_id in seen:
                outcome.add(job_id, GONE)
            else:
                seen.add(job_id)
                valid.append(job_id)
        each = token or change_token()
        for job_id, code in zip(valid, queue.scripts.run_batch([call(job_id, each) for job_id in valid])):
            sort(outcome, job_id, code)
    return outcome


def _refused(code: Any) -> str:
    """Why for a reply that is no code of the script: the error Redis answered."""
    return f"Redis refused it: {code}" if isinstance(code, Exception) else f"the script answered {code!r}"


_CANCEL_CODES = {1: Cancel.CANCELLED, 2: Cancel.STOPPING, 3: Cancel.FINISHED, 4: Cancel.RUNNING}


def read_jobs(queue: Queue, job_ids: Iterable[str]) -> list[JobRead]:
    """Read these jobs' hashes in one pipeline, in order; a missing or broken one says why."""
    ids = list(job_ids)
    pipe = queue.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hgetall(queue.keys.job(job_id))
    reads = []
    for job_id, fields in zip(ids, pipe.execute(raise_on_error=False)):
        if isinstance(fields, Exception):  # a key another client overwrote
            reads.append(JobRead(job_id, None, "the job key holds another type than a hash"))
        elif not fields:
            reads.append(JobRead(job_id, None, "the job hash no longer exists in Redis"))
        else:
            reads.append(JobRead(job_id, Job.from_hash(queue.name, job_id, fields)))
    return reads


def encoded_bytes(job: EncodedJob) -> int:
    """What one encoded job sends: its name, data and options."""
    return text_bytes(job.name) + text_bytes(job.data) + text_bytes(job.opts)
