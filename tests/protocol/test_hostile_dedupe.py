"""Hostile checks of issue 28's dedupe, debounce, expiry and result TTL at the protocol level."""

import json

import pytest

from echomq_django.core import Dedupe, JobOptions, NewJob, PayloadError
from echomq_django.core.producing.queue import now_ms
from tests.helpers import fetch, finish, finish_attempt, sweep, take_jobs


def live(queue) -> int:
    counts = queue.counts()
    return counts["wait"] + counts["delayed"] + counts["active"] + counts.get("prioritized", 0)


def test_a_resent_debounce_add_after_its_job_started_adds_no_second_job(queue):
    # A debounce add merged into the pending job (its data v2 will run), but its reply was lost: redis-py sends
    # the same call again. If the job started meanwhile (a short window), the re-send must not add v2 again.
    first = queue.add("x", {"v": 1}, dedupe=Dedupe("d", debounce_ms=60_000))
    call = queue.scripts.add_jobs_call(queue.keys, now_ms(),
                                       [queue.encode(NewJob("x", {"v": 2}, dedupe=Dedupe("d", debounce_ms=60_000)))])
    assert queue.scripts.run_batch([call], raise_on_error=True)[0] == [first, 0]
    assert queue.promote(first)
    [(taken, fields)] = fetch(queue)
    assert taken == first and json.loads(fields["data"]) == {"v": 2}
    again = queue.scripts.run_batch([call], raise_on_error=True)[0]
    assert again == [first, 0], "the re-send of one add created a second job with the same data"
    assert live(queue) == 1


def test_a_resent_dedupe_add_after_the_holder_ended_adds_nothing(queue):
    first = queue.add("x", dedupe=Dedupe("k"))
    call = queue.scripts.add_jobs_call(queue.keys, now_ms(), [queue.encode(NewJob("x", dedupe=Dedupe("k")))])
    assert queue.scripts.run_batch([call], raise_on_error=True)[0] == [first, 0]
    [(taken, _)] = fetch(queue)
    finish(queue, taken, "token-1")
    again = queue.scripts.run_batch([call], raise_on_error=True)[0]
    assert again == [first, 0], "a re-sent add must answer as the first send did, not add a job"
    assert live(queue) == 0


def test_a_debounce_add_that_pushes_the_start_back_also_pushes_the_expiry(queue):
    # Each add of a debounced job carries its own expiry (a job not started within 3 s of its enqueue never
    # starts). The first add's expiry is almost over; a later add pushes the start back a window: the job
    # must run with the later add's data by the later add's expiry, not fail "expired" and lose both adds.
    dedupe = Dedupe("d", debounce_ms=1000)
    first = queue.add("x", {"v": 1}, opts=JobOptions(expires_ms=3000), dedupe=dedupe,
                      timestamp_ms=now_ms() - 2800)
    assert queue.add("x", {"v": 2}, opts=JobOptions(expires_ms=3000), dedupe=dedupe) == first
    assert queue.promote(first)
    _due, jobs = take_jobs(queue, "t", 30_000, now_ms() + 1500, 1, "w")  # at its new due time, in its expiry
    assert [job_id for job_id, _ in jobs] == [first], queue.get_job(first).failed_reason


def test_a_result_ttl_is_kept_on_a_queue_where_nothing_else_completes(queue):
    # "A completed job is kept result_ttl at most": on a queue where no later job completes (the last job of
    # the day, a quiet queue), the only trim was the next finish, so the result stayed for ever. The sweep,
    # which runs every interval on every served queue, trims it too.
    kept = queue.add("x", opts=JobOptions(result_ttl_ms=1000))
    [(taken, _)] = fetch(queue)
    finish_attempt(queue, taken, "token-1", now_ms() - 5000, completed=True, value='"secret"', default_attempts=3)
    sweep(queue)
    assert queue.get_job(kept) is None, "its result TTL passed 4 s ago; nothing trimmed it"


def test_a_dedupe_key_that_is_not_valid_text_is_refused_clearly_and_nothing_is_added(queue):
    # A lone surrogate passed the key's check and failed later, in redis-py's encoder (UnicodeEncodeError).
    with pytest.raises(PayloadError, match="dedupe key"):
        queue.add_bulk([NewJob("x"), NewJob("x", dedupe=Dedupe("a\ud800b"))])
    assert queue.counts()["wait"] == 0
