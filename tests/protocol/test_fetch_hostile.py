"""Hostile tests of moveToActive's promotion of due delayed jobs, its read of meta's `paused` and
`limitedUntil`, moveToFinished's deletion of fetch records, and pushReady, which every script that makes a
job ready again calls after taking it out of where it was, and so must never raise.

Real scripts on a real Redis: delayed scores another client wrote (±inf, huge, fractions of a ms,
exactly `now`), fetches on Redis's clock, more due jobs than one promotion moves, odd `paused` and
`limitedUntil` values, a meta or a `wait` of another type, a re-sent fetch while jobs are due, and one
finish call ending the jobs of several fetches.
"""

import math

import pytest
from redis.exceptions import ResponseError

from echomq_django.core import JobOptions, NewJob
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.scripts import Finish
from tests.helpers import fetch, finish, redis_now_ms

PROMOTE_LIMIT = 1000  # promoteDue's limit per moveToActive call


def raw_fetch(queue, token, now, count=10, *, lock_ms=30_000):
    """One moveToActive call: (the reply's raw nextDue, wait ms, [ids taken]). `now` None: Redis's clock."""
    call = queue.scripts.fetch_call(queue.keys, token, lock_ms, now, count, "w-hostile")
    [reply] = queue.scripts.run_batch([call], raise_on_error=True)
    _due, wait, jobs = queue.scripts.fetched(reply)
    return reply[0], wait, [job_id for job_id, _ in jobs]


def next_due(queue, token, now, count=10):
    """One moveToActive call: (nextDue as the worker reads it, [ids taken])."""
    call = queue.scripts.fetch_call(queue.keys, token, 30_000, now, count, "w-hostile")
    [reply] = queue.scripts.run_batch([call], raise_on_error=True)
    due, _wait, jobs = queue.scripts.fetched(reply)
    return due, [job_id for job_id, _ in jobs]


def delayed_jobs(queue, scores):
    """One delayed job per score (added with a long delay, then rescored as another client would)."""
    ids = queue.add_bulk([NewJob("later", {"n": n}, JobOptions(delay_ms=3_600_000)) for n in range(len(scores))])
    queue.client.zadd(queue.keys.delayed, dict(zip(ids, scores)), xx=True)
    return ids


def state(queue, job_id):
    return queue.get_state(job_id)


# --- delayed scores another client wrote ---------------------------------------------------------

def test_a_delayed_score_of_minus_inf_is_due_and_plus_inf_never_is(queue):
    now = now_ms()
    plain = queue.add("plain")
    never, minus, future, recent = delayed_jobs(queue, ["+inf", "-inf", now + 600_000, now - 1])
    raw, wait, taken = raw_fetch(queue, "t1", now)
    assert taken == [plain, minus, recent], "-inf is due (earliest first), +inf and the future job are not"
    assert wait == 0 and queue.scripts.fetched([raw, 0, []])[0] == now + 600_000, "nextDue: the future job"
    assert state(queue, never) == state(queue, future) == "delayed"
    # Only +inf left: the fetch (on either clock) takes nothing, and nextDue is none (the worker reads "inf" so).
    queue.client.zadd(queue.keys.delayed, {future: "+inf"}, xx=True)
    for token, clock in (("t2", now + 10**9), ("t3", None)):
        raw, wait, taken = raw_fetch(queue, token, clock)
        assert (raw, wait, taken) == ("inf", 0, [])
        assert queue.scripts.fetched([raw, 0, []])[0] is None
    assert queue.client.zcard(queue.keys.delayed) == 2


@pytest.mark.parametrize("score", [5, 999_999_999_999])
def test_a_delayed_score_with_fewer_digits_than_now_is_due(queue, score):
    """An old time another client wrote (1970, 2001): due, however its digits compare with now's as text."""
    ready = delayed_jobs(queue, [score, now_ms() + 600_000])[0]
    assert raw_fetch(queue, "t1", now_ms())[2] == [ready]
    assert raw_fetch(queue, "t2", None)[2] == []


