"""core.inspection: its verdicts are checked against what the real sweep script then does."""

import json
import os
import re
import uuid

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from echomq_django.core import JobOptions, NewJob, Queue
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.lua import script_source
from echomq_django.core.reading.inspection import (
    CHECKED_KEY_TYPES,
    DROP_MARK,
    FAIL,
    MARK,
    NOTHING,
    RECOVER,
    SWEEP_FIELDS,
    UNMARK,
    count_failed_older_than,
    count_failed_since,
    failed_by_rank,
    failed_count,
    failed_since,
    inspect_jobs,
    read_jobs,
)
from tests.helpers import fetch, finish, kill_lock, sweep

MAX_STALLED = 1
DEFAULT_ATTEMPTS = 2  # not core's default (3), so a verdict that ignores the sweep's default shows

# job id: (its options, what is done to it after the first sweep marked it, the verdict expected).
# The fields written are what another client (or an older version) might have left in the hash.
CASES = {
    "recovers": (JobOptions(attempts=3), {}, "recover it to wait"),
    "attempt-ceiling": (JobOptions(attempts=1), {}, "fail it: attempt ceiling (1 of 1)"),
    "stall-ceiling": (JobOptions(attempts=5), {"stc": "1"}, "fail it: stall ceiling (2 stalls, max 1)"),
    "has-priority": (JobOptions(attempts=3, priority=5), {}, "recover it to prioritized"),
    "priority-garbage": (JobOptions(attempts=3), {"pri": "x"}, "recover it to wait"),
    "atm-negative": (JobOptions(attempts=3), {"atm": "-5"}, "recover it to wait"),
    "atm-decimal": (JobOptions(attempts=3), {"atm": "1.0"}, "fail it: it cannot be retried: job field atm"),
    "atm-empty": (JobOptions(attempts=3), {"atm": ""}, "fail it: it cannot be retried: job field atm"),
    "atm-16-digits": (JobOptions(attempts=3), {"atm": "1" * 16}, "fail it: it cannot be retried"),
    "stc-spaced": (JobOptions(attempts=3), {"stc": " 1"}, "fail it: it cannot be retried: job field stc"),
    # opts: the script's default attempts when they have none; anything else but a whole number fails.
    "opts-no-attempts": (JobOptions(attempts=3), {"opts": "{}", "atm": "1"}, "fail it: attempt ceiling (2 of 2)"),
    "opts-empty": (JobOptions(attempts=3), {"opts": ""}, "recover it to wait"),
    "opts-array": (JobOptions(attempts=3), {"opts": "[1]"}, "recover it to wait"),
    "opts-bad-backoff": (JobOptions(attempts=3), {"opts": '{"attempts":5,"backoff":"x"}', "atm": "2"},
                         "recover it to wait"),
    "opts-float-attempts": (JobOptions(attempts=3), {"opts": '{"attempts":4.0}', "atm": "2"}, "recover it to wait"),
    "opts-string-attempts": (JobOptions(attempts=3), {"opts": '{"attempts":"3"}'}, "fail it: it cannot be retried"),
    "opts-null-attempts": (JobOptions(attempts=3), {"opts": '{"attempts":null}'}, "fail it: it cannot be retried"),
    "opts-true-attempts": (JobOptions(attempts=3), {"opts": '{"attempts":true}'}, "fail it: it cannot be retried"),
    "opts-half-attempts": (JobOptions(attempts=3), {"opts": '{"attempts":2.5}'}, "fail it: it cannot be retried"),
    "opts-huge-attempts": (JobOptions(attempts=3), {"opts": '{"attempts":1e999}'}, "fail it: it cannot be retried"),
    "opts-null": (JobOptions(attempts=3), {"opts": "null"}, "fail it: it cannot be retried: job field opts"),
    "opts-not-json": (JobOptions(attempts=3), {"opts": "{"}, "fail it: it cannot be retried: job field opts"),
}


def outcome(queue, job_id):
    return queue.get_state(job_id), job_id in queue.stalled_ids()


