"""Durable steps in the scripts: recordStep (token-checked, first final record kept, a signal wait decided),
signalJob, moveToFinished's "parked" outcome and a fetch's resume of parked jobs past their deadline."""

import threading

import pytest

from echomq_django.core import JobNotFoundError, JobOptions
from echomq_django.core.defaults import MAX_STEPS
from echomq_django.core.errors import SignalRefused
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.worker.durable import record
from tests.helpers import fetch, finish_attempt, kill_lock, sweep


def record_step(queue, job_id, token, name, kind="step", text="", deadline=0, max_steps=MAX_STEPS, now=None):
    return queue.scripts.record_step(queue.keys, job_id, token, name, kind, text, max_steps=max_steps,
                                     now=now_ms() if now is None else now, deadline=deadline)


def running(queue, token="token-1"):
    job_id = queue.add("t.durable", opts=JobOptions(attempts=3))
    [(taken, _)] = fetch(queue, token)
    assert taken == job_id
    return job_id


def park(queue, job_id, token, name, deadline=0):
    return finish_attempt(queue, job_id, token, now_ms(), completed=False, value=name, default_attempts=3,
                          backoff_ms=deadline, parked=True)


def test_the_first_final_record_is_kept_and_answered_to_every_later_call(queue):
    job_id = running(queue)
    first = record("done", "step", r={"n": 1})
    assert record_step(queue, job_id, "token-1", "a", text=first) == [1, first]
    assert record_step(queue, job_id, "token-1", "a", text=record("done", "step", r={"n": 2})) == [0, first]
    failed = record("failed", "step", e="boom")
    assert record_step(queue, job_id, "token-1", "b", text=failed) == [1, failed]
    later = record("done", "step", r=3)
    assert record_step(queue, job_id, "token-1", "b", text=later) == [1, later], "a failure is not final"


def test_an_attempt_that_lost_the_job_records_nothing(queue):
    job_id = running(queue)
    assert record_step(queue, job_id, "someone-else", "a", text=record("done", "step", r=1)) == [-2]
    kill_lock(queue, job_id)
    sweep(queue)
    sweep(queue)  # marked, then recovered: the attempt's token no longer owns the job
    assert record_step(queue, job_id, "token-1", "a", text=record("done", "step", r=1)) == [-2]
    assert queue.client.exists(queue.keys.steps(job_id)) == 0
    assert record_step(queue, "no-such-job", "token-1", "a", text="{}") == [-1]


def test_a_job_records_at_most_max_steps(queue):
    job_id = running(queue)
    for n in range(3):
        assert record_step(queue, job_id, "token-1", f"s{n}", text=record("done", "step"), max_steps=3)[0] == 1
    assert record_step(queue, job_id, "token-1", "s3", text=record("done", "step"), max_steps=3) == [-4, 3]
    assert record_step(queue, job_id, "token-1", "s0", text=record("done", "step"), max_steps=3)[0] == 0


