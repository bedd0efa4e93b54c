"""Hostile tests of the batched clean-up of moveToFinished and moveToActive (commit 8f7c89f).

A finish call now takes its ids out of the lock index and `stalled`, and deletes their lock keys and fetch
records, in one command per 1,000 at the end of the call; a fetch enters its ids in the lock index in one ZADD
at the end; retention pops with one ZREM/ZPOPMIN and one DEL; groupRelease looks for `group-running` once per
call; dedupeRelease reads `ddk`/`ddm` only when the caller passed nothing.

Real scripts on a real Redis, no mocks: calls of more than 1,000 attempts mixing every outcome, replays, wrong
tokens, missing hashes and keys of another type, fetches of 2,500 jobs, retention removing more than 1,000,
reserved names in the finished sets, groups, the sweeper interleaved, dedupe keys, and threads racing.
"""

import random
import threading
import time

import pytest

from echomq_django.core import Dedupe, JobOptions, NewJob, RateLimit
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.scripts import Finish
from tests.helpers import kill_lock, redis_now_ms, sweep, wait_until
from tests.protocol.test_groups import consistent

CHUNK = 1000  # callInChunks' items per command


# --- helpers -----------------------------------------------------------------------------------------------------

def add_many(queue, n, **opts):
    ids = []
    for start in range(0, n, 500):
        ids += queue.add_bulk([NewJob("work", {"n": start + i}, JobOptions(**opts) if opts else None)
                               for i in range(min(500, n - start))])
    return ids


def take(queue, token, count, *, lock_ms=30_000, group_cap=0, rate_limit=None):
    call = queue.scripts.fetch_call(queue.keys, token, lock_ms, now_ms(), count, "w-batch",
                                    group_max_active=group_cap, rate_limit=rate_limit)
    [reply] = queue.scripts.run_batch([call], raise_on_error=True)
    return [job_id for job_id, _ in queue.scripts.fetched(reply)[2]]


def finish_many(queue, attempts, *, now=None, keep_completed=(-1, 0), keep_failed=(-1, 0), default_attempts=3):
    call = queue.scripts.finish_call(queue.keys, attempts, now_ms() if now is None else now,
                                     default_attempts=default_attempts, keep_completed=keep_completed,
                                     keep_failed=keep_failed)
    [codes] = queue.scripts.run_batch([call], raise_on_error=True)
    return [int(c) for c in codes]


def done(job_id, token, **kw):
    return Finish(job_id, token, True, "null", **kw)


def fail(job_id, token, **kw):
    return Finish(job_id, token, False, "boom", **kw)


def where(queue):
    """{id: [states it is in]} over every state list/set of the queue (group lists included)."""
    c, k = queue.client, queue.keys
    places = {
        "wait": c.lrange(k.wait, 0, -1), "paused": c.lrange(k.paused, 0, -1), "active": c.lrange(k.active, 0, -1),
        "delayed": c.zrange(k.delayed, 0, -1), "completed": c.zrange(k.completed, 0, -1),
        "failed": c.zrange(k.failed, 0, -1), "prioritized": c.zrange(k.prioritized, 0, -1),
        "deferred": c.zrange(k.deferred, 0, -1)}
    for key in c.scan_iter(k.base + "group:*"):
        places[key] = c.lrange(key, 0, -1)
    found: dict[str, list[str]] = {}
    for state, ids in places.items():
        for job_id in ids:
            found.setdefault(job_id, []).append(state)
    return found


def lock_keys(queue):
    return {key[len(queue.keys.base):-len(":lock")] for key in queue.client.scan_iter(queue.keys.base + "*:lock")}


def fetch_records(queue):
    return {key[len(queue.keys.base + "fetch:"):] for key in queue.client.scan_iter(queue.keys.base + "fetch:*")}


def check_invariants(queue, ids, *, live_locks=True):
    """No job lost or in two states; the lock index is exactly `active`; `stalled` only holds active ids;
    a lock key only for an active id (with `live_locks`, every active id has one)."""
    c, k = queue.client, queue.keys
    states = where(queue)
    for job_id in ids:
        assert len(states.get(job_id, [])) == 1, f"{job_id} is in {states.get(job_id)}"
    active = c.lrange(k.active, 0, -1)
    assert len(active) == len(set(active)), "an id twice in active"
    assert set(c.zrange(k.locks, 0, -1)) == set(active), "the lock index is not exactly active"
    assert c.smembers(k.stalled) <= set(active), "stalled holds ids not in active"
    locks = lock_keys(queue)
    assert locks <= set(active), f"lock keys left for finished jobs: {sorted(locks - set(active))[:5]}"
    if live_locks:
        assert locks == set(active)
    return states