def check_against_the_sweep(queue, verdicts, before):
    """Run a real sweep and check that each job ended where its verdict said."""
    sweep(queue, max_stalled_count=MAX_STALLED, default_attempts=DEFAULT_ATTEMPTS)
    for job_id, verdict in verdicts.items():
        state_before, marked_before = before[job_id]
        expected = {
            RECOVER: (verdict.detail, False),
            FAIL: ("failed", False),
            UNMARK: ("active", False),
            MARK: ("active", True),
            DROP_MARK: (state_before, False),
            NOTHING: (state_before, marked_before),
        }[verdict.action]
        assert outcome(queue, job_id) == expected, f"{job_id}: the verdict was {verdict}"


def verdicts_of(queue, job_ids):
    jobs = inspect_jobs(queue, job_ids, max_stalled_count=MAX_STALLED, default_attempts=DEFAULT_ATTEMPTS)
    return {job.job_id: job.verdict for job in jobs}


def test_every_verdict_is_what_the_sweep_then_does(queue):
    queue.add_bulk([NewJob("work", {"n": 1}, opts, job_id) for job_id, (opts, _, _) in CASES.items()])
    queue.add_bulk([NewJob("work", None, JobOptions(attempts=3), job_id) for job_id in
                    ("lock-back", "hash-gone", "wrong-type", "lives", "lock-lapsed-later")])
    queue.add("work", job_id="waits")
    taken = [job_id for job_id, _ in fetch(queue, count=len(CASES) + 5)]
    for job_id in taken:
        if job_id not in ("lives", "lock-lapsed-later"):
            kill_lock(queue, job_id)
    sweep(queue, max_stalled_count=MAX_STALLED, default_attempts=DEFAULT_ATTEMPTS)  # marks them
    for job_id, (_, fields, _) in CASES.items():
        if fields:
            queue.client.hset(queue.keys.job(job_id), mapping=fields)
    queue.client.set(queue.keys.lock("lock-back"), "its worker came back", px=60_000)
    queue.client.delete(queue.keys.job("hash-gone"), queue.keys.job("wrong-type"))
    queue.client.set(queue.keys.job("wrong-type"), "a string")
    kill_lock(queue, "lock-lapsed-later")
    queue.client.sadd(queue.keys.stalled, "waits")  # a mark left on a job another client moved

    job_ids = [*CASES, "lock-back", "hash-gone", "wrong-type", "lives", "lock-lapsed-later", "waits"]
    before = {job_id: outcome(queue, job_id) for job_id in job_ids}
    verdicts = verdicts_of(queue, job_ids)
    for job_id, (_, _, expected) in CASES.items():
        assert str(verdicts[job_id]).startswith(expected), job_id
    assert [str(verdicts[job_id]) for job_id in job_ids[len(CASES):]] == [
        "unmark it: its lock is back", "fail it: its job hash is missing",
        "fail it: its key holds another Redis type than a hash", "nothing: not marked",
        "mark it: its lock is gone", "drop its mark: it is not active"]
    check_against_the_sweep(queue, verdicts, before)


def test_a_paused_queue_recovers_to_paused(queue):
    queue.add("work", job_id="paused-one", opts=JobOptions(attempts=3))
    fetch(queue)
    kill_lock(queue, "paused-one")
    sweep(queue)
    queue.pause()
    verdicts = verdicts_of(queue, ["paused-one"])
    assert str(verdicts["paused-one"]) == "recover it to paused"
    check_against_the_sweep(queue, verdicts, {"paused-one": outcome(queue, "paused-one")})


def test_a_lock_index_not_yet_lapsed_is_not_marked_by_the_lapsed_walk(queue):
    # The lock key went early (deleted by hand), but the lock index still times it in the future:
    # the sweep reads only lapsed ids from the index, so it does not mark the job yet.
    queue.add("work", job_id="early")
    fetch(queue)
    queue.client.delete(queue.keys.lock("early"))
    verdicts = verdicts_of(queue, ["early"])
    assert str(verdicts["early"]) == "nothing: not marked"
    check_against_the_sweep(queue, verdicts, {"early": outcome(queue, "early")})


def test_a_queue_key_of_another_type_stops_the_whole_sweep(queue):
    queue.add("work", job_id="stuck")
    fetch(queue)
    kill_lock(queue, "stuck")
    sweep(queue)
    queue.client.set(queue.keys.events, "not a stream")
    [job] = inspect_jobs(queue, ["stuck"], max_stalled_count=1, default_attempts=3)
    assert job.verdict.action == NOTHING and "holds a string, not a stream" in str(job.verdict)
    with pytest.raises(Exception, match="wrong type"):
        sweep(queue)
    assert outcome(queue, "stuck") == ("active", True)


