"""The Lua scripts: finding them, assembling their includes, calling them.

Each script is registered once per Redis client with redis-py's
`register_script`, which sends EVALSHA and falls back to loading the script on
NOSCRIPT, so a `SCRIPT FLUSH` or a restarted Redis is invisible to callers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, MovedError, NoScriptError, ResponseError, TryAgainError

from .connection import UNREACHABLE
from .errors import JobLockedError, JobNotFoundError, LockLostError, QueueStateError
from .keys import COUNTED, LIST_STATES, SCRIPT_KEYS, QueueKeys
from .lua import script_names, script_source

# One script call: (script name, KEYS, ARGV).
Call = tuple[str, Sequence[str], Sequence[Any]]


@dataclass(frozen=True)
class Confirm:
    """Count writes as done only once `replicas` replicas have them (Redis WAIT), waiting up to `timeout_ms`."""

    replicas: int
    timeout_ms: int = 1000


# How long addJob keeps the reply of a call that generated ids, for a re-send
# after a lost reply: twice the client's own retries (connection.py) when
# Redis refuses connections. A lost reply re-sent later than that (a network
# that swallows packets for longer) can still add the jobs twice.
ADD_RECORD_MS = 30_000
# Replies that mean "this node does not own the slot (any more)": the command
# did nothing, and the cluster's map must be read again.
_ROUTING_ERRORS = (MovedError, ClusterDownError, TryAgainError)
# How long a batch keeps looking for the owner of its slot on a cluster, about
# as long as connect()'s retries wait for a failover.
_REROUTE_S = 15.0


@dataclass(frozen=True)
class Finish:
    """The end of one attempt, as moveToFinished records it."""

    job_id: str
    token: str
    completed: bool
    value: str  # the return value (JSON) when completed, the failure reason when failed
    stacktrace: str = ""
    backoff_ms: int = 0  # before a retry
    final: bool = False  # no retry whatever attempts are left
    error_class: str = ""


class Scripts:
    """The protocol's scripts registered on one client, one typed method each."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._scripts = {name: client.register_script(script_source(name)) for name in script_names()}

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = self._scripts[name]
        try:
            for _ in range(2):
                try:
                    return script(keys=list(keys), args=list(args), client=self.client)
                except NoScriptError:
                    # redis-py reloads once on NOSCRIPT; a SCRIPT FLUSH racing that reload
                    # surfaces here, and one more round settles it.
                    continue
            return script(keys=list(keys), args=list(args), client=self.client)
        except ResponseError as error:
            if "echomq wrong type" in str(error):
                raise QueueStateError(str(error).removeprefix("echomq ")) from error
            raise

    def run_batch(self, calls: Sequence[Call], *, raise_on_error: bool = False) -> list[Any]:
        """Run several script calls of one queue in one pipelined round trip; their replies in order.

        A call that failed comes back as its exception, or with
        `raise_on_error` the first such exception is raised. The calls must
        all touch one queue: on a cluster they go, in one pipeline, to the
        node that owns the queue's slot.
        """
        replies, _acked = self._send(calls, None, raise_on_error)
        return replies

    def run_confirmed(
        self, calls: Sequence[Call], confirm: Confirm | None, *, raise_on_error: bool = False,
    ) -> tuple[list[Any], int]:
        """`run_batch` followed by WAIT: (replies, how many replicas confirmed the writes).

        WAIT confirms the writes made on its own connection, and a pipeline
        is one connection, so the WAIT simply ends the pipeline. Without
        `confirm` there is no WAIT, and the count is 0.
        """
        return self._send(calls, confirm, raise_on_error)

    def _send(self, calls: Sequence[Call], confirm: Confirm | None, raise_on_error: bool) -> tuple[list[Any], int]:
        # Calls refused with NOSCRIPT (after a SCRIPT FLUSH, a restart or a
        # failover) or, on a cluster, with MOVED (the slot has a new owner) did
        # nothing, so they are sent again: after loading the script, or after
        # reading the cluster's map again.
        cluster = isinstance(self.client, RedisCluster)
        if cluster and len({self.client.keyslot(keys[0]) for _name, keys, _args in calls}) > 1:
            raise ValueError("a batch of script calls must stay within one queue (one cluster slot)")
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        acked: int | None = None  # the fewest replicas any round's writes reached
        reloads, deadline, pause = 0, time.monotonic() + _REROUTE_S, 0.05
        while pending:
            try:
                answers, round_acked = self._pipelined([calls[i] for i in pending], confirm)
            except UNREACHABLE:
                # A plain client has already retried; a cluster's pipeline to a dead
                # node has not, and a failover takes seconds: wait, look again.
                if not cluster or time.monotonic() > deadline:
                    raise
                pause = self._reread_map(pause)
                continue
            acked = round_acked if acked is None else min(acked, round_acked)
            refused = [i for i, reply in zip(pending, answers) if isinstance(reply, NoScriptError)]
            moved = [i for i, reply in zip(pending, answers) if cluster and isinstance(reply, _ROUTING_ERRORS)]
            for i, reply in zip(pending, answers):
                replies[i] = reply
            if refused and reloads < 2:
                reloads += 1
                for name in {calls[i][0] for i in refused}:
                    self.client.script_load(self._scripts[name].script)
            else:
                refused = []
            if moved and time.monotonic() < deadline:
                pause = self._reread_map(pause)
            else:
                moved = []
            pending = sorted(refused + moved)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies, acked or 0

    def _pipelined(self, calls: Sequence[Call], confirm: Confirm | None) -> tuple[list[Any], int]:
        """One pipeline of `calls`, ended by a WAIT with `confirm`: (replies, replicas the WAIT counted)."""
        client = self.client
        if isinstance(client, RedisCluster):
            # Straight to the node that owns the queue's slot: redis-py's cluster
            # pipeline refuses EVALSHA and retries a dead node without pausing,
            # which is over long before a failover is.
            client = client.get_redis_connection(client.get_node_from_key(calls[0][1][0]))
        pipe = client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
        if confirm is None:
            return pipe.execute(raise_on_error=False), 0
        pipe.execute_command("WAIT", confirm.replicas, confirm.timeout_ms)
        *answers, acked = pipe.execute(raise_on_error=False)
        return answers, acked if isinstance(acked, int) else 0

    def _reread_map(self, pause: float) -> float:
        """Pause, then ask the cluster again which node owns which slot; returns the next, longer pause."""
        time.sleep(pause)
        try:
            self.client.nodes_manager.initialize()
        except UNREACHABLE:
            pass  # the failover is still under way; the next round tries again
        return min(pause * 2, 1.0)

    def add_jobs_call(self, keys: QueueKeys, timestamp: int, jobs: Sequence[Sequence[Any]]) -> Call:
        """The addJob call for jobs given as [id or "", name, data, opts, delay_ms, priority].

        Its reply, read by `pairs`, is [(id, added), ...] in order. The call
        carries an add token of its own, so a re-send (after a lost reply)
        is answered with the first reply instead of adding the jobs again.
        """
        token = uuid.uuid4().hex
        args: list[Any] = [keys.base, timestamp, token, ADD_RECORD_MS]
        for job in jobs:
            args += job
        return ("addJob-8", keys.for_script("addJob-8", token=token), args)

    def fetch_call(
        self, keys: QueueKeys, token: str, lock_ms: int, now: int, count: int, worker_id: str,
    ) -> Call:
        """The moveToActive call that takes up to `count` ready jobs locked with `token`.

        Sent again with the same token (its reply was lost), it answers with
        the jobs the first call took and takes no others.
        """
        return ("moveToActive-9", keys.for_script("moveToActive-9", token=token),
                [keys.base, token, lock_ms, now, count, worker_id])

    @staticmethod
    def fetched(reply: list[Any]) -> tuple[int | None, list[tuple[str, list[str]]]]:
        """moveToActive's reply as (next delayed due time or None, [(id, flat job hash), ...])."""
        try:
            next_due = int(float(reply[0])) if reply[0] else None
        except (ValueError, OverflowError):  # a delayed score another client wrote (inf, nan)
            next_due = None
        return next_due, list(zip(reply[1::2], reply[2::2]))

    def move_to_active(
        self, keys: QueueKeys, token: str, lock_ms: int, now: int, count: int, worker_id: str,
    ) -> tuple[int | None, list[tuple[str, list[str]]]]:
        """Take up to `count` ready jobs locked with `token`; also the next delayed due time."""
        return self.fetched(self._run(*self.fetch_call(keys, token, lock_ms, now, count, worker_id)))

    def extend_lock(self, keys: QueueKeys, job_id: str, token: str, lock_ms: int) -> bool:
        """Renew one lock; False when the token does not own the job (any more)."""
        return self._extend(keys, [(job_id, token)], lock_ms) == [1]

    def extend_locks(self, keys: QueueKeys, held: Iterable[tuple[str, str]], lock_ms: int) -> list[str]:
        """Renew many locks, given as (job id, token) pairs, in one call; returns the ids whose ownership was lost.

        A job that its own token already finished is not lost (a renewal that raced the finish).
        """
        held = list(held)
        return [job_id for (job_id, _token), code in zip(held, self._extend(keys, held, lock_ms)) if code == -1]

    def _extend(self, keys: QueueKeys, held: Sequence[tuple[str, str]], lock_ms: int) -> list[int]:
        args: list[Any] = [keys.base, lock_ms]
        for job_id, token in held:
            args += [job_id, token]
        return [int(code) for code in self._run("extendLocks-1", keys.for_script("extendLocks-1"), args)]

    def finish_call(
        self, keys: QueueKeys, attempts: Sequence[Finish], now: int, *, default_attempts: int,
        keep_completed: tuple[int, int] = (-1, 0), keep_failed: tuple[int, int] = (-1, 0),
        keep_traces: int = 10,
    ) -> Call:
        """The moveToFinished call that ends these attempts; retention as (count, age ms) per set."""
        args: list[Any] = [keys.base, now, default_attempts, keep_traces, *keep_completed, *keep_failed]
        for a in attempts:
            args += [a.job_id, a.token, "completed" if a.completed else "failed", a.value, a.stacktrace,
                     a.backoff_ms, "1" if a.final else "0", a.error_class]
        return ("moveToFinished-10", keys.for_script("moveToFinished-10"), args)

    @staticmethod
    def finished(code: int, keys: QueueKeys, job_id: str) -> int:
        """One of moveToFinished's codes: the status (1..5), or the error it stands for raised."""
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

    def move_to_finished(
        self, keys: QueueKeys, job_id: str, token: str, now: int, *, completed: bool, value: str,
        stacktrace: str = "", default_attempts: int, backoff_ms: int = 0, keep_count: int = -1,
        keep_age_ms: int = 0, keep_traces: int = 10, final: bool = False, error_class: str = "",
    ) -> int:
        """End one attempt; returns the script's status code (1..5, see the script).

        Raises JobNotFoundError, LockLostError or QueueStateError for the error codes.
        """
        attempt = Finish(job_id, token, completed, value, stacktrace, backoff_ms, final, error_class)
        retention = (keep_count, keep_age_ms)
        [code] = self._run(*self.finish_call(keys, [attempt], now, default_attempts=default_attempts,
                                             keep_completed=retention, keep_failed=retention,
                                             keep_traces=keep_traces))
        return self.finished(code, keys, job_id)

    def move_stalled_jobs_to_wait(
        self, keys: QueueKeys, *, max_stalled_count: int, now: int, interval_ms: int,
        phase: str, cursor: int, budget: int, default_attempts: int, force: bool, lock_ms: int,
    ) -> tuple[str, int, int, int, int, int]:
        """One call of the sweep: (phase, cursor, marked, recovered, failed, unmarked).

        Phase "held": sweeps stopped for a while (Redis was away), and for
        `cursor` more ms no sweep marks or recovers anything.
        """
        reply = self._run(
            "moveStalledJobsToWait-8", keys.for_script("moveStalledJobsToWait-8"),
            [keys.base, max_stalled_count, now, interval_ms, phase, cursor, budget,
             default_attempts, "1" if force else "0", lock_ms],
        )
        return (reply[0], int(reply[1]), int(reply[2]), int(reply[3]), int(reply[4]), int(reply[5]))

    def retry_call(self, keys: QueueKeys, job_id: str) -> Call:
        """The retryJob call for one job.

        Its reply: 1 if it moved from `failed` to wait, 0 if it was not there, -1 if it has no job hash.
        """
        return ("retryJob-6", keys.for_script("retryJob-6"), [keys.base, job_id])

    def retry_job(self, keys: QueueKeys, job_id: str) -> int:
        """Move a job that is still in `failed` back to wait (codes as for `retry_call`)."""
        return int(self._run(*self.retry_call(keys, job_id)))

    def remove_job(self, keys: QueueKeys, job_id: str, only_from: str | None = None) -> bool:
        """Delete a job from every state; False if there was no such job.

        With `only_from` ("delayed", "completed" or "failed"), only a job still in
        that set is removed; otherwise nothing changes and the result is False.
        """
        sets = ("delayed", "completed", "failed")
        if only_from is not None and only_from not in sets:
            raise ValueError(f"only_from must be one of {', '.join(sets)}, not {only_from!r}")
        code = self._run(
            "removeJob-8", keys.for_script("removeJob-8"),
            [keys.base, job_id, SCRIPT_KEYS["removeJob-8"].index(only_from) + 1 if only_from else ""],
        )
        if code == -3:
            raise JobLockedError(
                f"job {job_id!r} of queue {keys.queue!r} is held by a live worker; "
                "remove it after it finishes"
            )
        return code == 1

    def clean_jobs(self, keys: QueueKeys, state: str, cutoff_ms: int, limit: int = 1000) -> int:
        """Delete up to `limit` jobs of `state` ("completed" or "failed") finished before `cutoff_ms`."""
        if state not in ("completed", "failed"):
            raise ValueError(f"only completed or failed jobs are cleaned, not {state!r}")
        return int(self._run("cleanJobs-1", keys.for_script("cleanJobs-1", state=state), [keys.base, cutoff_ms, limit]))

    def pause(self, keys: QueueKeys, paused: bool) -> int:
        """Pause or resume the queue; returns how many ready jobs were moved."""
        return int(self._run(
            "pauseQueue-5", keys.for_script("pauseQueue-5"),
            ["1" if paused else "0"],
        ))

    def promote_delayed(self, keys: QueueKeys, now: int, limit: int = 1000) -> int:
        """Move due delayed jobs to wait; returns how many."""
        return int(self._run(
            "promoteDelayed-6", keys.for_script("promoteDelayed-6"),
            [keys.base, now, limit],
        ))

    def get_counts(self, keys: QueueKeys) -> dict[str, int]:
        """Jobs per state, read atomically; `stalled` counts marked jobs (also in active)."""
        commands = ["SCARD" if state == "stalled" else "LLEN" if state in LIST_STATES else "ZCARD"
                    for state in COUNTED]
        values = self._run("getCounts-8", keys.for_script("getCounts-8"), commands)
        return dict(zip(COUNTED, (int(v) for v in values)))


def pairs(flat: Sequence[Any]) -> list[tuple[str, bool]]:
    """addJob's flat reply {id1, added1, ...} as [(id, added), ...]."""
    return [(str(job_id), bool(added)) for job_id, added in zip(flat[::2], flat[1::2])]
