"""Each protocol script against a real Redis: states, tokens, attempts, retention."""

import json
import time

import pytest

from echomq_django.core import (
    Backoff,
    Confirm,
    InvalidNameError,
    JobLockedError,
    JobNotFoundError,
    JobOptions,
    LockLostError,
    NewJob,
    NotConfirmedError,
    PayloadError,
    Queue,
)
from echomq_django.core.producing.queue import now_ms
from tests.helpers import fetch, finish, finish_attempt, kill_lock, renew_lock, sweep, take_jobs


def test_add_generates_ids_and_queues_fifo(queue):
    ids = [queue.add("work", {"n": n}) for n in range(3)]
    assert ids == ["q.1", "q.2", "q.3"], "generated: the queue's name and its counter"
    assert [job_id for job_id, _ in fetch(queue, count=3)] == ids
    job = queue.get_job("q.1")
    assert (job.name, job.data, job.attempts_made, job.attempts_started) == ("work", {"n": 0}, 0, 1)


def test_generated_ids_of_a_queue_with_a_long_name_are_readable(redis_client, prefix, scripts):
    from echomq_django.core.protocol.keys import MAX_NAME_LENGTH

    long = Queue("L" * MAX_NAME_LENGTH, redis_client, prefix=prefix, scripts=scripts)  # a valid queue name
    job_id = long.add("work", {"n": 1})
    assert job_id == "L" * MAX_NAME_LENGTH + ".1"
    assert long.get_job(job_id).data == {"n": 1}, "the id the queue generated is an id its own API takes"
    assert long.handle(job_id).status == "wait"
    assert long.remove(job_id) and long.get_job(job_id) is None


def test_add_with_a_callers_id_is_idempotent(queue):
    assert queue.add("work", {"v": 1}, job_id="order-7") == "order-7"
    assert queue.add("work", {"v": 2}, job_id="order-7") == "order-7"
    assert queue.get_job("order-7").data == {"v": 1}
    assert queue.counts()["wait"] == 1


def test_add_bulk_is_one_pipeline_and_validates_everything_first(queue):
    ids = queue.add_bulk([NewJob("work", {"n": n}) for n in range(100)])
    assert len(ids) == 100 and queue.counts()["wait"] == 100
    with pytest.raises(PayloadError):
        queue.add_bulk([NewJob("work", {"ok": 1}), NewJob("work", {"bad": object()})])
    assert queue.counts()["wait"] == 100, "a bad job in a batch adds nothing"


def test_add_bulk_keeps_order_across_calls_and_each_kind_of_job(queue):
    from echomq_django.core.producing.queue import JOBS_PER_CALL

    plain = [NewJob("plain", {"n": n}) for n in range(JOBS_PER_CALL + 3)]  # spans two script calls
    mixed = [NewJob("later", opts=JobOptions(delay_ms=60_000)), NewJob("urgent", opts=JobOptions(priority=9)),
             NewJob("mine", job_id="mine-1"), NewJob("again", job_id="mine-1")]
    ids = queue.add_bulk(plain + mixed)
    assert ids[-2:] == ["mine-1", "mine-1"] and queue.get_job("mine-1").name == "mine", "the first one wins"
    counts = queue.counts()
    assert (counts["wait"], counts["delayed"], counts["prioritized"]) == (JOBS_PER_CALL + 4, 1, 1)
    order = [job_id for job_id, _ in fetch(queue, count=JOBS_PER_CALL + 5)]
    assert order == [ids[JOBS_PER_CALL + 4]] + ids[:JOBS_PER_CALL + 3] + ["mine-1"]
    assert queue.get_job(ids[JOBS_PER_CALL + 3]).opts.delay_ms == 60_000