def test_lock_ttl_and_time_in_active(queue):
    queue.add("work", job_id="running")
    fetch(queue, lock_ms=30_000)
    queue.client.hset(queue.keys.job("running"), "processedOn", "12")
    [job] = inspect_jobs(queue, ["running"], max_stalled_count=1, default_attempts=3)
    assert 29_000 < job.lock_ttl_ms <= 30_000 and job.seconds_in_active > 1e9
    kill_lock(queue, "running")
    queue.client.hset(queue.keys.job("running"), "processedOn", "inf")
    [job] = inspect_jobs(queue, ["running"], max_stalled_count=1, default_attempts=3)
    assert (job.lock_ttl_ms, job.seconds_in_active) == (None, None)
    assert inspect_jobs(queue, [], max_stalled_count=1, default_attempts=3) == []


def test_failed_set_reads(queue):
    ids = queue.add_bulk([NewJob("work", {"n": n}, JobOptions(attempts=1)) for n in range(3)])
    for job_id, _ in fetch(queue, count=3):
        finish(queue, job_id, "token-1", completed=False, value="boom")
    scores = {job_id: 1_000 * (n + 1) for n, job_id in enumerate(ids)}
    queue.client.zadd(queue.keys.failed, scores)  # as if they failed long ago, one second apart
    assert failed_count(queue) == 3 and count_failed_since(queue, 2_000) == 2
    assert [i for i, _ in failed_since(queue, 2_000)] == ids[1:]
    assert [i for i, _ in failed_since(queue, 0, newest_first=True, count=2)] == ids[:0:-1]
    assert failed_by_rank(queue, 1, 5) == [(ids[1], 2_000.0), (ids[2], 3_000.0)]
    assert count_failed_older_than(queue, 0) == 3
    assert count_failed_older_than(queue, 10**12 * 1000) == 0


def test_read_jobs_says_why_a_job_is_missing(queue):
    job_id = queue.add("work", {"x": 1})
    queue.client.set(queue.keys.job("odd"), "a string")
    present, missing, odd = read_jobs(queue, [job_id, "ghost", "odd"])
    assert present.job.data == {"x": 1} and present.problem is None
    assert missing.job is None and "no longer exists" in missing.problem
    assert odd.job is None and "another type" in odd.problem


def test_the_lists_restated_from_the_sweep_script_match_it():
    source = script_source("moveStalledJobsToWait-8")  # with its includes
    checked = re.search(r"checkKeyTypes\((\{.*?\}\}),", source, re.DOTALL).group(1)
    in_script = [(key.removesuffix("Key") or named.replace("-", "_"), kind)
                 for key, named, kind in re.findall(r'\{(?:(\w+)|prefix \.\. "([\w-]+)"), "(\w+)"', checked)]
    assert in_script == list(CHECKED_KEY_TYPES)
    hmget = re.search(r'local function recoverJob.*?redis\.pcall\("HMGET", jobKey, ([^)]*)\)', source, re.DOTALL)
    assert tuple(re.findall(r'"(\w+)"', hmget.group(1))) == SWEEP_FIELDS