def test_a_delayed_score_of_minus_inf_is_due_on_redis_clock_and_with_a_now_of_zero(queue):
    [minus] = delayed_jobs(queue, ["-inf"])
    assert raw_fetch(queue, "t1", 0)[2] == [minus], "nothing is earlier than -inf: due at any now"
    [minus2] = delayed_jobs(queue, ["-inf"])
    assert raw_fetch(queue, "t2", None)[1:] == (0, [minus2])
    assert queue.client.zcard(queue.keys.delayed) == 0


def test_a_delayed_job_due_exactly_now_is_promoted_and_half_a_ms_later_is_not(queue):
    now = now_ms()
    [alone] = delayed_jobs(queue, [now])
    assert next_due(queue, "t0", now) == (None, [alone]), "the earliest job, due exactly now, is due"
    exact, later, earlier, huge = delayed_jobs(queue, [now, now + 0.5, now - 0.5, 1e300])
    raw, _wait, taken = raw_fetch(queue, "t1", now)
    assert taken == [earlier, exact], "a score equal to now is due; due order"
    assert float(raw) == now + 0.5 and state(queue, later) == "delayed"
    assert next_due(queue, "t2", now + 1) == (int(1e300), [later])
    assert next_due(queue, "t3", now + 10**6) == (int(1e300), []), "a huge score is only ever a far due time"
    assert state(queue, huge) == "delayed"


def test_a_fetch_on_redis_clock_promotes_by_redis_time_not_by_the_callers(queue):
    at = redis_now_ms(queue)
    due, later = delayed_jobs(queue, [at - 50, at + 60_000])
    # A caller's clock an hour behind Redis's: nothing is due by it.
    assert next_due(queue, "t1", at - 3_600_000) == (at - 50, [])
    assert state(queue, due) == "delayed"
    # A fetch sent behind a blocking wait runs on Redis's clock (ARGV[4] ""): the job is due.
    assert next_due(queue, "t2", None) == (at + 60_000, [due])
    assert state(queue, later) == "delayed"


# --- more due jobs than one promotion moves --------------------------------------------------------

def test_more_due_jobs_than_one_promotion_moves_all_start_in_due_order_and_next_due_is_the_earliest_left(queue):
    now = now_ms()
    total = 2 * PROMOTE_LIMIT + 500
    base = now - 1_000_000
    # Due order is the reverse of the ids' order, so only the scores can give it.
    scores = [base + (total - 1 - n) for n in range(total)] + [now + 600_000]
    *due_ids, future = delayed_jobs(queue, scores)
    in_due_order = list(reversed(due_ids))

    assert next_due(queue, "t1", now, count=1) == (base + PROMOTE_LIMIT, in_due_order[:1])
    assert queue.client.llen(queue.keys.wait) == PROMOTE_LIMIT - 1
    assert queue.client.zcard(queue.keys.delayed) == total - PROMOTE_LIMIT + 1
    # The earliest left is due: the next fetch promotes again, whatever is in wait already.
    assert next_due(queue, "t2", now, count=1) == (base + 2 * PROMOTE_LIMIT, in_due_order[1:2])
    assert queue.client.llen(queue.keys.wait) == 2 * PROMOTE_LIMIT - 2
    assert next_due(queue, "t3", now, count=1) == (now + 600_000, in_due_order[2:3])
    assert queue.client.zcard(queue.keys.delayed) == 1 and state(queue, future) == "delayed"
    due, rest = next_due(queue, "t4", now, count=total)
    assert due == now + 600_000 and rest == in_due_order[3:], "every due job, in due order"