def test_racing_attempts_through_one_step_both_get_the_one_result(queue):
    job_id = running(queue)
    answers, barrier = [], threading.Barrier(8)

    def write(n):
        barrier.wait()
        answers.append(record_step(queue, job_id, "token-1", "race", text=record("done", "step", r=n))[1])

    threads = [threading.Thread(target=write, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(answers)) == 1 and len(answers) == 8


def test_a_signal_wait_decides_on_the_signal_and_keeps_its_first_deadline(queue):
    job_id = running(queue)
    soon = now_ms() + 60_000
    assert record_step(queue, job_id, "token-1", "go", kind="signal", deadline=soon) == [2, soon]
    # Asked again (a re-run), the first deadline holds, not the new one.
    assert record_step(queue, job_id, "token-1", "go", kind="signal", deadline=soon + 99_000) == [2, soon]
    assert queue.signal(job_id, "go", {"ok": True}) is False  # running: kept for its wait
    code, text = record_step(queue, job_id, "token-1", "go", kind="signal", deadline=0)
    assert code == 1 and text.startswith('{"s":"done","k":"signal"') and text.endswith('"r":{"ok":true}}')
    # Past a deadline with no signal: a timeout, final; a signal after it is refused.
    assert record_step(queue, job_id, "token-1", "late", kind="signal", deadline=1, now=now_ms())[1].startswith(
        '{"s":"timeout"')
    with pytest.raises(SignalRefused, match="over"):
        queue.signal(job_id, "late", 1)


def test_a_parked_job_holds_nothing_and_a_signal_brings_it_back(queue):
    job_id = running(queue)
    assert record_step(queue, job_id, "token-1", "go", kind="signal")[0] == 2
    assert park(queue, job_id, "token-1", "go") == 8
    counts = queue.counts()
    assert counts["parked"] == 1 and counts["active"] == 0 and counts["wait"] == 0
    assert queue.get_state(job_id) == "parked"
    assert not queue.client.exists(queue.keys.lock(job_id)) and queue.client.zscore(queue.keys.locks, job_id) is None
    assert queue.get_job(job_id).attempts_made == 0, "parking uses no attempt"
    assert queue.signal(job_id, "other", 1) is False, "another name is kept; the job stays parked"
    assert queue.get_state(job_id) == "parked"
    assert queue.signal(job_id, "go", [1]) is True
    assert queue.get_state(job_id) == "wait"
    with pytest.raises(SignalRefused, match="before"):
        queue.signal(job_id, "go", [2])
    with pytest.raises(JobNotFoundError):
        queue.signal("missing-job", "go")


def test_a_signal_that_lands_before_the_park_sends_the_job_straight_back(queue):
    job_id = running(queue)
    assert record_step(queue, job_id, "token-1", "go", kind="signal")[0] == 2
    assert queue.signal(job_id, "go", "early") is False  # between the wait's answer and the park
    assert park(queue, job_id, "token-1", "go") == 9
    assert queue.get_state(job_id) == "wait" and queue.counts()["parked"] == 0


def test_a_fetch_resumes_a_parked_job_past_its_deadline(queue):
    job_id = running(queue)
    deadline = now_ms() + 200
    assert park(queue, job_id, "token-1", "go", deadline) == 8
    assert int(queue.client.hget(queue.keys.meta, "parkedNext")) == deadline
    assert fetch(queue, "token-2") == [], "not due yet"
    while now_ms() <= deadline + 5:
        threading.Event().wait(0.01)  # the clock itself is what this test waits for
    [(taken, fields)] = fetch(queue, "token-3")
    assert taken == job_id and fields["park"] == "go"
    assert queue.client.hget(queue.keys.meta, "parkedNext") is None


def test_a_parked_job_can_be_cancelled_and_removed_with_everything_it_kept(queue):
    job_id = running(queue)
    record_step(queue, job_id, "token-1", "a", text=record("done", "step", r=1))
    park(queue, job_id, "token-1", "go")
    assert queue.signal(job_id, "unrelated", 1) is False
    assert queue.cancel(job_id)
    assert queue.get_state(job_id) == "failed" and queue.counts()["parked"] == 0
    assert queue.remove(job_id)
    for key in (queue.keys.job(job_id), queue.keys.steps(job_id), queue.keys.signals(job_id)):
        assert queue.client.exists(key) == 0, key


def test_retention_deletes_a_jobs_steps_and_signals_with_it(queue):
    job_id = running(queue)
    record_step(queue, job_id, "token-1", "a", text=record("done", "step", r=1))
    queue.signal(job_id, "s", 1)
    assert finish_attempt(queue, job_id, "token-1", now_ms(), completed=True, value="1", default_attempts=3,
                          keep_count=0) == 1
    assert queue.client.exists(queue.keys.steps(job_id), queue.keys.signals(job_id), queue.keys.job(job_id)) == 0