# The agreement of next_sweep_verdict with the sweep script on generated cases: a few jobs per
# queue, each in any combination of the states the sweep decides on, with fields another client
# (or an older version) might have left in its hash.
# Two jobs in three have well-formed fields (so that many get as far as the ceilings), the others
# anything another client might write, each garbage value one that a rule of the sweep treats apart.
CLEAN_FIELDS = st.fixed_dictionaries({
    "atm": st.sampled_from([None, None, "-1", "0", "1", "2", "5"]),
    "stc": st.sampled_from([None, None, "0", "1", "3"]),
    "opts": st.sampled_from([None] + [json.dumps({"attempts": n}) for n in (1, 2, 4, 6, 6)]),
    "pri": st.sampled_from([None, "0", "5", "-100", "100", "-101", "101"]),  # the range's ends
    "cxl": st.none(),
    "grp": st.sampled_from([None, None, "g1", "g2"]),
})
DIRTY_FIELDS = st.fixed_dictionaries({
    "atm": st.one_of(st.none(), st.integers(-2, 6).map(str), st.sampled_from(COUNTER_GARBAGE := [
        "", "1.0", " 1", "+1", "0x10", "1e3", "x", "1" * 16, "-" + "9" * 14, "9" * 15, "not a number " * 5])),
    "stc": st.one_of(st.none(), st.integers(-2, 3).map(str), st.sampled_from(COUNTER_GARBAGE)),
    "opts": st.one_of(st.none(), st.integers(-1, 6).map(lambda n: json.dumps({"attempts": n})), st.sampled_from([
        "", "{}", "[1]", "null", "{", '"text"', "3", '{"attempts":4.0}', '{"attempts":2.5}', '{"attempts":"3"}',
        '{"attempts":null}', '{"attempts":true}', '{"attempts":1e999}', '{"attempts":1000000}',
        '{"attempts":1000001}', '{"attempts":2,"backoff":"x"}'])),
    "pri": st.one_of(st.none(), st.integers(-102, 102).map(str), st.sampled_from(
        ["", "x", "1.5", " 5", "+5", "-0", "9" * 20])),
    "cxl": st.sampled_from([None, "", "cancelled by the test"]),
    "grp": st.sampled_from([None, "g1", "", "bad name", "x" * 129, "caf\u00e9"]),
})
A_JOB = st.fixed_dictionaries({
    "hash": st.sampled_from(["fields"] * 6 + ["missing", "wrong type"]),
    "fields": st.one_of(CLEAN_FIELDS, CLEAN_FIELDS, DIRTY_FIELDS),
    "marked": st.sampled_from([True, True, False]),
    "in_active": st.sampled_from([True, True, True, False]),
    "lock": st.sampled_from([False, False, False, True]),
    # The job's time in the lock index: mostly as the scripts keep it (an active job's lock lapses there
    # when its lock key goes), else anything.
    "index": st.sampled_from(["kept", "kept", "kept", None, "lapsed", "ahead"]),
}).map(lambda job: {**job, "index": (("ahead" if job["lock"] else "lapsed") if job["in_active"] else None)
                    if job["index"] == "kept" else job["index"]})
A_QUEUE = st.fixed_dictionaries({
    "jobs": st.lists(A_JOB, min_size=2, max_size=8),  # at most 10: the sweep drops 10 stale marks a sweep
    "paused": st.booleans(),
    "max_stalled_count": st.sampled_from([0, 1, 2, 3, 3]),
    "default_attempts": st.integers(1, 4),
})


def lay_out(queue, case):
    """Write the generated case into Redis as another client would: the sweep finds it as it is."""
    keys, client, now = queue.keys, queue.client, now_ms()
    for n, job in enumerate(case["jobs"]):
        job_id = f"j{n}"
        if job["hash"] == "fields":
            fields = {name: value for name, value in job["fields"].items() if value is not None}
            client.hset(keys.job(job_id), mapping={"name": "work", **fields})
        elif job["hash"] == "wrong type":
            client.set(keys.job(job_id), "a string")
        if job["in_active"]:
            client.rpush(keys.active, job_id)
        if job["marked"]:
            client.sadd(keys.stalled, job_id)
        if job["lock"]:
            client.set(keys.lock(job_id), "its worker", px=60_000)
        if job["index"]:
            client.zadd(keys.locks, {job_id: 0 if job["index"] == "lapsed" else now + 60_000})
    if case["paused"]:
        client.hset(keys.meta, "paused", "1")
    return [f"j{n}" for n in range(len(case["jobs"]))]


def failed_reason(verdict, max_stalled_count):
    """The failedReason the sweep writes for a FAIL verdict (None: it can write none)."""
    detail = verdict.detail
    if detail == "its key holds another Redis type than a hash":
        return None
    if detail == "its job hash is missing":
        return "job hash was missing when the sweeper recovered the id"
    if detail.startswith("it cannot be retried: "):
        return "stalled, and cannot be retried: " + detail.removeprefix("it cannot be retried: ")
    if attempts := re.fullmatch(r"attempt ceiling \((\d+) of (\d+)\)", detail):
        made, ceiling = map(lua_number, attempts.groups())
        return f"job stalled and reached its attempt ceiling ({made} of {ceiling} attempts made)"
    if stalls := re.fullmatch(rf"stall ceiling \((\d+) stalls, max {max_stalled_count}\)", detail):
        made = lua_number(stalls[1])
        return f"job stalled more than max_stalled_count ({made} stalls, max_stalled_count {max_stalled_count})"
    return detail  # a cancelled job fails with the cancel's reason


