"""One typed method per script: its arguments named as the script names them, its codes as exceptions.

Each script's KEYS come from core/protocol/keys.py's SCRIPT_KEYS and its ARGV from
script_argv (SCRIPT_ARGV, in the order the script reads them); the calls go
through ScriptClient (transport.py).
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import defaults
from ..errors import JobLockedError, JobNotFoundError, LockLostError, QueueStateError
from .codec import cut_text
from .keys import COUNTED, LIST_STATES, SCRIPT_KEYS, QueueKeys
from .script_args import script_argv, script_argv_each
from .transport import Call, Confirm, ScriptClient, Wait

__all__ = ["ADD_RECORD_MS", "CHANGE_RECORD_MS", "Call", "Confirm", "Finish", "Scripts", "Wait", "change_token",
           "pairs"]

# How long addJob keeps the reply of a call that generated ids or deduplicated, for a re-send
# after a lost reply: twice the client's own retries (connection.py) when
# Redis refuses connections. A lost reply re-sent later than that (a network
# that swallows packets for longer) can still add the jobs twice.
ADD_RECORD_MS = 30_000
# How long retryJob, removeJob and cancelJob keep one round trip's answers (`change:<token>`) for a re-send of
# it, after its latest call: as long as an add's record, for the same reason.
CHANGE_RECORD_MS = ADD_RECORD_MS
# The longest window of a rate limit: a day (the window's ZSET holds a member per start in it).
MAX_RATE_WINDOW_MS = 86_400_000


@dataclass(frozen=True)
class Finish:
    """The end of one attempt, as moveToFinished records it."""

    job_id: str
    token: str
    completed: bool
    value: str  # the return value (JSON) when completed, the failure reason when failed
    stacktrace: str = ""
    backoff_ms: int = 0  # before a retry; with rate_limited, the queue's pause
    final: bool = False  # no retry whatever attempts are left
    error_class: str = ""
    rate_limited: bool = False  # the job raised RateLimited: back to the queue, no attempt used
    postponed: bool = False  # the job was Postponed: to delayed for backoff_ms, no attempt used
    parked: bool = False  # a durable signal wait: `value` is the signal's name, `backoff_ms` the deadline (0: none)


@dataclass(frozen=True)
class RateLimit:
    """At most `max` jobs of a queue start in any window of `duration_ms`, across all its workers."""

    max: int
    duration_ms: int

    def __post_init__(self) -> None:
        if not (isinstance(self.max, int) and self.max >= 1 and isinstance(self.duration_ms, int)
                and 1 <= self.duration_ms <= MAX_RATE_WINDOW_MS):
            raise ValueError(f"a rate limit is a whole number of jobs >= 1 per 1 to {MAX_RATE_WINDOW_MS:,} ms "
                             f"(a day), not {self.max!r} per {self.duration_ms!r} ms")


class Scripts(ScriptClient):
    """The protocol's scripts registered on one client, one typed method each."""

    def add_jobs_call(self, keys: QueueKeys, timestamp: int, jobs: Sequence[Sequence[Any]], sent_ms: int = 0) -> Call:
        """The addJob call for jobs given as their ARGV (script_argv_each("addJob-9", ...), see Queue).

        Its reply, read by `pairs`, is [(id, added), ...] in order. The call
        carries an add token of its own, so a re-send (after a lost reply)
        is answered with the first reply instead of adding the jobs again.
        `sent_ms` > 0: each caller-given id added is recorded for that long,
        and not added again meanwhile, even once its job is gone (an outbox's send).
        """
        token = secrets.token_hex(16)
        args = script_argv("addJob-9", prefix=keys.base, timestamp=timestamp, token=token, record_ms=ADD_RECORD_MS,
                           sent_ms=sent_ms)
        for job in jobs:
            args += job
        return ("addJob-9", keys.for_script("addJob-9", token=token), args)

    def fetch_call(
        self, keys: QueueKeys, token: str, lock_ms: int, now: int | None, count: int, worker_id: str,
        metrics_minutes: int = defaults.METRICS_MINUTES, *, rate_limit: RateLimit | None = None,
        max_active: int = 0, group_max_active: int = 0,
    ) -> Call:
        """The moveToActive call that takes up to `count` ready jobs locked with `token`.

        Sent again with the same token (its reply was lost), it answers with
        the jobs the first call took and takes no others. `rate_limit`,
        `max_active` and `group_max_active` (each group's running jobs; 0: no
        cap) hold for the queue across all its workers. `now` None: Redis's
        clock (a fetch that runs after a wait, see `wait_then_run`).
        """
        rate_max, rate_window_ms = (rate_limit.max, rate_limit.duration_ms) if rate_limit else (0, 0)
        return ("moveToActive-10", keys.for_script("moveToActive-10", token=token), script_argv(
            "moveToActive-10", prefix=keys.base, token=token, lock_ms=lock_ms, now="" if now is None else now,
            count=count, worker_id=worker_id, metrics_minutes=metrics_minutes, rate_max=rate_max,
            rate_window_ms=rate_window_ms, max_active=max_active, group_max_active=group_max_active))

    @staticmethod
    def fetched(reply: list[Any]) -> tuple[int | None, int, list[tuple[str, list[str]]]]:
        """moveToActive's reply as (next delayed due time or None, wait ms, [(id, flat job hash), ...]).

        The wait is 0, or when flow control held jobs back the ms until it
        lets one start, or -1 when the queue's cap did (until a job ends).
        """
        try:
            next_due = int(float(reply[0])) if reply[0] else None
        except (ValueError, OverflowError):  # a delayed score another client wrote (inf, nan)
            next_due = None
        return next_due, int(reply[1]), list(zip(reply[4::2], reply[5::2]))

    @staticmethod
    def left_ready(reply: list[Any]) -> bool:
        """Whether a fetch may have left jobs ready (False: it took every one there was)."""
        return bool(int(reply[3]))

    @staticmethod
    def broken_keys(reply: list[Any]) -> list[str]:
        """What a fetch found broken in the queue's flow-control keys (another client's writes), a line each."""
        return list(reply[2])

    def lock_codes(self, keys: QueueKeys, held: Sequence[tuple[str, str]], lock_ms: int) -> list[int]:
        """Renew many locks, given as (job id, token) pairs, in one call; extendLocks' code per pair.

        1 renewed, 2 renewed and cancelled (stop it), 0 already finished by that token, -1 not owned.
        """
        args = script_argv("extendLocks-1", prefix=keys.base, lock_ms=lock_ms)
        for job_id, token in held:
            args += script_argv_each("extendLocks-1", job_id=job_id, token=token)
        return [int(code) for code in self._run("extendLocks-1", keys.for_script("extendLocks-1"), args)]

    def finish_call(
        self, keys: QueueKeys, attempts: Sequence[Finish], now: int, *, default_attempts: int,
        keep_completed: tuple[int, int] = (-1, 0), keep_failed: tuple[int, int] = (-1, 0),
        keep_traces: int = 10, metrics_minutes: int = defaults.METRICS_MINUTES,
    ) -> Call:
        """The moveToFinished call that ends these attempts; retention as (count, age ms) per set."""
        args = script_argv(
            "moveToFinished-10", prefix=keys.base, now=now, default_attempts=default_attempts,
            keep_traces=keep_traces, keep_completed_count=keep_completed[0], keep_completed_age_ms=keep_completed[1],
            keep_failed_count=keep_failed[0], keep_failed_age_ms=keep_failed[1], metrics_minutes=metrics_minutes)
        for a in attempts:
            args += script_argv_each(
                "moveToFinished-10", job_id=a.job_id, token=a.token,
                outcome="completed" if a.completed else "limited" if a.rate_limited
                else "postponed" if a.postponed else "parked" if a.parked else "failed",
                value=_sendable(a.value), stacktrace=_sendable(a.stacktrace), backoff_ms=a.backoff_ms,
                final="1" if a.final else "0", error_class=_sendable(a.error_class))
        return ("moveToFinished-10", keys.for_script("moveToFinished-10"), args)

    @staticmethod
    def finished(code: int, keys: QueueKeys, job_id: str) -> int:
        """One of moveToFinished's codes: the status (1..9), or the error it stands for raised."""
        if code == -1:
            raise JobNotFoundError(f"job {job_id!r} of queue {keys.queue!r} does not exist")
        if code == -2:
            raise LockLostError(
                f"job {job_id!r} of queue {keys.queue!r} is no longer owned by this worker "
                "(its lock lapsed and the sweeper recovered it); the result was discarded"
            )
        if code == -3:
            raise QueueStateError(f"the key of job {job_id!r} of queue {keys.queue!r} is not a hash")
        return int(code)

    def move_stalled_jobs_to_wait(
        self, keys: QueueKeys, *, max_stalled_count: int, now: int, interval_ms: int,
        phase: str, cursor: int, budget: int, default_attempts: int, force: bool, lock_ms: int,
        metrics_minutes: int = defaults.METRICS_MINUTES,
    ) -> tuple[str, int, int, int, int, int, list[str]]:
        """One call of the sweep: (phase, cursor, marked, recovered, failed, unmarked, repairs).

        Phase "held": sweeps stopped for a while (Redis was away), and for
        `cursor` more ms no sweep marks or recovers anything. `repairs`: a
        line for each repair of the groups' bookkeeping (another client's
        writes had left it wrong).
        """
        reply = self._run(
            "moveStalledJobsToWait-8", keys.for_script("moveStalledJobsToWait-8"),
            script_argv("moveStalledJobsToWait-8", prefix=keys.base, max_stalled_count=max_stalled_count, now=now,
                        interval_ms=interval_ms, phase=phase, cursor=cursor, budget=budget,
                        default_attempts=default_attempts, force="1" if force else "0", lock_ms=lock_ms,
                        metrics_minutes=metrics_minutes),
        )
        return (reply[0], int(reply[1]), int(reply[2]), int(reply[3]), int(reply[4]), int(reply[5]), list(reply[6]))

    def retry_call(self, keys: QueueKeys, job_id: str, token: str, record_ms: int = CHANGE_RECORD_MS) -> Call:
        """The retryJob call for one job, answered once per `token` (see `change_token`) for `record_ms`.

        Its reply: 1 if it moved from `failed` to wait, 0 if it was not there, -1 if it has no job hash,
        -2 if it is a workflow's step that failed before its inputs all came (both stay failed).
        """
        return ("retryJob-7", keys.for_script("retryJob-7", token=token),
                script_argv("retryJob-7", prefix=keys.base, job_id=job_id, record_ms=record_ms))

    def retry_job(self, keys: QueueKeys, job_id: str) -> int:
        """Move a job that is still in `failed` back to wait (codes as for `retry_call`)."""
        return int(self._run(*self.retry_call(keys, job_id, change_token())))

    def remove_call(self, keys: QueueKeys, job_id: str, token: str, only_from: str | None = None,
                    record_ms: int = CHANGE_RECORD_MS) -> Call:
        """The removeJob call for one job (see `remove_job`), answered once per `token`; its reply: 1 removed,
        0 no such job, -3 held by a live worker, -4 not in `only_from` (nothing changed in either)."""
        sets = ("delayed", "completed", "failed")
        if only_from is not None and only_from not in sets:
            raise ValueError(f"only_from must be one of {', '.join(sets)}, not {only_from!r}")
        return ("removeJob-10", keys.for_script("removeJob-10", token=token),
                script_argv("removeJob-10", prefix=keys.base, job_id=job_id,
                            only_from=SCRIPT_KEYS["removeJob-10"].index(only_from) + 1 if only_from else "",
                            record_ms=record_ms))

    def remove_job(self, keys: QueueKeys, job_id: str, only_from: str | None = None) -> bool:
        """Delete a job from every state; False if there was no such job.

        With `only_from` ("delayed", "completed" or "failed"), only a job still in
        that set is removed; otherwise nothing changes and the result is False.
        """
        code = self._run(*self.remove_call(keys, job_id, change_token(), only_from))
        if code == -3:
            raise JobLockedError(
                f"job {job_id!r} of queue {keys.queue!r} is held by a live worker; "
                "remove it after it finishes"
            )
        return bool(code == 1)

    def clean_jobs(self, keys: QueueKeys, state: str, cutoff_ms: int, limit: int = 1000) -> int:
        """Delete up to `limit` jobs of `state` ("completed" or "failed") finished before `cutoff_ms`."""
        if state not in ("completed", "failed"):
            raise ValueError(f"only completed or failed jobs are cleaned, not {state!r}")
        return int(self._run("cleanJobs-1", keys.for_script("cleanJobs-1", state=state),
                             script_argv("cleanJobs-1", prefix=keys.base, cutoff_ms=cutoff_ms, limit=limit)))

    def pause(self, keys: QueueKeys, paused: bool) -> int:
        """Pause or resume the queue; returns how many ready jobs were moved."""
        return int(self._run(
            "pauseQueue-5", keys.for_script("pauseQueue-5"),
            script_argv("pauseQueue-5", paused="1" if paused else "0"),
        ))

    def promote_delayed(self, keys: QueueKeys, now: int, limit: int = 1000) -> int:
        """Move due delayed jobs to wait; returns how many."""
        return int(self._run(
            "promoteDelayed-6", keys.for_script("promoteDelayed-6"),
            script_argv("promoteDelayed-6", prefix=keys.base, now=now, limit=limit, job_id=""),
        ))

    def promote_job(self, keys: QueueKeys, job_id: str, now: int) -> bool:
        """Make one delayed job ready now, due or not; False when it is not delayed (any more)."""
        return int(self._run("promoteDelayed-6", keys.for_script("promoteDelayed-6"),
                             script_argv("promoteDelayed-6", prefix=keys.base, now=now, limit=1, job_id=job_id))) == 1

    def cancel_call(self, keys: QueueKeys, job_id: str, reason: str, now: int, token: str,
                    record_ms: int = CHANGE_RECORD_MS, *, stop_running: bool = True) -> Call:
        """The cancelJob call for one job, answered once per `token` (its codes as for `cancel_job`);
        `stop_running=False` leaves a running job to finish (code 4).

        The reason is cut to WORKFLOW_REASON_BYTES: each job cancelled keeps it (a group's cancel, once a member).
        """
        return ("cancelJob-7", keys.for_script("cancelJob-7", token=token),
                script_argv("cancelJob-7", prefix=keys.base, job_id=job_id,
                            reason=cut_text(reason, defaults.WORKFLOW_REASON_BYTES), now=now,
                            record_ms=record_ms, running="flag" if stop_running else "leave"))

    def cancel_job(self, keys: QueueKeys, job_id: str, reason: str, now: int, *, stop_running: bool = True) -> int:
        """Cancel a job with `reason` (see lua/cancelJob-7.lua).

        1 cancelled, 2 running and flagged for its worker to stop, 3 already
        finished, 0 no such job, -1 its key is no job hash; 4 running and left to finish (`stop_running=False`).
        """
        return int(self._run(*self.cancel_call(keys, job_id, reason, now, change_token(),
                                               stop_running=stop_running)))

    def update_progress(self, keys: QueueKeys, job_id: str, token: str, progress_json: str) -> int:
        """Record a running job's progress for the attempt holding `token`.

        1 written, 0 the token does not own the job (nothing written), -1 no such job.
        """
        return int(self._run("updateProgress-1", keys.for_script("updateProgress-1", id=job_id),
                             script_argv("updateProgress-1", prefix=keys.base, job_id=job_id, token=token,
                                         progress=progress_json)))

    def task_rate(self, keys: QueueKeys, name: str, max_starts: int, window_ms: int, job_id: str) -> int:
        """One start of job `job_id` of a function with its own rate limit: 0 to start now, else the ms to wait
        (its start is held for it then; taskRate)."""
        return int(self._run("taskRate-1", keys.for_script("taskRate-1", name=name),
                             script_argv("taskRate-1", max=max_starts, window_ms=window_ms, job_id=job_id)))

    def record_step(self, keys: QueueKeys, job_id: str, token: str, name: str, kind: str, record: str, *,
                    max_steps: int, now: int, deadline: int = 0) -> list[Any]:
        """recordStep's reply for one durable step of a running job (see lua/recordStep-3.lua): [code, ...]."""
        reply = self._run("recordStep-3", keys.for_script("recordStep-3", id=job_id), script_argv(
            "recordStep-3", token=token, name=name, kind=kind, record=record, max_steps=max_steps, now=now,
            deadline=deadline))
        return list(reply)

    def read_step(self, keys: QueueKeys, job_id: str, name: str) -> str | None:
        """A durable step's record as written (None: not recorded): a read, no script."""
        value = self.client.hget(keys.steps(job_id), name)
        return None if value is None else str(value)

    def signal_job(self, keys: QueueKeys, job_id: str, name: str, payload: str, *, max_signals: int) -> int:
        """Send a job the signal `name` (signalJob-9): 2 delivered, 1 kept, or a refusal code (see the script)."""
        return int(self._run("signalJob-9", keys.for_script("signalJob-9", id=job_id), script_argv(
            "signalJob-9", prefix=keys.base, job_id=job_id, name=name, payload=payload, call_id=uuid.uuid4().hex,
            max_signals=max_signals)))

    def add_log(self, keys: QueueKeys, job_id: str, token: str, line: str, keep: int) -> int:
        """Append a line to a running job's log, keeping the newest `keep`.

        The lines kept, 0 when the token does not own the job (nothing written), -1 no such job.
        """
        return int(self._run(*self.log_call(keys, job_id, token, line, keep)))

    def log_call(self, keys: QueueKeys, job_id: str, token: str, line: str, keep: int) -> Call:
        """The addLog call for one line, with an id of its own: sent again, it appends nothing."""
        return ("addLog-2", keys.for_script("addLog-2", id=job_id),
                script_argv("addLog-2", token=token, line=line, keep=keep, call_id=uuid.uuid4().hex))

    def read_job(
        self, keys: QueueKeys, job_id: str, log_lines: int,
    ) -> tuple[str | None, list[str] | None, int, list[str]]:
        """(state, flat job hash, log lines kept, the newest `log_lines` of them (-1: all)), read in one step.

        The hash is [] when there is none, None when its key holds another type.
        """
        state, fields, kept, lines = self._run(
            "getJob-11", keys.for_script("getJob-11", id=job_id),
            script_argv("getJob-11", job_id=job_id, log_lines=log_lines, prefix=keys.base))
        return state or None, None if fields is None else list(fields), int(kept), list(lines)

    def job_state(self, keys: QueueKeys, job_id: str) -> str | None:
        """Which state holds the job (one of STATES), or None; sorted sets are asked before lists are scanned."""
        [state] = self._run("getJob-11", keys.for_script("getJob-11", id=job_id),
                            script_argv("getJob-11", job_id=job_id, log_lines="state", prefix=keys.base))
        return state or None

    def get_counts(self, keys: QueueKeys) -> dict[str, int]:
        """Jobs per state, read atomically; `stalled` counts marked jobs (also in active)."""
        commands = ["SCARD" if state == "stalled" else "LLEN" if state in LIST_STATES else "ZCARD"
                    for state in COUNTED]
        *values, grouped = self._run("getCounts-11", keys.for_script("getCounts-11"), commands)
        counts = dict(zip(COUNTED, (int(v) for v in values)))
        counts["wait"] += int(grouped)  # jobs waiting in their group's list
        return counts


def change_token() -> str:
    """A new token for one round trip of retryJob, removeJob or cancelJob calls: each of its jobs is answered once.

    Every call of the round trip carries it (one record, `change:<token>`); a
    re-send of the round trip, after its replies were lost, carries it again.
    """
    return secrets.token_hex(16)


def _sendable(text: str) -> str:
    """`text` as UTF-8 can carry it: a lone surrogate (a file name os.fsdecode kept, in an error message) as its escape.

    Such a character cannot be sent, and the finish call carrying it would fail, and with it every other
    result written in the same round trip.
    """
    return text if text.isascii() else text.encode("utf-8", "backslashreplace").decode("utf-8")


def pairs(flat: Sequence[Any]) -> list[tuple[str, bool]]:
    """addJob's flat reply {id1, added1, ...} as [(id, added), ...]."""
    return [(str(job_id), bool(added)) for job_id, added in zip(flat[::2], flat[1::2])]