def snapshot(queue):
    """Every key of the queue and its content, but the event stream and the metrics."""
    c, out = queue.client, {}
    for key in sorted(c.scan_iter(queue.keys.base + "*")):
        if key == queue.keys.events or ":metrics:" in key:
            continue
        kind = c.type(key)
        if kind == "string":
            value = c.get(key)
        elif kind == "list":
            value = c.lrange(key, 0, -1)
        elif kind == "hash":
            value = c.hgetall(key)
        elif kind == "set":
            value = sorted(c.smembers(key))
        elif kind == "zset":
            value = c.zrange(key, 0, -1, withscores=True)
        else:
            value = kind
        out[key] = (kind, value)
    return out


# --- one finish call of 2,500 mixed attempts ------------------------------------------------------------------

def test_a_finish_call_of_2500_mixed_attempts_keeps_every_invariant_and_its_replay_changes_nothing(queue):
    c, k = queue.client, queue.keys
    plain = add_many(queue, 1500)
    once = add_many(queue, 100, attempts=1)          # fail for good on their first failure
    rest = add_many(queue, 600)
    # dedupe holders among them (their keys set by hand as addJob does: ddk/ddm + dedupe:<key>)
    jobs = plain + once + rest
    assert len(jobs) == 2200
    held = {}
    for i in list(range(0, 50)) + list(range(800, 850)) + list(range(1300, 1350)) + list(range(1600, 1650)) \
            + list(range(1700, 1750)):
        c.hset(k.job(jobs[i]), mapping={"ddk": f"d{i}", "ddm": ""})
        c.set(k.base + f"dedupe:d{i}", jobs[i])
        held[i] = f"d{i}"

    assert take(queue, "A", 1000) == jobs[:1000]
    assert take(queue, "B", 1000) == jobs[1000:2000]
    assert take(queue, "C", 1000) == jobs[2000:]
    token = {j: ("A" if i < 1000 else "B" if i < 2000 else "C") for i, j in enumerate(jobs)}
    c.sadd(k.stalled, *jobs)  # every one marked by a sweep
    for j in jobs[1700:1800]:
        assert queue.cancel(j, "stop it")  # flagged while running
    for j in jobs[1800:1850]:
        c.delete(k.job(j))                 # hash gone
    for j in jobs[1850:1900]:
        c.delete(k.job(j))
        c.set(k.job(j), "not a hash")      # another client's key
    index_before = dict(c.zrange(k.locks, 0, -1, withscores=True))

    attempts, expect = [], []

    def add(attempt, code):
        attempts.append(attempt)
        expect.append(code)

    for i, j in enumerate(jobs[:2000]):
        t = token[j]
        if i < 800:
            add(done(j, t), 1)
        elif i < 1100:
            add(fail(j, t), 3)
        elif i < 1300:
            add(fail(j, t, backoff_ms=60_000), 4)
        elif i < 1500:
            add(fail(j, t, final=True), 2)
        elif i < 1600:
            add(fail(j, t), 2)
        elif i < 1700:
            add(Finish(j, t, False, "slow", backoff_ms=1, rate_limited=True), 6)
        elif i < 1800:
            add(done(j, t), 2)
        elif i < 1850:
            add(done(j, t), -1)
        elif i < 1900:
            add(done(j, t), -3)
        else:
            add(done(j, "stolen"), -2)
    for j in jobs[:300]:  # replays in the same call
        add(done(j, token[j]), 5)
    for j in jobs[300:500]:  # a wrong token on a job this call finished
        add(done(j, "bogus"), -2)
    assert len(attempts) == 2500

    codes = finish_many(queue, attempts)
    assert codes == expect

    states = check_invariants(queue, [j for j in jobs if j not in jobs[1800:1900]], live_locks=True)
    still_active = set(jobs[1800:])
    assert set(c.lrange(k.active, 0, -1)) == still_active
    assert c.smembers(k.stalled) == still_active, "the finished left stalled, the others kept their mark"
    assert dict(c.zrange(k.locks, 0, -1, withscores=True)) == {j: index_before[j] for j in still_active}
    assert lock_keys(queue) == still_active
    assert fetch_records(queue) == {"C"}, "A and B finished jobs: their records went; C finished none"
    for i, j in enumerate(jobs[:1800]):
        want = ("completed" if i < 800 else "wait" if i < 1100 else "delayed" if i < 1300 else "failed"
                if i < 1600 else "wait" if i < 1700 else "failed")
        assert states[j] == [want], (i, states[j])
        assert c.hget(k.job(j), "tok") is None
    # the limited ones went to the front (taken first), ahead of the retried
    assert c.lrange(k.wait, -100, -1) == jobs[1600:1700]  # RPUSH each: the last limited is taken first
    for i, key in held.items():
        released = i < 50 or 1300 <= i < 1350 or 1700 <= i < 1750
        assert (c.get(k.base + f"dedupe:{key}") is None) == released, (i, key)

    # The whole call re-sent (its reply was lost): every attempt it ended answers 5, nothing changes.
    before = snapshot(queue)
    again = finish_many(queue, attempts)
    assert again == [5 if e in (1, 2, 3, 4, 5, 6) else e for e in expect[:2300]] + [-2] * 200
    assert snapshot(queue) == before