def test_an_add_no_replica_confirms_raises_and_names_the_jobs_it_added(queue):
    # The test Redis has no replicas, so WAIT 1 can only time out.
    confirmed = Queue("q", queue.client, prefix=queue.keys.prefix, confirm=Confirm(replicas=1, timeout_ms=50))
    with pytest.raises(NotConfirmedError, match=r"0 of 1 replicas confirmed them within 50 ms") as caught:
        confirmed.add("one", job_id="mine")
    assert caught.value.job_ids == ["mine"] and queue.get_job("mine").name == "one", "added all the same"
    with pytest.raises(NotConfirmedError) as caught:
        confirmed.add_bulk([NewJob("many") for _ in range(3)])
    assert len(caught.value.job_ids) == 3 and queue.counts()["wait"] == 4
    assert confirmed.add_bulk([]) == [], "nothing to confirm"
    nobody = Queue("q", queue.client, prefix=queue.keys.prefix, confirm=Confirm(replicas=0))
    assert nobody.add("none-needed")


def test_add_bulk_to_a_paused_queue_wakes_nobody(queue):
    queue.pause()
    queue.client.delete(queue.keys.marker)
    queue.add_bulk([NewJob("work") for _ in range(3)])
    assert queue.counts()["paused"] == 3 and not queue.client.exists(queue.keys.marker)
    queue.resume()
    assert len(fetch(queue, count=5)) == 3


def test_non_json_and_oversized_payloads_are_refused(redis_client, prefix):
    from echomq_django.core import Queue

    small = Queue("q", redis_client, prefix=prefix, max_payload_bytes=100)
    with pytest.raises(PayloadError, match="JSON"):
        small.add("work", {1, 2})
    with pytest.raises(PayloadError, match="limit is 100"):
        small.add("work", "x" * 200)
    assert small.counts()["wait"] == 0


def test_delayed_job_waits_for_its_due_time(queue):
    # The fetches' clock is given, not read: a stall of this machine cannot make the job due early.
    added_at = now_ms()
    job_id = queue.add("later", opts=JobOptions(delay_ms=30_000), timestamp_ms=added_at)
    assert queue.get_state(job_id) == "delayed"
    due = added_at + 30_000
    next_due, jobs = take_jobs(queue, "token-1", 30_000, due - 1, 1, "test-worker")
    assert (next_due, jobs) == (due, []), "not fetched a millisecond before its due time, which is said"
    _next_due, jobs = take_jobs(queue, "token-2", 30_000, due, 1, "test-worker")
    assert [taken for taken, _ in jobs] == [job_id], "fetched at its due time"


def test_move_to_active_locks_the_job_in_the_same_step(queue):
    job_id = queue.add("work")
    [(fetched, fields)] = fetch(queue, token="tok-A", lock_ms=5000)
    assert fetched == job_id
    assert queue.client.get(queue.keys.lock(job_id)) == "tok-A"
    assert 0 < queue.client.pttl(queue.keys.lock(job_id)) <= 5000
    assert fields["tok"] == "tok-A" and fields["ats"] == "1"


def test_paused_queue_gives_no_jobs_until_resumed(queue):
    queue.add("a")
    queue.pause()
    queue.add("b")
    assert queue.counts()["paused"] == 2 and fetch(queue) == []
    queue.resume()
    assert [j for j, _ in fetch(queue, count=5)] == ["q.1", "q.2"]


def test_complete_records_the_result_and_releases_the_lock(queue):
    job_id = queue.add("work")
    fetch(queue, token="tok-A")
    assert finish(queue, job_id, "tok-A", value=json.dumps({"ok": True})) == 1
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "completed"
    assert job.returnvalue == {"ok": True} and job.attempts_made == 1
    assert not queue.client.exists(queue.keys.lock(job_id))


def test_a_stale_token_cannot_extend_complete_or_fail(queue):
    job_id = queue.add("work")
    fetch(queue, token="tok-A")
    kill_lock(queue, job_id)
    sweep(queue)
    sweep(queue)  # recovered: back in wait
    fetch(queue, token="tok-B")

    assert not renew_lock(queue, job_id, "tok-A", 30_000)
    assert queue.scripts.lock_codes(queue.keys, [(job_id, "tok-A")], 30_000) == [-1], "lost"
    with pytest.raises(LockLostError):
        finish(queue, job_id, "tok-A", value='"late"')
    with pytest.raises(LockLostError):
        finish(queue, job_id, "tok-A", completed=False, value="late failure")
    assert queue.client.get(queue.keys.lock(job_id)) == "tok-B"

    assert finish(queue, job_id, "tok-B", value='"winner"') == 1
    with pytest.raises(LockLostError):
        finish(queue, job_id, "tok-A", value='"late"')
    assert queue.get_job(job_id).returnvalue == "winner"