def test_exactly_one_promotions_worth_of_due_jobs_leaves_no_next_due(queue):
    now = now_ms()
    ids = delayed_jobs(queue, [now - PROMOTE_LIMIT + n for n in range(PROMOTE_LIMIT)])
    due, taken = next_due(queue, "t1", now, count=PROMOTE_LIMIT)
    assert due is None and taken == ids
    assert not queue.client.exists(queue.keys.delayed)


# --- paused and limitedUntil, read in one HMGET ----------------------------------------------------

@pytest.mark.parametrize("value", ["", "0", "no", "1"])
def test_a_paused_field_of_any_value_holds_the_queue_and_due_jobs_go_to_paused(queue, value):
    now = now_ms()
    ready = queue.add("ready")
    [due] = delayed_jobs(queue, [now - 10])
    queue.client.hset(queue.keys.meta, "paused", value)  # another client's value, the `wait` list left as it is
    raw, wait, taken = raw_fetch(queue, "t1", now)
    assert (raw, wait, taken) == (None, 0, []), f"paused={value!r} holds the queue"
    assert queue.client.lrange(queue.keys.paused, 0, -1) == [due], "promoted while paused: to `paused`"
    assert queue.client.lrange(queue.keys.wait, 0, -1) == [ready]
    assert not queue.client.exists(queue.keys.fetch_record("t1")), "a paused fetch records nothing"
    assert queue.get_job(ready).attempts_started == 0
    queue.resume()
    assert raw_fetch(queue, "t2", now)[2] == [ready, due]


@pytest.mark.parametrize(("until", "held"), [
    ("ahead", True), ("", False), ("inf", False), ("nan", False), ("soon-ish garbage", False),
    ("past", False), ("beyond the longest pause", False),
])
def test_limited_until_holds_the_queue_only_when_it_is_a_pause_the_scripts_could_have_set(queue, until, held):
    from echomq_django.core.protocol.lua import CONSTANTS

    ids = queue.add_bulk([NewJob("work") for _ in range(2)])
    at = redis_now_ms(queue)
    value = {"ahead": at + 30_000, "past": at - 1,
             "beyond the longest pause": at + CONSTANTS["MAX_PAUSE_MS"] + 60_000}.get(until, until)
    queue.client.hset(queue.keys.meta, "limitedUntil", value)
    _raw, wait, taken = raw_fetch(queue, "t1", None)
    if held:
        assert taken == [] and 29_000 < wait <= 30_000
        # Paused as well: the pause wins, and the fetch asks for no wait (the worker waits on the marker).
        queue.client.hset(queue.keys.meta, "paused", "1")
        assert raw_fetch(queue, "t2", None)[1:] == (0, [])
    else:
        assert (wait, taken) == (0, ids)


def test_a_rate_limited_queue_still_promotes_due_jobs_and_says_when_the_next_is_due(queue):
    at = redis_now_ms(queue)
    due, later = delayed_jobs(queue, [at - 5, at + 60_000])
    queue.client.hset(queue.keys.meta, "limitedUntil", at + 30_000)
    raw, wait, taken = raw_fetch(queue, "t1", None)
    assert taken == [] and 29_000 < wait <= 30_000 and int(raw) == at + 60_000
    assert queue.client.lrange(queue.keys.wait, 0, -1) == [due]
    queue.client.hdel(queue.keys.meta, "limitedUntil")
    assert raw_fetch(queue, "t2", None)[2] == [due]
    assert state(queue, later) == "delayed"


# --- a meta key of another type -------------------------------------------------------------------

def test_a_meta_of_another_type_makes_the_fetch_fail_and_changes_nothing_without_due_jobs(queue):
    ready = queue.add("ready")
    [later] = delayed_jobs(queue, [now_ms() + 600_000])
    queue.client.delete(queue.keys.meta)
    queue.client.set(queue.keys.meta, "another client's")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        raw_fetch(queue, "t1", None)
    assert queue.client.lrange(queue.keys.wait, 0, -1) == [ready]
    assert queue.client.zrange(queue.keys.delayed, 0, -1) == [later]
    assert not queue.client.exists(queue.keys.fetch_record("t1"))


