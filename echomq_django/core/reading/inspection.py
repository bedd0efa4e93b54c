"""Reads for operators (the admin, its mirror of the failed and stalled sets), without Django.

Nothing here writes to Redis. `next_sweep_verdict` says what the next sweep
will do with a job: the sweep script's decision (lua/moveStalledJobsToWait-8.lua,
with recoverJob and the field readers of jobFields from lua/includes/) restated
in Python, rule for rule. tests/protocol/test_inspection.py runs the real script on
every case, and on generated ones, and compares the lists restated here with
the script's.

Whether the sweep marks an unmarked job depends on how its mark walk finds
lockless jobs (from the lock index, when the index holds as many ids as
`active`, or by walking `active`), which the verdict reads as it stands before
the sweep. Only after another client's writes (ids in `active` the index lacks,
or the reverse) can the recover walk change that on the way, and the verdict
of such an unmarked job be wrong.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..producing.outcomes import JobRead
from ..producing.queue import Queue, read_jobs
from ..protocol.codec import decode_stored
from ..protocol.job import MAX_COUNTER_CHARS
from ..protocol.keys import is_name
from ..protocol.options import MAX_ATTEMPTS, MAX_PRIORITY, MIN_PRIORITY
from ..protocol.times import datetime_from_ms, now_ms

__all__ = [
    "FAIL", "MARK", "NOTHING", "RECOVER", "UNMARK", "DROP_MARK",
    "JobProbe", "JobRead", "LiveJob", "SweepVerdict",
    "count_failed_older_than", "count_failed_since", "datetime_from_ms", "failed_by_rank", "failed_count",
    "failed_since", "inspect_jobs", "next_sweep_verdict", "read_jobs",
]

# What the next sweep does with a job (SweepVerdict.action).
RECOVER = "recover"      # back to wait, paused or prioritized; atm and stc + 1
FAIL = "fail"            # to failed, with a reason
UNMARK = "unmark"        # marked, but its lock is back: the mark goes, the job stays
MARK = "mark"            # active and lockless: marked now, recovered by the sweep after
DROP_MARK = "drop mark"  # marked but not active (another client moved it): the mark goes
NOTHING = "nothing"

# The fields of a job hash the sweep decides on, in the order HMGET asks for them.
SWEEP_FIELDS = ("atm", "stc", "opts", "pri", "cxl", "grp")
# The queue keys whose type the sweep checks before it writes anything (named as
# QueueKeys names them), and the type each must have: the script's `expected`
# list, which tests/protocol/test_inspection.py compares with this one.
CHECKED_KEY_TYPES = (("active", "list"), ("wait", "list"), ("paused", "list"), ("stalled", "set"),
                     ("failed", "zset"), ("meta", "hash"), ("marker", "zset"), ("prioritized", "zset"),
                     ("locks", "zset"), ("events", "stream"), ("groups", "zset"), ("group_active", "hash"),
                     ("group_waiting", "zset"), ("group_running", "hash"))
# parseCounter: plain decimal integers only, at most MAX_COUNTER_CHARS characters.
_COUNTER = re.compile(r"-?[0-9]+")


@dataclass(frozen=True)
class SweepVerdict:
    """What the next sweep will do with one job; `str()` says it in one line."""

    action: str
    detail: str = ""

    def __str__(self) -> str:
        if self.action == RECOVER:
            return f"recover it to {self.detail}"
        words = {FAIL: "fail it", UNMARK: "unmark it", MARK: "mark it", DROP_MARK: "drop its mark",
                 NOTHING: "nothing"}[self.action]
        return f"{words}: {self.detail}" if self.detail else words


@dataclass(frozen=True)
class JobProbe:
    """What Redis holds now about one job, as far as the sweep's decision goes."""

    fields: Mapping[str, str | None] | None  # SWEEP_FIELDS; None when the job key holds another type
    hash_exists: bool
    marked: bool
    in_active: bool
    lock_exists: bool
    # Whether the mark walk will look at it: the lock index covers `active` and
    # the job's lock time has passed, or the index does not cover `active`.
    lock_time_passed: bool = True
    # Whether the mark walk reads the lock index (it covers `active`) and the
    # job's time there has passed: the walk then looks at it even when it is
    # not in `active` (an entry another client left behind).
    lapsed_in_index: bool = False
    queue_paused: bool = False
    # Why the sweep of the whole queue will do nothing (a queue key of another type).
    queue_blocked: str | None = None


def _counter(raw: str | None, field: str) -> tuple[int | None, str | None]:
    """parseCounter: (value, None), or (None, reason) for a field the script refuses."""
    if raw is None:
        return 0, None
    if not _COUNTER.fullmatch(raw) or len(raw) > MAX_COUNTER_CHARS:
        return None, f"job field {field} is not an integer: {raw[:40]}"
    return int(raw), None