def test_exactly_1000_and_1001_released_ids_leave_every_set(queue):
    """The chunk edges: 1,000 ids fill one command exactly, 1,001 need a second with one id."""
    c, k = queue.client, queue.keys
    jobs = add_many(queue, 2001)
    assert take(queue, "A", 1000) == jobs[:1000]
    assert take(queue, "B", 1001) == jobs[1000:]
    c.sadd(k.stalled, *jobs)
    assert finish_many(queue, [done(j, "A") for j in jobs[:1000]]) == [1] * 1000
    check_invariants(queue, jobs)
    assert c.scard(k.stalled) == 1001 and c.zcard(k.locks) == 1001
    assert finish_many(queue, [done(j, "B") for j in jobs[1000:]]) == [1] * 1001
    check_invariants(queue, jobs)
    assert c.exists(k.stalled, k.locks, k.active) == 0
    assert lock_keys(queue) == set() and fetch_records(queue) == set()


def test_one_call_finishing_jobs_of_1500_fetches_deletes_every_record(queue):
    """More fetch records than one DEL takes, with lock keys between them in the same list."""
    jobs = add_many(queue, 1500)
    for n in range(1500):
        assert take(queue, f"tok{n}", 1) == [jobs[n]]
    assert len(fetch_records(queue)) == 1500
    assert finish_many(queue, [done(j, f"tok{n}") for n, j in enumerate(jobs)]) == [1] * 1500
    assert fetch_records(queue) == set() and lock_keys(queue) == set()
    check_invariants(queue, jobs)


# --- a fetch of more than 1,000 -------------------------------------------------------------------------------

def test_a_fetch_of_2500_indexes_each_id_at_the_time_its_lock_lapses(queue):
    c, k = queue.client, queue.keys
    jobs = add_many(queue, 2600)
    taken = take(queue, "big", 2500, lock_ms=45_000, rate_limit=RateLimit(10_000, 60_000))
    assert taken == jobs[:2500]
    index = dict(c.zrange(k.locks, 0, -1, withscores=True))
    assert set(index) == set(taken)
    pipe = c.pipeline(transaction=False)
    for j in taken:
        pipe.pexpiretime(k.lock(j))
    expiries = pipe.execute()
    assert all(index[j] == at for j, at in zip(taken, expiries)), "index score = the lock's PXAT"
    assert len(set(index.values())) == 1
    assert set(c.zrange(k.limiter, 0, -1)) == {f"big#{j}" for j in taken}
    check_invariants(queue, jobs)
    # A sweep now reads the index (it covers active) and finds nothing lapsed.
    result = sweep(queue)
    assert (result.marked, result.recovered) == (0, 0)
    # The re-sent fetch answers with the same 2,500 and takes nothing more.
    assert take(queue, "big", 2500) == taken
    assert c.zcard(k.locks) == 2500 and c.llen(k.wait) == 100


def test_a_fetch_of_2500_with_a_lapsed_lock_index_is_swept_and_recovered(queue):
    jobs = add_many(queue, 2500)
    assert take(queue, "big", 2500, lock_ms=30_000) == jobs
    for j in jobs[::2]:
        kill_lock(queue, j)
    assert sweep(queue).marked == 1250
    assert sweep(queue).recovered == 1250
    check_invariants(queue, jobs)
    codes = finish_many(queue, [done(j, "big") for j in jobs])
    assert codes == [-2, 1] * 1250
    check_invariants(queue, jobs)
    assert queue.client.llen(queue.keys.wait) == 1250 and queue.client.zcard(queue.keys.completed) == 1250