def test_a_replayed_finish_of_the_same_token_is_harmless(queue):
    job_id = queue.add("work")
    fetch(queue, token="tok-A")
    assert finish(queue, job_id, "tok-A", value="1") == 1
    assert finish(queue, job_id, "tok-A", value="1") == 5
    assert queue.get_job(job_id).attempts_made == 1


def test_finish_of_a_missing_job_is_job_not_found(queue):
    with pytest.raises(JobNotFoundError):
        finish(queue, "nope", "tok")


def test_failure_with_attempts_left_is_retried_after_backoff(queue):
    job_id = queue.add("work", opts=JobOptions(attempts=3, backoff=Backoff("exponential", 1000)))
    fetch(queue, token="t1")
    before = now_ms()
    assert finish(queue, job_id, "t1", completed=False, value="boom", backoff_ms=1000) == 4
    due = queue.client.zscore(queue.keys.delayed, job_id)
    assert before + 1000 <= due <= now_ms() + 1000
    job = queue.get_job(job_id)
    assert (job.attempts_made, job.failed_reason) == (1, "boom")

    queue.client.zadd(queue.keys.delayed, {job_id: 0})  # skip the wait
    fetch(queue, token="t2")
    assert finish(queue, job_id, "t2", completed=False, value="boom", backoff_ms=0) == 3
    assert queue.get_state(job_id) == "wait"
    fetch(queue, token="t3")
    assert finish(queue, job_id, "t3", completed=False, value="boom 3",
                  **{}) == 2
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "failed"
    assert (job.attempts_made, job.failed_reason) == (3, "boom 3")


def test_backoff_delays():
    assert [Backoff("fixed", 500).delay_before(n) for n in (1, 2, 3)] == [500, 500, 500]
    assert [Backoff("exponential", 500).delay_before(n) for n in (1, 2, 3)] == [500, 1000, 2000]
    with pytest.raises(PayloadError):
        Backoff("linear", 5)


def test_stack_traces_accumulate_up_to_the_limit(queue):
    job_id = queue.add("work", opts=JobOptions(attempts=20))
    for attempt in range(12):
        fetch(queue, token=f"t{attempt}")
        finish_attempt(queue, job_id, f"t{attempt}", now_ms(), completed=False,
                                       value="boom", stacktrace=f"trace {attempt}",
                                       default_attempts=3, keep_traces=10)
    assert queue.get_job(job_id).stacktrace == [f"trace {n}" for n in range(2, 12)]


def test_retention_keeps_the_newest_by_count_and_drops_by_age(queue):
    ids = queue.add_bulk([NewJob("work") for _ in range(5)])
    for job_id, _ in fetch(queue, count=5):
        finish(queue, job_id, "token-1", keep_count=2)
    assert queue.client.zrange(queue.keys.completed, 0, -1) == ids[3:]
    assert not queue.client.exists(queue.keys.job(ids[0]))

    other = queue.add("work")
    fetch(queue, token="token-2")  # a new fetch, a new token: a token's second fetch only repeats its first
    queue.client.zadd(queue.keys.completed, {ids[3]: now_ms() - 60_000})
    finish(queue, other, "token-2", keep_age_ms=30_000)
    assert queue.client.zrange(queue.keys.completed, 0, -1) == [ids[4], other]


def test_retry_moves_only_a_job_that_is_still_failed(queue):
    job_id = queue.add("work", opts=JobOptions(attempts=1))
    fetch(queue)
    finish(queue, job_id, "token-1", completed=False, value="boom")
    assert queue.retry(job_id) is True
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "wait"
    assert job.failed_reason is None and job.attempts_made == 1, "atm never decreases"
    assert queue.retry(job_id) is False, "no longer in failed"
    assert queue.counts()["wait"] == 1