def _max_attempts(raw: str | None, default_attempts: int) -> tuple[int | None, str | None]:
    """parseMaxAttempts: the job's attempt ceiling from its raw opts, or (None, reason)."""
    if not raw:
        return default_attempts, None
    try:
        opts = decode_stored(raw)
    except ValueError:
        opts = None
    if isinstance(opts, list):  # cjson decodes an array to a table too, which has no "attempts"
        return default_attempts, None
    if not isinstance(opts, dict):
        return None, "job field opts is not a JSON object"
    if "attempts" not in opts:
        return default_attempts, None
    attempts = opts["attempts"]
    if (isinstance(attempts, bool) or not isinstance(attempts, (int, float))
            or isinstance(attempts, float) and not (math.isfinite(attempts) and attempts.is_integer())
            or not 1 <= attempts <= MAX_ATTEMPTS):
        return None, f"job field opts has attempts that are not a whole number from 1 to {MAX_ATTEMPTS}"
    return int(attempts), None


def _priority(raw: str | None) -> int:
    """parsePriority: the job's priority, 0 when absent or malformed."""
    if raw is None or not _COUNTER.fullmatch(raw):
        return 0
    priority = int(raw)
    return priority if MIN_PRIORITY <= priority <= MAX_PRIORITY else 0


def next_sweep_verdict(probe: JobProbe, *, max_stalled_count: int, default_attempts: int) -> SweepVerdict:
    """What the next sweep that runs (not skipped by the gate, not held) will do with this job."""
    if probe.queue_blocked:
        return SweepVerdict(NOTHING, f"the sweep of this queue stops: {probe.queue_blocked}")
    if not probe.marked:
        if probe.in_active and not probe.lock_exists and probe.lock_time_passed:
            return SweepVerdict(MARK, "its lock is gone")
        if not probe.in_active and not probe.lock_exists and probe.lapsed_in_index:
            return SweepVerdict(MARK, "it is not active, but the lock index times its lock as lapsed "
                                      "(the sweep after drops the mark)")
        return SweepVerdict(NOTHING, "not marked" if probe.in_active else "not active")
    if not probe.in_active:
        return SweepVerdict(DROP_MARK, "it is not active")
    if probe.lock_exists:
        return SweepVerdict(UNMARK, "its lock is back")
    return _recover_verdict(probe, max_stalled_count, default_attempts)


def _recover_verdict(probe: JobProbe, max_stalled_count: int, default_attempts: int) -> SweepVerdict:
    """The script's recover(id), in its order of checks."""
    if probe.fields is None:
        return SweepVerdict(FAIL, "its key holds another Redis type than a hash")
    atm, stc, opts, pri, cancel, group = (probe.fields.get(name) for name in SWEEP_FIELDS)
    if atm is None and stc is None and opts is None and not probe.hash_exists:
        return SweepVerdict(FAIL, "its job hash is missing")
    attempts_made, bad_atm = _counter(atm, "atm")
    stalls, bad_stc = _counter(stc, "stc")
    ceiling, bad_opts = _max_attempts(opts, default_attempts)
    bad = bad_atm or bad_stc or bad_opts
    if bad or attempts_made is None or stalls is None or ceiling is None:
        return SweepVerdict(FAIL, f"it cannot be retried: {bad}")
    attempts_made, stalls = attempts_made + 1, stalls + 1
    if cancel is not None:
        return SweepVerdict(FAIL, cancel)
    if attempts_made >= ceiling:
        return SweepVerdict(FAIL, f"attempt ceiling ({attempts_made} of {ceiling})")
    if stalls > max_stalled_count:
        return SweepVerdict(FAIL, f"stall ceiling ({stalls} stalls, max {max_stalled_count})")
    if group and is_name(group):  # lua/includes/groups.lua's groupOf: the same rule
        return SweepVerdict(RECOVER, f"group {group}")
    if _priority(pri) != 0:
        return SweepVerdict(RECOVER, "prioritized")
    return SweepVerdict(RECOVER, "paused" if probe.queue_paused else "wait")


@dataclass(frozen=True)
class LiveJob:
    """One job as the stalled list shows it: read from Redis now."""

    job_id: str
    lock_ttl_ms: int | None  # None: no lock; -1: a lock without expiry
    seconds_in_active: float | None  # since its current attempt started; None when unknown
    verdict: SweepVerdict