# --- retention ------------------------------------------------------------------------------------------------

def fake_finished(queue, set_key, ids_scores):
    """Finished jobs as another run of the scripts left them: a hash, logs and inputs each, in `set_key`."""
    pipe = queue.client.pipeline(transaction=False)
    for job_id, score in ids_scores.items():
        key = queue.keys.job(job_id)
        pipe.hset(key, mapping={"name": "old", "finishedOn": score})
        pipe.rpush(key + ":logs", "line")
        pipe.hset(key + ":in", "0", "1")
    pipe.zadd(set_key, ids_scores)
    pipe.execute()


def one_finished(queue, token, completed=True, **retention):
    [job] = add_many(queue, 1)
    assert take(queue, token, 1) == [job]
    entry = done(job, token) if completed else fail(job, token, final=True)
    return job, finish_many(queue, [entry], **retention)


@pytest.mark.parametrize("completed", [True, False])
def test_a_keep_count_of_zero_removes_1000_per_call_oldest_first_and_their_keys(queue, completed):
    c, k = queue.client, queue.keys
    set_key = k.completed if completed else k.failed
    old = {f"old-{n:05d}": 1_000 + n for n in range(2600)}
    fake_finished(queue, set_key, old)
    keep = (0, 0)
    job, codes = one_finished(queue, "t1", completed, keep_completed=keep, keep_failed=keep)
    assert codes == [1 if completed else 2]
    names = sorted(old)
    assert c.zcard(set_key) == 2601 - 1000
    assert not c.exists(*[k.job(j) for j in names[:1000]])
    assert not c.exists(*[k.job(j) + ":logs" for j in names[:1000]])
    assert not c.exists(*[k.job(j) + ":in" for j in names[:1000]])
    assert c.exists(*[k.job(j) for j in names[1000:]]) == 1600
    assert c.zrange(set_key, 0, 0) == [names[1000]]
    # Two more finishes: 1000 more, then everything (the job just finished too).
    one_finished(queue, "t2", completed, keep_completed=keep, keep_failed=keep)
    job3, _ = one_finished(queue, "t3", completed, keep_completed=keep, keep_failed=keep)
    assert c.zcard(set_key) == 0
    assert not c.exists(k.job(job3)), "a keep count of 0 removes the job just finished, hash and all"
    assert lock_keys(queue) == set() and c.exists(k.locks, k.active, k.stalled) == 0


def test_retention_by_age_and_count_together_removes_at_most_1000_the_oldest(queue):
    c, k = queue.client, queue.keys
    now = now_ms()
    old = {f"aged-{n:05d}": now - 10_000_000 + n for n in range(600)}      # past the age
    young = {f"young-{n:05d}": now - 2_000 + n for n in range(1500)}       # within the age
    fake_finished(queue, k.completed, {**old, **young})
    job, codes = one_finished(queue, "t1", keep_completed=(100, 3_600_000))
    assert codes == [1]
    # 600 by age, then 400 (1000 - 600) of the oldest over the count of 100.
    left = c.zrange(k.completed, 0, -1)
    assert len(left) == 2101 - 1000
    assert left[0] == f"young-{400:05d}" and left[-1] == job
    assert c.exists(*[k.job(j) for j in old]) == 0
    assert c.exists(*[k.job(j) for j in list(young)[:400]]) == 0
    assert c.exists(*[k.job(j) for j in left]) == len(left)


def test_retention_by_age_that_dooms_1000_or_more_leaves_the_count_for_the_next_call(queue):
    c, k = queue.client, queue.keys
    now = now_ms()
    old = {f"aged-{n:05d}": now - 10_000_000 + n for n in range(1500)}
    young = {f"young-{n:05d}": now - 1_000 + n for n in range(50)}
    fake_finished(queue, k.completed, {**old, **young})
    one_finished(queue, "t1", keep_completed=(10, 3_600_000))
    assert c.zcard(k.completed) == 1551 - 1000, "1000 by age, none by count in the same call"
    assert c.zrange(k.completed, 0, 0) == [f"aged-{1000:05d}"]
    one_finished(queue, "t2", keep_completed=(10, 3_600_000))
    assert c.zcard(k.completed) == 10