def test_a_meta_of_another_type_loses_no_due_delayed_job(queue):
    """The fetch promotes before anything reads meta: ZREM from `delayed`, then pushReady's HEXISTS on meta
    raised, and Redis keeps a script's writes before an error: the job was in no state. pushReady never
    raises now."""
    [due] = delayed_jobs(queue, [now_ms() - 10])
    queue.client.delete(queue.keys.meta)
    queue.client.set(queue.keys.meta, "another client's")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        raw_fetch(queue, "t1", None)
    assert state(queue, due) in ("delayed", "wait"), "the job is in no state: it will never run"
    queue.client.delete(queue.keys.meta)  # the other client's key is removed
    assert raw_fetch(queue, "t2", None)[2] == [due]


# --- a re-sent fetch while delayed jobs are due ---------------------------------------------------

@pytest.mark.parametrize("clock", ["caller", "redis"])
def test_a_resent_fetch_while_jobs_are_due_answers_only_its_jobs_and_promotes_the_due_ones(queue, clock):
    first, second = queue.add_bulk([NewJob("ready") for _ in range(2)])
    at = redis_now_ms(queue)
    call = queue.scripts.fetch_call(queue.keys, "tok-1", 30_000, at if clock == "caller" else None, 1, "w1")
    [reply] = queue.scripts.run_batch([call], raise_on_error=True)
    assert [job_id for job_id, _ in queue.scripts.fetched(reply)[2]] == [first]
    due, later = delayed_jobs(queue, [at - 1_000, at + 600_000])
    # The reply was lost: the same call again.
    [again] = queue.scripts.run_batch([call], raise_on_error=True)
    assert [job_id for job_id, _ in queue.scripts.fetched(again)[2]] == [first], "its jobs only"
    assert queue.scripts.fetched(again)[0] == at + 600_000, "nextDue after the promotion"
    assert queue.client.lrange(queue.keys.wait, 0, -1) == [due, second], "the due job promoted, behind `second`"
    assert queue.get_job(due).attempts_started == 0 and not queue.client.exists(queue.keys.lock(due))
    assert queue.get_job(first).attempts_started == 1, "no second attempt started by the re-send"
    assert queue.client.zscore(queue.keys.marker, "0") is not None, "the promotion wakes a worker"
    assert [job_id for job_id, _ in fetch(queue, token="tok-2", count=5)] == [second, due]
    assert state(queue, later) == "delayed"


# --- one finish call ending the jobs of several fetches --------------------------------------------

def test_one_finish_of_several_fetches_deletes_each_finished_tokens_record_and_replays_answer_5(queue):
    ids = queue.add_bulk([NewJob("work", {"n": n}, JobOptions(attempts=3)) for n in range(7)])
    a, b, c, d, e, f, g = ids
    now = now_ms()
    assert raw_fetch(queue, "T1", now, 2)[2] == [a, b]
    assert raw_fetch(queue, "T2", now, 1)[2] == [c]
    assert raw_fetch(queue, "T3", now, 1)[2] == [d]  # not finished in this call: its record stays
    assert raw_fetch(queue, "T4", now, 2)[2] == [e, f]
    assert raw_fetch(queue, "T5", now, 1)[2] == [g]
    queue.client.hdel(queue.keys.job(e), "tok")  # as if the sweep had taken `e` from T4
    attempts = [
        Finish(a, "T1", True, "1"),
        Finish(c, "T2", False, "boom"),            # retried: back to wait
        Finish(e, "T4", True, "1"),                # T4 no longer owns it: -2, and nothing deleted yet
        Finish(b, "T1", True, "2"),
        Finish(a, "T1", True, "1"),                # the same attempt twice in one call
        Finish(f, "T4", True, "3"),                # T4's record goes with its first real finish
        Finish(g, "T1", True, "4"),                # T1 does not own `g`: T5's record stays
    ]
    call = queue.scripts.finish_call(queue.keys, attempts, now, default_attempts=3)
    [codes] = queue.scripts.run_batch([call], raise_on_error=True)
    assert codes == [1, 3, -2, 1, 5, 1, -2]
    exists = {token: bool(queue.client.exists(queue.keys.fetch_record(token))) for token in
              ("T1", "T2", "T3", "T4", "T5")}
    assert exists == {"T1": False, "T2": False, "T3": True, "T4": False, "T5": True}
    # The whole call again (its reply was lost): every attempt that ended answers 5 and nothing changes.
    before = {job_id: queue.client.hgetall(queue.keys.job(job_id)) for job_id in ids}
    [replayed] = queue.scripts.run_batch([call], raise_on_error=True)
    assert replayed == [5, 5, -2, 5, 5, 5, -2]
    assert {job_id: queue.client.hgetall(queue.keys.job(job_id)) for job_id in ids} == before
    assert queue.client.exists(queue.keys.fetch_record("T3")) and queue.client.exists(queue.keys.fetch_record("T5"))
    # T3's re-sent fetch is still answered with its job.
    assert raw_fetch(queue, "T3", now, 1)[2] == [d]