def inspect_jobs(queue: Queue, job_ids: Sequence[str], *, max_stalled_count: int,
                 default_attempts: int) -> list[LiveJob]:
    """Lock TTL, time in active and the next sweep's verdict of each job, in one round trip."""
    if not job_ids:
        return []
    keys = queue.keys
    pipe = queue.client.pipeline(transaction=False)
    for name, _type in CHECKED_KEY_TYPES:
        pipe.type(getattr(keys, name))
    pipe.hexists(keys.meta, "paused")
    pipe.zcard(keys.locks)
    pipe.llen(keys.active)
    per_job = 6
    for job_id in job_ids:
        pipe.hmget(keys.job(job_id), [*SWEEP_FIELDS, "processedOn"])
        pipe.exists(keys.job(job_id))
        pipe.pttl(keys.lock(job_id))
        pipe.sismember(keys.stalled, job_id)
        pipe.lpos(keys.active, job_id)
        pipe.zscore(keys.locks, job_id)
    replies = pipe.execute(raise_on_error=False)
    redis_now_ms = _redis_time_ms(queue.client)
    checked = len(CHECKED_KEY_TYPES)
    blocked = next((f"{getattr(keys, name)} holds a {actual}, not a {expected}"
                    for (name, expected), actual in zip(CHECKED_KEY_TYPES, replies[:checked])
                    if actual not in ("none", expected)), None)
    paused, indexed, active_length = replies[checked:checked + 3]
    index_covers_active = indexed == active_length
    now = time.time() * 1000
    jobs = []
    for position, job_id in enumerate(job_ids):
        start = checked + 3 + per_job * position
        fields, exists, ttl, marked, in_active, lock_time = replies[start:start + per_job]
        # As in the script, a job key of another type shows as an error of HMGET.
        wrong_type = isinstance(fields, Exception)
        lapsed = isinstance(lock_time, float) and lock_time <= redis_now_ms
        probe = JobProbe(
            fields=None if wrong_type else dict(zip(SWEEP_FIELDS, fields)), hash_exists=exists == 1,
            marked=marked == 1, in_active=isinstance(in_active, int), lock_exists=ttl != -2,
            lock_time_passed=lapsed or not index_covers_active, lapsed_in_index=lapsed and index_covers_active,
            queue_paused=paused == 1, queue_blocked=blocked)
        jobs.append(LiveJob(
            job_id=job_id, lock_ttl_ms=None if ttl == -2 else ttl,
            seconds_in_active=None if wrong_type else _seconds_since(fields[-1], now),
            verdict=next_sweep_verdict(probe, max_stalled_count=max_stalled_count,
                                       default_attempts=default_attempts)))
    return jobs


def _redis_time_ms(client: Any) -> int:
    seconds, microseconds = client.time()
    return int(seconds) * 1000 + int(microseconds) // 1000


def _seconds_since(started_ms: str | None, now: float) -> float | None:
    """Seconds from a job hash's ms timestamp to `now`; None when another client wrote no number there."""
    try:
        started = float(started_ms) if started_ms else math.nan
    except ValueError:
        return None
    return (now - started) / 1000 if math.isfinite(started) else None


def failed_count(queue: Queue) -> int:
    """How many jobs the failed set holds."""
    return queue.client.zcard(queue.keys.failed)


def count_failed_since(queue: Queue, since_ms: float) -> int:
    """How many failed jobs are scored (failed) at or after `since_ms`."""
    return queue.client.zcount(queue.keys.failed, since_ms, "+inf")


def count_failed_older_than(queue: Queue, older_than_ms: int) -> int:
    """How many failed jobs `Queue.clean("failed", older_than_ms)` would delete if it ran now."""
    return queue.client.zcount(queue.keys.failed, "-inf", f"({now_ms() - older_than_ms}")


def failed_since(queue: Queue, since_ms: float, *, offset: int = 0, count: int = 1000,
                 newest_first: bool = False) -> list[tuple[str, float]]:
    """(id, score) of failed jobs scored at or after `since_ms`, oldest first (or newest first)."""
    if newest_first:
        return queue.client.zrevrangebyscore(queue.keys.failed, "+inf", since_ms, start=offset, num=count,
                                             withscores=True)
    return queue.client.zrangebyscore(queue.keys.failed, since_ms, "+inf", start=offset, num=count,
                                      withscores=True)


def failed_by_rank(queue: Queue, start: int, count: int) -> list[tuple[str, float]]:
    """(id, score) of `count` failed jobs from rank `start`, oldest first."""
    return queue.client.zrange(queue.keys.failed, start, start + count - 1, withscores=True)


def jobs_gone(queue: Queue, job_ids: Sequence[str]) -> set[str]:
    """The ids among `job_ids` that have no job hash in `queue` (removed, trimmed, never added): one pipeline."""
    pipe = queue.client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.exists(queue.keys.job(job_id))
    return {job_id for job_id, found in zip(job_ids, pipe.execute()) if not found}