def lua_number(digits):
    """A whole number as Lua writes it into a string (1e+15, not 1000000000000000)."""
    return f"{int(digits):.14g}"


def mark_walk_stays_as_it_was(case):
    """Whether the sweep's mark walk reads the lock index after its recover walk iff it did before.

    The verdict reads it as it is before the sweep (see core/reading/inspection.py): the recover walk
    takes marked lockless jobs out of `active` and the index, and drops marks (and index
    entries) of ids not in `active`, which changes the counts when the index and `active`
    disagree on those ids (only another client's writes make them disagree).
    """
    jobs = case["jobs"]
    indexed, active = sum(1 for job in jobs if job["index"]), sum(1 for job in jobs if job["in_active"])
    if not any(job["marked"] for job in jobs):  # no recover walk
        return True
    leaving = [job for job in jobs if job["marked"] and (job["in_active"] and not job["lock"] or not job["in_active"])]
    indexed_after = indexed - sum(1 for job in leaving if job["index"])
    active_after = active - sum(1 for job in leaving if job["in_active"])
    return (indexed == active) == (indexed_after == active_after)


def check_agreement(queue, case):
    """Each job's verdict, then a real sweep: each job must end where its verdict said."""
    job_ids = lay_out(queue, case)
    keys, client = queue.keys, queue.client
    before = {job_id: outcome(queue, job_id) for job_id in job_ids}
    verdicts = {job.job_id: job.verdict for job in inspect_jobs(
        queue, job_ids, max_stalled_count=case["max_stalled_count"], default_attempts=case["default_attempts"])}
    report = sweep(queue, max_stalled_count=case["max_stalled_count"], default_attempts=case["default_attempts"])
    for job_id, job in zip(job_ids, case["jobs"]):
        verdict = verdicts[job_id]
        event(verdict.action if verdict.action != FAIL else f"fail: {verdict.detail.split(':')[0].split('(')[0]}")
        said = f"{job_id}: the verdict was {verdict!s}, the sweep's {report}"
        state_before, marked_before = before[job_id]
        if verdict.action == RECOVER:
            group = verdict.detail.removeprefix("group ") if verdict.detail.startswith("group ") else None
            assert outcome(queue, job_id) == ("wait" if group else verdict.detail, False), said
            assert group is None or client.lpos(keys.group(group), job_id) is not None, said
            assert client.hget(keys.job(job_id), "atm") == str(int(job["fields"]["atm"] or 0) + 1), said
        elif verdict.action == FAIL:
            assert outcome(queue, job_id) == ("failed", False), said
            if (reason := failed_reason(verdict, case["max_stalled_count"])) is not None:
                assert client.hget(keys.job(job_id), "failedReason") == reason, said
        else:
            expected = {UNMARK: ("active", False), MARK: (state_before, True), DROP_MARK: (state_before, False),
                        NOTHING: (state_before, marked_before)}[verdict.action]
            assert outcome(queue, job_id) == expected, said


# The same cases on every run (derandomize); ECHOMQ_VERDICT_EXAMPLES=5000 searches further. 9 s on one
# Redis on a quiet machine; a Cluster on a busy one took more than the default minute.
@pytest.mark.timeout(300 * max(1, int(os.environ.get("ECHOMQ_VERDICT_EXAMPLES", "300")) // 300))
@settings(max_examples=int(os.environ.get("ECHOMQ_VERDICT_EXAMPLES", "300")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=A_QUEUE)
def test_the_verdict_agrees_with_the_sweep_on_generated_cases(redis_client, prefix, case):
    """What the admin says the next sweep will do is what the sweep script then does, case by generated case."""
    assume(mark_walk_stays_as_it_was(case))
    queue = Queue(f"v{uuid.uuid4().hex[:8]}", redis_client, prefix=prefix)
    try:
        check_agreement(queue, case)
    finally:
        queue.obliterate()