def test_remove_refuses_a_locked_job_and_deletes_others(queue):
    job_id = queue.add("work")
    fetch(queue)
    with pytest.raises(JobLockedError):
        queue.remove(job_id)
    kill_lock(queue, job_id)
    sweep(queue)
    assert queue.remove(job_id) is True
    assert queue.get_job(job_id) is None and queue.get_state(job_id) is None
    assert queue.stalled_ids() == set()
    assert queue.remove(job_id) is False


def test_counts_and_listing_per_state_with_paging(queue):
    ids = queue.add_bulk([NewJob("work", {"n": n}) for n in range(7)])
    fetch(queue, count=2)
    counts = queue.counts()
    assert (counts["wait"], counts["active"]) == (5, 2)
    page_one = [job.id for job in queue.get_jobs("wait", 0, 3)]
    page_two = [job.id for job in queue.get_jobs("wait", 3, 3)]
    assert page_one + page_two == list(reversed(ids[2:]))
    with pytest.raises(ValueError):
        queue.get_jobs("nowhere")


def test_promote_delayed_on_demand(queue):
    job_id = queue.add("later", opts=JobOptions(delay_ms=60_000))
    queue.client.zadd(queue.keys.delayed, {job_id: now_ms() - 1})
    assert queue.promote_delayed() == 1
    assert queue.get_state(job_id) == "wait"


def test_script_flush_is_invisible_to_callers(queue):
    queue.add("work")
    queue.client.script_flush()
    assert queue.add("work") == "q.2"
    assert len(fetch(queue, count=2)) == 2


def test_events_record_the_lifecycle(queue):
    job_id = queue.add("work")
    fetch(queue)
    finish(queue, job_id, "token-1")
    events = [fields["event"] for _id, fields in queue.client.xrange(queue.keys.events)]
    assert events == ["added", "active", "completed"]


def test_priorities_come_first_and_keep_fifo_among_equals(queue):
    low = queue.add("low", opts=JobOptions(priority=-5))
    plain_1 = queue.add("plain")
    high_1 = queue.add("high", opts=JobOptions(priority=10))
    top = queue.add("top", opts=JobOptions(priority=100))
    high_2 = queue.add("high", opts=JobOptions(priority=10))
    plain_2 = queue.add("plain")
    assert queue.counts()["prioritized"] == 4 and queue.counts()["wait"] == 2
    order = [job_id for job_id, _ in fetch(queue, count=6)]
    assert order == [top, high_1, high_2, plain_1, plain_2, low]


def test_a_job_keeps_its_priority_through_retry_recovery_and_delay(queue):
    job_id = queue.add("p", opts=JobOptions(priority=7, attempts=5))
    fetch(queue, token="t1")
    finish(queue, job_id, "t1", completed=False, value="boom")  # retried at once
    assert queue.get_state(job_id) == "prioritized"
    fetch(queue, token="t2")
    kill_lock(queue, job_id)
    sweep(queue)
    assert sweep(queue).recovered == 1
    assert queue.get_state(job_id) == "prioritized"
    fetch(queue, token="t3")
    finish(queue, job_id, "t3", completed=False, value="boom", backoff_ms=1)
    time.sleep(0.01)
    queue.add("plain")
    assert [j for j, _ in fetch(queue, token="t4", count=2)] == [job_id, "q.2"]


def test_a_paused_queue_holds_prioritized_jobs_too(queue):
    queue.pause()
    job_id = queue.add("p", opts=JobOptions(priority=3))
    assert fetch(queue) == [] and queue.get_state(job_id) == "prioritized"
    queue.resume()
    assert [j for j, _ in fetch(queue)] == [job_id]


def test_removing_a_prioritized_job(queue):
    job_id = queue.add("p", opts=JobOptions(priority=3))
    assert queue.remove(job_id) and queue.counts()["prioritized"] == 0