def test_reserved_names_and_odd_ids_in_a_finished_set_leave_it_but_their_keys_stay(queue):
    c, k = queue.client, queue.keys
    [job] = add_many(queue, 1)
    assert take(queue, "t1", 1) == [job]
    survivor = queue.add("survivor")  # in wait: the `wait` list must survive
    c.hset(k.meta, "keepme", "1")
    c.set(k.base + "a:b", "x")
    c.set(k.base + "x{y}", "x")
    c.hset(k.base + "a", "name", "a's hash")  # the "a" of "a:b" is not the job
    odd = ["wait", "meta", "active", "completed", "locks", "marker", "id", "a:b", "x{y}", "x}", "{"]
    c.zadd(k.completed, {name: n for n, name in enumerate(odd)})
    old = {f"old-{n:05d}": 100 + n for n in range(1200)}
    fake_finished(queue, k.completed, old)
    assert finish_many(queue, [done(job, "t1")], keep_completed=(0, 1)) == [1]
    assert not set(odd) & set(c.zrange(k.completed, 0, -1)), "the odd ids left the set"
    assert c.lrange(k.wait, 0, -1) == [survivor]
    assert c.hget(k.meta, "keepme") == "1"
    assert c.get(k.base + "a:b") == "x" and c.get(k.base + "x{y}") == "x"
    assert c.hget(k.base + "a", "name") == "a's hash"
    assert c.type(k.completed) == "zset"  # not deleted as a "job" named completed
    assert int(c.get(k.id_counter)) >= 2
    assert c.zcard(k.completed) == len(odd) + 1200 + 1 - 1000
    # the next call removes the rest; the queue still works
    assert take(queue, "t2", 5) == [survivor]
    assert finish_many(queue, [done(survivor, "t2")], keep_completed=(0, 1)) == [1]
    assert c.zcard(k.completed) == 0


# --- groups ---------------------------------------------------------------------------------------------------

def add_group(queue, group, n):
    return queue.add_bulk([NewJob("work", {"n": i}, JobOptions(group=group)) for i in range(n)])


def test_a_finish_mixing_grouped_and_plain_jobs_frees_each_capped_group_and_wakes_a_worker(queue):
    c, k = queue.client, queue.keys
    plain = queue.add_bulk([NewJob("work") for _ in range(3)])
    a = add_group(queue, "ga", 3)
    b = add_group(queue, "gb", 3)
    d = add_group(queue, "gd", 1)
    taken = take(queue, "t1", 10, group_cap=1)
    assert set(taken) == set(plain) | {a[0], b[0], d[0]}
    assert take(queue, "t2", 10, group_cap=1) == []
    consistent(queue)
    c.delete(k.marker)
    # The first attempt of the call is a plain job (groupRelease's first look), groups in between, a limited
    # grouped job (back at the front of its list) and a wrong token on a grouped one (keeps its slot).
    codes = finish_many(queue, [done(plain[0], "t1"), fail(a[0], "t1"), done(plain[1], "t1"),
                                Finish(b[0], "t1", False, "slow", backoff_ms=1, rate_limited=True),
                                done(d[0], "nope"), done(plain[2], "t1")])
    assert codes == [1, 3, 1, 6, -2, 1]
    consistent(queue)
    assert c.hgetall(k.group_running) == {d[0]: "gd"}
    assert c.hgetall(k.group_active) == {"gd": "1"}
    assert c.zscore(k.marker, "0") is not None, "a worker is woken for the freed groups"
    assert {"ga", "gb"} <= set(c.zrange(k.groups, 0, -1))
    check_invariants(queue, plain + a + b + d)
    until = int(c.hget(k.meta, "limitedUntil"))  # the limited job's pause (1 ms), on Redis's clock
    assert wait_until(lambda: redis_now_ms(queue) > until, 10), "Redis's clock passes the pause"
    again = take(queue, "t3", 10, group_cap=1)
    assert sorted(again) == sorted([a[1], b[0]]), "each freed group gives its next job (b's limited one first)"
    assert finish_many(queue, [done(d[0], "t1")]) == [1]
    assert c.zscore(k.marker, "0") is not None
    assert take(queue, "t4", 10, group_cap=1) == []  # gd had one job; ga/gb at cap
    consistent(queue)


def test_a_finish_of_1200_grouped_jobs_in_one_call_releases_every_slot(queue):
    c, k = queue.client, queue.keys
    ids = []
    for g in range(12):
        ids += add_group(queue, f"g{g}", 100)
    ids += queue.add_bulk([NewJob("work") for _ in range(300)])
    taken = take(queue, "t1", 2000)
    assert len(taken) == 1500
    assert c.hlen(k.group_running) == 1200
    codes = finish_many(queue, [done(j, "t1") if n % 3 else fail(j, "t1") for n, j in enumerate(taken)])
    assert codes == [1 if n % 3 else 3 for n in range(1500)]
    consistent(queue)
    assert c.exists(k.group_running, k.group_active) == 0
    check_invariants(queue, ids)


