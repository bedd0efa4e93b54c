"""core.inspection: its verdicts are checked against what the real sweep script then does."""

import re

import pytest

from echomq_django.core import JobOptions, NewJob
from echomq_django.core.inspection import (
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
from echomq_django.core.lua import script_source
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