def test_each_attempt_records_its_worker_and_each_failure_its_class(queue):
    job_id = queue.add("work", opts=JobOptions(attempts=3))
    for attempt, worker in enumerate(("w-1", "w-2"), start=1):
        _due, [(fetched, _)] = take_jobs(queue, f"t{attempt}", 30_000, now_ms(), 1, worker)
        finish_attempt(queue, job_id, f"t{attempt}", now_ms(), completed=False,
                                       value="boom", stacktrace="trace", default_attempts=3,
                                       error_class="builtins.ValueError")
    job = queue.get_job(job_id)
    assert job.worker_ids == ["w-1", "w-2"] and job.attempts_started == 2
    assert job.error_classes == ["builtins.ValueError"] * 2 and len(job.stacktrace) == 2
    assert job.started_on is not None and job.started_on <= job.processed_on


def test_a_stack_trace_field_that_cjson_cannot_write_back_starts_afresh(queue):
    job_id = queue.add("work", opts=JobOptions(attempts=2))
    fetch(queue, token="t1")
    queue.client.hset(queue.keys.job(job_id), "stacktrace", "[1e999]")
    finish_attempt(queue, job_id, "t1", now_ms(), completed=False, value="boom",
                                   stacktrace="trace", default_attempts=2, error_class="builtins.ValueError")
    job = queue.get_job(job_id)
    assert job.stacktrace == ["trace"] and job.error_classes == ["builtins.ValueError"]
    assert queue.get_state(job_id) == "wait"


def test_error_classes_and_traces_stay_aligned_when_a_trace_is_missing(queue):
    job_id = queue.add("work", opts=JobOptions(attempts=3))
    for n, trace in enumerate(("trace 1", "", "trace 3"), start=1):
        fetch(queue, token=f"t{n}")
        finish_attempt(queue, job_id, f"t{n}", now_ms(), completed=False, value="boom",
                                       stacktrace=trace, default_attempts=3, error_class=f"mod.Error{n}")
    job = queue.get_job(job_id)
    assert list(zip(job.error_classes, job.stacktrace)) == [
        ("mod.Error1", "trace 1"), ("mod.Error2", ""), ("mod.Error3", "trace 3")]


def test_a_generated_id_skips_a_key_another_client_wrote(queue):
    queue.client.set(queue.keys.job("q.2"), "someone else's string")
    ids = queue.add_bulk([NewJob("work", {"n": n}) for n in range(3)])
    assert ids == ["q.1", "q.3", "q.4"]
    assert queue.counts()["wait"] == 3 and queue.client.get(queue.keys.job("q.2")) == "someone else's string"


def test_stray_entries_named_like_queue_keys_never_touch_the_queue_keys(queue):
    ids = [queue.add("work") for _ in range(3)]
    queue.pause()
    queue.client.zadd(queue.keys.failed, {"wait": 1, "meta": 2, "id": 3, "paused": 4})
    for stray in ("wait", "meta"):
        with pytest.raises(InvalidNameError, match="queue key"):
            queue.remove(stray)
        with pytest.raises(InvalidNameError, match="queue key"):
            queue.retry(stray)
    assert queue.retry_all_failed() == 0, "a queue key is no job to retry"
    assert queue.clean("failed", 0) == 4, "the entries leave the set"
    assert queue.client.zcard(queue.keys.failed) == 0
    assert queue.is_paused() and queue.client.get(queue.keys.id_counter) == "3"
    assert queue.client.lrange(queue.keys.paused, 0, -1) == ids[::-1], "the paused jobs are where they were"


def test_generated_ids_name_one_job_across_queues(queue, redis_client, prefix, scripts):
    """Issue 28: job "1" no longer exists in every queue; a caller's id never takes the generated form."""
    from echomq_django.core import InvalidNameError, Queue

    other = Queue("other", redis_client, prefix=prefix, scripts=scripts)
    assert (queue.add("x"), other.add("x")) == ("q.1", "other.1")
    assert queue.add("x", job_id="other.1") == "other.1", "another queue's form is a caller's id here"
    with pytest.raises(InvalidNameError, match="form of queue 'q'.s generated ids"):
        queue.add("x", job_id="q.7")
    with pytest.raises(InvalidNameError, match="all digits"):
        queue.add("x", job_id="7")
    assert queue.add("x", job_id="q.7b") == "q.7b" and queue.add("x") == "q.2"