# --- the sweeper interleaved --------------------------------------------------------------------------------

def test_finishes_interleaved_with_sweeps_leave_the_index_and_marks_exact(queue):
    c, k = queue.client, queue.keys
    jobs = add_many(queue, 1500)
    assert take(queue, "T", 1500) == jobs
    dead = jobs[:1200]
    for j in dead:
        kill_lock(queue, j)
    assert sweep(queue).marked == 1200
    # 700 of the marked ones finish before the next sweep (their worker was alive after all), with 100 that were
    # never marked.
    late = dead[:700]
    codes = finish_many(queue, [done(j, "T") for j in late + jobs[1200:1300]])
    assert codes == [1] * 800
    check_invariants(queue, jobs, live_locks=False)
    assert c.smembers(k.stalled) == set(dead[700:])
    result = sweep(queue)
    assert (result.recovered, result.failed) == (500, 0)
    check_invariants(queue, jobs, live_locks=False)
    # Their worker's late finish: lock lost; the sweep's own recovery is not undone.
    assert finish_many(queue, [done(j, "T") for j in dead[700:]]) == [-2] * 500
    assert finish_many(queue, [done(j, "T") for j in jobs[1300:]]) == [1] * 200
    states = check_invariants(queue, jobs)
    assert sum(1 for j in jobs if states[j] == ["wait"]) == 500
    assert c.exists(k.active, k.locks, k.stalled) == 0


# --- dedupe ---------------------------------------------------------------------------------------------------

def dedupe_value(queue, key):
    return queue.client.get(queue.keys.base + "dedupe:" + key)


def test_dedupe_keys_are_released_by_every_end_in_one_call_and_kept_otherwise(queue):
    jobs = {}
    for name, opts in (("ok", {}), ("retry", {}), ("final", {}), ("once", {"attempts": 1}),
                       ("limited", {}), ("cancelled", {}), ("throttle", {}), ("plain", {})):
        dedupe = None if name == "plain" else Dedupe(name, ttl_ms=60_000) if name == "throttle" else Dedupe(name)
        jobs[name] = queue.add("work", opts=JobOptions(**opts), dedupe=dedupe)
    taken = take(queue, "t", 20)
    assert sorted(taken) == sorted(jobs.values())
    assert queue.cancel(jobs["cancelled"], "no")
    # A key held by another job: "plain" (no key of its own) must not release it, nor must "ok" if the key
    # changed holder.
    queue.client.set(queue.keys.base + "dedupe:other", jobs["plain"])
    codes = finish_many(queue, [
        done(jobs["ok"], "t"), fail(jobs["retry"], "t"), fail(jobs["final"], "t", final=True),
        fail(jobs["once"], "t"), Finish(jobs["limited"], "t", False, "x", backoff_ms=1, rate_limited=True),
        done(jobs["cancelled"], "t"), done(jobs["throttle"], "t"), done(jobs["plain"], "t")])
    assert codes == [1, 3, 2, 2, 6, 2, 1, 1]
    assert dedupe_value(queue, "ok") is None
    assert dedupe_value(queue, "retry") == jobs["retry"], "a retried job keeps its key"
    assert dedupe_value(queue, "final") is None and dedupe_value(queue, "once") is None
    assert dedupe_value(queue, "limited") == jobs["limited"]
    assert dedupe_value(queue, "cancelled") is None
    assert dedupe_value(queue, "throttle") == jobs["throttle"], "a ttl key stays until it expires"
    assert dedupe_value(queue, "other") == jobs["plain"], "a job with no key releases none"


def test_a_dedupe_key_taken_over_by_another_job_is_not_released_by_the_first(queue):
    first = queue.add("work", dedupe=Dedupe("k"))
    assert take(queue, "t", 1) == [first]
    queue.client.set(queue.keys.base + "dedupe:k", "someone-else")
    assert finish_many(queue, [done(first, "t")]) == [1]
    assert dedupe_value(queue, "k") == "someone-else"


