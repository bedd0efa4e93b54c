"""Pages of the jobs in one state of a queue, read straight from Redis for the admin's job browser.

A page costs a window of the state's key (LRANGE, ZRANGE), its length, and
one read per job shown, however many jobs the state holds; nothing scans the
whole key. The stalled SET has no order to window, so its pages follow an
SSCAN cursor instead of a position.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..producing.queue import Queue, read_jobs
from ..protocol.job import Job
from ..protocol.keys import LIST_STATES, STATES

# The states the browser lists: the queue's state keys, and the marks of the sweep.
BROWSABLE = (*STATES, "stalled")
MAX_PAGE = 500


@dataclass(frozen=True)
class Entry:
    """One job of a page: its hash (or why there is none) and what its place in the state says."""

    job_id: str
    job: Job | None
    problem: str | None = None  # why `job` is None
    score_ms: int | None = None  # delayed: when due; completed, failed: when finished
    lock_ttl_ms: int | None = None  # active, stalled: ms left on the lock (None: gone, -1: no expiry)


@dataclass(frozen=True)
class Page:
    """`entries` of `state`, from position `start` (stalled: from SSCAN cursor `start`) of `total` jobs."""

    state: str
    total: int
    start: int
    entries: list[Entry]
    next_start: int | None  # where the next page starts; None on the last page


def browse(queue: Queue, state: str, start: int = 0, count: int = 50) -> Page:
    """One page of the jobs in `state` (one of BROWSABLE).

    Order: wait, paused and active newest first (as they were pushed);
    prioritized in the order workers take them; delayed soonest due first;
    completed and failed most recently finished first; stalled unordered.
    """
    if state not in BROWSABLE:
        raise ValueError(f"state must be one of {', '.join(BROWSABLE)}, not {state!r}")
    if not 1 <= count <= MAX_PAGE or start < 0:
        raise ValueError(f"a page holds 1 to {MAX_PAGE} jobs from a position of 0 or more, not {count} from {start}")
    key = getattr(queue.keys, state)
    pipe = queue.client.pipeline(transaction=True)  # the window and the total from one moment
    stop = start + count - 1
    if state == "stalled":
        pipe.sscan(key, start, count=count)
        pipe.scard(key)
    elif state in LIST_STATES:
        pipe.lrange(key, start, stop)
        pipe.llen(key)
    elif state in ("prioritized", "delayed"):
        pipe.zrange(key, start, stop, withscores=True)
        pipe.zcard(key)
    else:
        pipe.zrevrange(key, start, stop, withscores=True)
        pipe.zcard(key)
    window, total = pipe.execute()
    if state == "stalled":
        cursor, ids = window
        scores: list[float | None] = [None] * len(ids)
        next_start = int(cursor) or None
    elif state in LIST_STATES:
        ids, scores = window, [None] * len(window)
        next_start = start + count if start + count < total else None
    else:
        ids, scores = [job_id for job_id, _ in window], [score for _, score in window]
        next_start = start + count if start + count < total else None
    ttls = _lock_ttls(queue, ids) if state in ("active", "stalled") else [None] * len(ids)
    entries = [
        Entry(read.job_id, read.job, read.problem,
              None if state == "prioritized" or score is None else _ms(score), ttl)
        for read, score, ttl in zip(read_jobs(queue, ids), scores, ttls)
    ]
    return Page(state, int(total), start, entries, next_start)


def _lock_ttls(queue: Queue, ids: list[str]) -> list[int | None]:
    pipe = queue.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.pttl(queue.keys.lock(job_id))
    return [None if ttl == -2 else int(ttl) for ttl in pipe.execute()]


def _ms(score: float) -> int | None:
    try:
        return int(score)
    except (OverflowError, ValueError):  # inf or nan, scored by another client
        return None


def state_size(queue: Queue, state: str) -> int:
    """How many ids `state` (one of BROWSABLE) holds now: one LLEN, ZCARD or SCARD, as a page's total."""
    if state not in BROWSABLE:
        raise ValueError(f"state must be one of {', '.join(BROWSABLE)}, not {state!r}")
    key = getattr(queue.keys, state)
    if state == "stalled":
        return int(queue.client.scard(key))
    return int(queue.client.llen(key) if state in LIST_STATES else queue.client.zcard(key))


def state_ids(queue: Queue, state: str, page: int = MAX_PAGE) -> list[str]:
    """Every id in `state` (one of BROWSABLE) now, each once, read in windows of `page` (no call reads it all).

    A bulk change takes this list first and then changes the jobs, so a job it
    sends back into the same state (a retried job that fails again) is not met
    twice. The windows are read from the end where ids arrive (a list's head,
    a sorted set's highest score), while workers and retention take ids from
    the other end: an arrival shifts the windows onto ids already read (kept
    once), a departure at the far end shifts nothing. Only an id that leaves
    from the middle meanwhile (a job finishing in active, another operator's
    change) can shift one unread id past the window; the stalled set is read
    by SSCAN, which misses nothing that stays.
    """
    if state not in BROWSABLE:
        raise ValueError(f"state must be one of {', '.join(BROWSABLE)}, not {state!r}")
    if not 1 <= page <= 10_000:
        raise ValueError(f"a window holds 1 to 10,000 ids, not {page}")
    key, client = getattr(queue.keys, state), queue.client
    seen: dict[str, None] = {}
    if state == "stalled":
        for job_id in client.sscan_iter(key, count=page):
            seen[job_id] = None
        return list(seen)
    start = 0
    while True:
        stop = start + page - 1
        window = client.lrange(key, start, stop) if state in LIST_STATES else client.zrevrange(key, start, stop)
        seen.update(dict.fromkeys(window))
        if len(window) < page:
            return list(seen)
        start += page