# --- a `now` no caller of the package sends --------------------------------------------------------

def test_a_fetch_with_a_nan_now_starts_no_job_at_time_nan(queue):
    """ARGV[4] is ms or "". Before 4b575fb a NaN reached ZRANGEBYSCORE, which refused it ("min or max is not
    a float") and the fetch changed nothing; now nothing compares it with Redis."""
    ready = queue.add("ready")
    try:
        raw_fetch(queue, "t1", math.nan)
    except ResponseError:
        pass
    processed_on, started_on = queue.client.hmget(queue.keys.job(ready), "processedOn", "startedOn")
    assert "nan" not in (processed_on, started_on), f"started at processedOn={processed_on!r}"


# --- pushReady after the job left where it was ----------------------------------------------------

def broken_meta(queue):
    queue.client.delete(queue.keys.meta)
    queue.client.set(queue.keys.meta, "another client's")


def test_a_retried_attempt_is_not_lost_when_meta_is_another_type(queue):
    """The finish took the job out of `active` before pushReady read meta."""
    job_id = queue.add("flaky", opts=JobOptions(attempts=3))
    [(taken, _)] = fetch(queue, "t1")
    broken_meta(queue)
    assert finish(queue, taken, "t1", completed=False, value="boom") == 3
    assert queue.client.lrange(queue.keys.wait, 0, -1) == [job_id]
    queue.client.delete(queue.keys.meta)
    assert [taken for taken, _ in fetch(queue, "t2")] == [job_id]


@pytest.mark.parametrize("priority", [0, 5])
def test_a_retried_attempt_goes_to_failed_with_the_reason_when_its_ready_key_is_another_type(queue, priority):
    job_id = queue.add("flaky", opts=JobOptions(attempts=3, priority=priority))
    fetch(queue, "t1")
    ready_key = queue.keys.prioritized if priority else queue.keys.wait
    queue.client.delete(ready_key)
    queue.client.set(ready_key, "another client's")
    assert finish(queue, job_id, "t1", completed=False, value="boom") == 3
    assert queue.client.zscore(queue.keys.failed, job_id) is not None  # (get_state reads the broken key too)
    kind = "sorted set" if priority else "list"
    assert queue.client.hget(queue.keys.job(job_id), "failedReason") == f"{ready_key} holds a string, not a {kind}"
    assert queue.client.llen(queue.keys.active) == 0


def test_promote_delayed_loses_no_due_job_when_meta_is_another_type(queue):
    [due] = delayed_jobs(queue, [now_ms() - 10])
    broken_meta(queue)
    queue.promote_delayed()
    assert state(queue, due) == "wait"