def test_dedupe_keys_are_released_at_cancel_expiry_and_sweep_failure(queue):
    waiting = queue.add("work", dedupe=Dedupe("cancel-me"))
    assert queue.cancel(waiting, "no")
    assert dedupe_value(queue, "cancel-me") is None

    expired = queue.add("work", opts=JobOptions(expires_ms=1), dedupe=Dedupe("expire-me"),
                        timestamp_ms=now_ms() - 60_000)
    assert take(queue, "t0", 5) == []
    assert queue.get_state(expired) == "failed" and dedupe_value(queue, "expire-me") is None

    stalled = queue.add("work", opts=JobOptions(attempts=1), dedupe=Dedupe("stall-me"))
    assert take(queue, "t1", 5) == [stalled]
    kill_lock(queue, stalled)
    sweep(queue)
    assert sweep(queue).failed == 1
    assert dedupe_value(queue, "stall-me") is None
    # A job with no key of its own failing in a sweep releases nothing.
    lone = queue.add("work", opts=JobOptions(attempts=1))
    queue.client.set(queue.keys.base + "dedupe:foreign", lone)
    assert take(queue, "t2", 5) == [lone]
    kill_lock(queue, lone)
    sweep(queue)
    assert sweep(queue).failed == 1
    assert dedupe_value(queue, "foreign") == lone


def test_a_removed_job_whose_key_is_another_type_releases_nothing_and_does_not_raise(queue):
    job = queue.add("work", dedupe=Dedupe("r"))
    queue.client.delete(queue.keys.job(job))
    queue.client.set(queue.keys.job(job), "string")
    assert queue.remove(job)
    assert dedupe_value(queue, "r") == job  # its hash is gone: nothing names the key (a free key, by dedupeHolder)


# --- concurrency ----------------------------------------------------------------------------------------------

@pytest.mark.timeout(180)  # its own deadline is 60 s
def test_workers_and_a_sweeper_racing_on_one_queue_lose_no_job_and_keep_the_index_exact(queue):
    c, k = queue.client, queue.keys
    total = 1200
    jobs = []
    for n in range(0, total, 300):
        batch = []
        for i in range(n, n + 300):
            group = f"g{i % 5}" if i % 3 == 0 else ""
            dedupe = Dedupe(f"d{i}") if i % 7 == 0 else None
            batch.append(NewJob("work", {"i": i}, JobOptions(attempts=2 + i % 2, group=group), dedupe=dedupe))
        jobs += queue.add_bulk(batch)
    stop = threading.Event()
    completed_codes: dict[str, int] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(seed):
        rnd = random.Random(seed)
        n = 0
        try:
            while not stop.is_set():
                n += 1
                token = f"w{seed}-{n}"
                taken = take(queue, token, rnd.randint(1, 80), lock_ms=150, group_cap=2)
                if not taken:
                    time.sleep(0.005)
                    continue
                if rnd.random() < 0.1:
                    continue  # this worker "died": the sweeper recovers its jobs
                if rnd.random() < 0.15:
                    time.sleep(0.3)  # its locks lapse meanwhile
                attempts = []
                for j in taken:
                    roll = rnd.random()
                    if roll < 0.6:
                        attempts.append(done(j, token))
                    elif roll < 0.8:
                        attempts.append(fail(j, token))
                    elif roll < 0.9:
                        attempts.append(fail(j, token, backoff_ms=rnd.choice([0, 20])))
                    else:
                        attempts.append(Finish(j, token, False, "slow", backoff_ms=1, rate_limited=True))
                    if rnd.random() < 0.05:
                        attempts.append(attempts[-1])  # a replay inside the call
                rnd.shuffle(attempts)
                codes = finish_many(queue, attempts)
                with lock:
                    for a, code in zip(attempts, codes):
                        assert code in (1, 2, 3, 4, 5, 6, -2), (a, code)
                        if code == 1:
                            assert a.job_id not in completed_codes, f"{a.job_id} completed twice"
                            completed_codes[a.job_id] = 1
        except BaseException as error:  # reported by the test
            errors.append(error)

    def sweeper():
        try:
            while not stop.is_set():
                sweep(queue, max_stalled_count=1, interval_ms=1_000)
                queue.promote_delayed()
                time.sleep(0.03)
        except BaseException as error:
            errors.append(error)

    def canceller():
        rnd = random.Random(99)
        try:
            while not stop.is_set():
                queue.cancel(rnd.choice(jobs), "cancelled")
                time.sleep(0.01)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(s,), daemon=True) for s in range(4)]
    threads += [threading.Thread(target=sweeper, daemon=True), threading.Thread(target=canceller, daemon=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not errors:
        if c.zcard(k.completed) + c.zcard(k.failed) == total:
            break
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(20)
    assert not errors, errors
    finished = set(c.zrange(k.completed, 0, -1)) | set(c.zrange(k.failed, 0, -1))
    assert len(finished) == total, f"{total - len(finished)} jobs not finished: {where(queue)}"
    states = check_invariants(queue, jobs, live_locks=False)
    assert set(completed_codes) <= set(c.zrange(k.completed, 0, -1))
    assert c.exists(k.active, k.locks, k.stalled) == 0
    assert c.exists(k.group_running, k.group_active) == 0
    consistent(queue)
    assert not list(c.scan_iter(k.base + "dedupe:*")), "every dedupe key was released"
    assert all(len(s) == 1 for s in states.values())


# --- a finish call that raises halfway ------------------------------------------------------------------------

def test_a_step_whose_deps_another_client_broke_fails_and_the_finish_ends_every_job(queue):
    """A workflow edge to a deferred step whose `deps` another client made no integer: the member's finish
    must not raise (Redis keeps a script's writes before an error), the step fails with the reason, and every
    job of the call is ended with nothing left in the lock index, `stalled`, or their lock keys."""
    import json

    c, k = queue.client, queue.keys
    first = add_many(queue, 5)
    member = queue.add("member")
    c.hset(k.job(member), "nxt", json.dumps([[k.base, "step", "0", "r"]]))
    c.hset(k.job("step"), mapping={"name": "step", "deps": "not a number"})
    c.zadd(k.deferred, {"step": 1})
    assert take(queue, "t", 10) == first + [member]
    c.sadd(k.stalled, *first, member)
    call = queue.scripts.finish_call(k, [Finish(j, "t", True, "null") for j in first + [member]], now_ms(),
                                     default_attempts=3)
    [codes] = queue.scripts.run_batch([call], raise_on_error=True)
    assert codes == [1] * 6
    assert queue.get_state("step") == "failed" and "deps" in queue.get_job("step").failed_reason
    ended = set(first) | {member}
    assert ended <= set(c.zrange(k.completed, 0, -1))
    assert not c.lrange(k.active, 0, -1) and not c.zrange(k.locks, 0, -1) and not c.smembers(k.stalled)
    assert not ended & lock_keys(queue) and not c.exists(k.fetch_record("t"))


def test_jobs_a_finish_call_ended_before_a_workflow_delivery_raised_leave_nothing_behind(queue):
    """A delivery can still raise on a key another client broke (the hand-off list of another type, for an
    edge to another queue). Redis keeps a script's writes before an error: the jobs the call ended before the
    member, and the member itself, are out of `active` and in `completed`, so they must be out of the lock
    index and `stalled` too, with their lock keys gone (what a call removes at its end is removed before each
    delivery)."""
    import json

    from redis.exceptions import ResponseError

    c, k = queue.client, queue.keys
    first = add_many(queue, 5)
    member = queue.add("member")
    c.hset(k.job(member), "nxt", json.dumps([["emq:{elsewhere}:", "step", "0", "r"]]))
    c.set(k.handoff, "another client's")
    assert take(queue, "t", 10) == first + [member]
    c.sadd(k.stalled, *first, member)
    call = queue.scripts.finish_call(k, [Finish(j, "t", True, "null") for j in first + [member]], now_ms(),
                                     default_attempts=3)
    with pytest.raises(ResponseError):
        queue.scripts.run_batch([call], raise_on_error=True)
    ended = set(first) | {member}
    assert ended <= set(c.zrange(k.completed, 0, -1)), "the jobs before the error were ended"
    assert not ended & set(c.lrange(k.active, 0, -1))
    assert not ended & set(c.zrange(k.locks, 0, -1)), "ended jobs left in the lock index"
    assert not ended & c.smembers(k.stalled), "ended jobs left marked stalled"
    assert not ended & lock_keys(queue), "ended jobs' lock keys left behind"


def test_a_lock_index_of_another_type_strands_no_fetched_job(queue):
    """The taken ids enter the lock index in one ZADD at the end of a fetch: a lock index another client made
    another type must refuse the fetch before it takes anything, or every job moved to `active` and locked
    would be held by a reply nobody reads (no fetch record either), each stalling and losing an attempt."""
    from redis.exceptions import ResponseError

    c, k = queue.client, queue.keys
    add_many(queue, 50)
    c.set(k.locks, "another client's")
    with pytest.raises(ResponseError):
        take(queue, "t", 50)
    assert c.llen(k.active) == 0, f"{c.llen(k.active)} jobs taken by a fetch that answered an error"
