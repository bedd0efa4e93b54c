"""Hostile tests of durable steps in the scripts (issue 41): recordStep, signalJob, the "parked" outcome of
moveToFinished and a fetch's resume of parked jobs, attacked with races between attempts, signals racing the
park, cancels and removals, and another client's writes to `parked`, meta `parkedNext` and a job's records.

Real scripts on a real Redis, no mocks. A test marked xfail(strict=True) shows a defect that is still there
(its reason says which); the others prove a promise of docs/durable.md holds.
"""

import threading
from functools import partial

import pytest
from redis.exceptions import ResponseError

from echomq_django.core import JobNotFoundError, JobOptions, NewJob
from echomq_django.core.defaults import MAX_STEPS
from echomq_django.core.errors import InvalidNameError, LockLostError, SignalRefused
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.scripts import Finish
from echomq_django.core.worker.durable import record
from tests.helpers import fetch, finish_attempt, kill_lock, sweep, wait_until

PROMOTE_LIMIT = 1000  # promoteParked's limit per moveToActive call


def record_step(queue, job_id, token, name, kind="step", text="", deadline=0, now=None):
    return queue.scripts.record_step(queue.keys, job_id, token, name, kind, text, max_steps=MAX_STEPS,
                                     now=now_ms() if now is None else now, deadline=deadline)


def running(queue, token="token-1"):
    job_id = queue.add("t.durable", opts=JobOptions(attempts=3))
    [(taken, _)] = fetch(queue, token)
    assert taken == job_id
    return job_id


def park(queue, job_id, token, name, deadline=0):
    return finish_attempt(queue, job_id, token, now_ms(), completed=False, value=name, default_attempts=3,
                          backoff_ms=deadline, parked=True)


def parked_waiting(queue, name="go", token="token-1", deadline=0):
    """A job that reached `wait_for_signal(name)` and parked, as a worker does it: recordStep's wait, then the park."""
    job_id = running(queue, token)
    assert record_step(queue, job_id, token, name, kind="signal", deadline=deadline)[0] == 2
    assert park(queue, job_id, token, name, deadline) == 8
    return job_id


def raw_fetch(queue, token, count=10):
    """One moveToActive call as a worker sends it: its raw reply (an error comes back as the exception)."""
    call = queue.scripts.fetch_call(queue.keys, token, 30_000, now_ms(), count, "w-hostile")
    [reply] = queue.scripts.run_batch([call], raise_on_error=False)
    return reply


def in_states(queue, job_id):
    """Every state list or set that holds `job_id` (a job is in exactly one)."""
    keys = queue.keys
    found = [name for name, key in (("wait", keys.wait), ("active", keys.active)) if job_id in
             queue.client.lrange(key, 0, -1)]
    found += [name for name, key in (("parked", keys.parked), ("delayed", keys.delayed), ("failed", keys.failed),
                                     ("completed", keys.completed)) if queue.client.zscore(key, job_id) is not None]
    return found


def run_threads(*targets):
    """Run each target on a thread of its own, released together; what each returned or raised, in order."""
    barrier, outcomes = threading.Barrier(len(targets)), [None] * len(targets)

    def run(index, target):
        barrier.wait()
        try:
            outcomes[index] = target()
        except Exception as error:  # the outcome under test, compared by the caller
            outcomes[index] = error

    threads = [threading.Thread(target=run, args=(index, target)) for index, target in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return outcomes


# --- races between two attempts of one job ------------------------------------------------------------------

def test_an_attempt_that_lost_its_job_cannot_park_finish_or_record_after_the_new_owner_parked(queue):
    job_id = running(queue, "token-1")
    soon = now_ms() + 600_000
    assert record_step(queue, job_id, "token-1", "go", kind="signal", deadline=soon) == [2, soon]
    kill_lock(queue, job_id)  # the first attempt's lock lapsed between its wait's answer and its park
    sweep(queue)
    sweep(queue)
    [(taken, _)] = fetch(queue, "token-2")
    assert taken == job_id
    assert record_step(queue, job_id, "token-2", "go", kind="signal", deadline=soon + 1) == [2, soon]
    assert park(queue, job_id, "token-2", "go", soon) == 8
    for late in (lambda: park(queue, job_id, "token-1", "go", soon),
                 lambda: finish_attempt(queue, job_id, "token-1", now_ms(), completed=True, value="1",
                                        default_attempts=3)):
        with pytest.raises(LockLostError):
            late()
    assert record_step(queue, job_id, "token-1", "later", text=record("done", "step", r=1)) == [-2]
    assert in_states(queue, job_id) == ["parked"]
    assert queue.signal(job_id, "go", 1) is True
    assert in_states(queue, job_id) == ["wait"]


def test_a_signal_racing_the_park_never_leaves_the_job_parked_with_its_signal(queue):
    for round_ in range(60):
        token = f"token-{round_}"
        job_id = running(queue, token)
        assert record_step(queue, job_id, token, "go", kind="signal")[0] == 2
        parked, sent = run_threads(partial(park, queue, job_id, token, "go"),
                                   partial(queue.signal, job_id, "go", round_))
        assert parked in (8, 9) and sent in (True, False), (parked, sent)
        assert in_states(queue, job_id) == ["wait"], f"round {round_}: park {parked}, signal {sent}"
        [(taken, _)] = fetch(queue, token + "b")
        assert taken == job_id
        assert record_step(queue, job_id, token + "b", "go", kind="signal")[1].endswith(f'"r":{round_}}}')
        assert finish_attempt(queue, job_id, token + "b", now_ms(), completed=True, value="1",
                              default_attempts=3, keep_count=0) == 1


def test_of_many_signals_of_one_name_sent_at_once_exactly_one_is_accepted(queue):
    job_id = parked_waiting(queue)
    outcomes = run_threads(*[partial(queue.signal, job_id, "go", n) for n in range(16)])
    accepted = [outcome for outcome in outcomes if not isinstance(outcome, Exception)]
    assert accepted == [True], outcomes
    assert all(isinstance(outcome, SignalRefused) for outcome in outcomes if outcome is not True)
    assert in_states(queue, job_id) == ["wait"] and queue.client.llen(queue.keys.wait) == 1


def test_a_signal_a_cancel_and_a_remove_of_one_parked_job_at_once_leave_it_in_one_place_or_gone(queue):
    for _ in range(20):
        job_id = parked_waiting(queue)
        outcomes = run_threads(partial(queue.signal, job_id, "go", 1), partial(queue.cancel, job_id),
                               partial(queue.remove, job_id))
        assert not isinstance(outcomes[1], Exception) and not isinstance(outcomes[2], Exception), outcomes
        assert isinstance(outcomes[0], (bool, SignalRefused, JobNotFoundError)), outcomes
        where = in_states(queue, job_id)
        assert where in ([], ["failed"]), (where, outcomes)
        assert queue.client.zcard(queue.keys.parked) == 0
        if where:
            assert queue.remove(job_id)  # cancelled after the remove ran: gone now
        keys = (queue.keys.job(job_id), queue.keys.steps(job_id), queue.keys.signals(job_id))
        assert queue.client.exists(*keys) == 0


def test_a_signal_that_comes_as_the_deadline_passes_is_the_one_the_job_gets(queue):
    """Past its deadline but not yet resumed by a fetch, the wait still takes the signal: the sender is told
    True, and the job gets the payload, not SignalTimeout."""
    deadline = now_ms() + 150
    job_id = parked_waiting(queue, deadline=deadline)
    assert wait_until(lambda: now_ms() > deadline + 5, 10)
    assert queue.signal(job_id, "go", "just in time") is True
    [(taken, _)] = fetch(queue, "token-2")
    assert taken == job_id
    code, text = record_step(queue, job_id, "token-2", "go", kind="signal", deadline=deadline)
    assert code == 1 and text.endswith('"r":"just in time"}')


# --- another client's writes to `parked` and meta `parkedNext` ---------------------------------------------

@pytest.mark.parametrize("value", ["inf", "nan", "1e300"])
def test_a_parked_next_no_script_writes_gives_no_due_time_in_the_past(queue, value):
    queue.client.hset(queue.keys.meta, "parkedNext", value)
    reply = raw_fetch(queue, "token-1")
    next_due = queue.scripts.fetched(reply)[0]
    assert next_due is None or next_due > now_ms() - 60_000, f"nextDue {next_due} tells the worker to poll now"


def test_a_parked_next_of_text_is_ignored_and_fetches_go_on(queue):
    waiting = queue.add("plain")
    queue.client.hset(queue.keys.meta, "parkedNext", "soon, says another client")
    reply = raw_fetch(queue, "token-1")
    assert queue.scripts.fetched(reply)[0] is None and reply[4] == waiting


def test_a_parked_next_of_nan_does_not_keep_a_parked_job_past_its_deadline(queue):
    queue.client.hset(queue.keys.meta, "parkedNext", "nan")
    deadline = now_ms() + 100
    job_id = parked_waiting(queue, deadline=deadline)
    assert wait_until(lambda: now_ms() > deadline + 5, 10)
    assert wait_until(lambda: (raw_fetch(queue, "token-2")[4:5] == [job_id]) or in_states(queue, job_id) != [
        "parked"], 3), "the wait's deadline passed long ago; the job is still parked"


def test_a_parked_key_of_another_type_stops_only_the_parked_jobs(queue):
    ready = queue.add("plain")
    queue.client.set(queue.keys.parked, "another client's")
    queue.client.hset(queue.keys.meta, "parkedNext", now_ms() - 1)
    reply = raw_fetch(queue, "token-1")
    assert not isinstance(reply, ResponseError), f"the whole fetch failed: {reply}"
    assert reply[4] == ready


def test_a_queue_key_name_put_in_parked_is_not_fetched_as_a_job(queue):
    job_id = running(queue)
    record_step(queue, job_id, "token-1", "a", text=record("done", "step", r=1))
    queue.client.zadd(queue.keys.parked, {"meta": 1, f"{job_id}:steps": 2})
    queue.client.hset(queue.keys.meta, "parkedNext", 1)
    raw_fetch(queue, "token-2")
    assert set(queue.client.hkeys(queue.keys.steps(job_id))) == {"a"}, "the fetch wrote into the job's steps"
    assert "failedReason" not in queue.client.hkeys(queue.keys.meta), "the fetch wrote into the queue's meta"


def test_a_parked_id_with_no_hash_does_not_stop_the_fetch(queue):
    ready = queue.add("plain")
    queue.client.zadd(queue.keys.parked, {"gone-job": 1})
    queue.client.hset(queue.keys.meta, "parkedNext", 1)
    reply = raw_fetch(queue, "token-1")
    assert ready in reply[4::2]
    assert queue.client.zcard(queue.keys.parked) == 0


# --- another client's writes to a job's records -------------------------------------------------------------

def test_a_truncated_record_that_looks_final_is_answered_as_it_is_for_the_worker_to_refuse(queue):
    """recordStep trusts the first bytes: the worker's strict JSON read is what refuses it (see the Django tests,
    where the job fails for good saying so)."""
    job_id = running(queue)
    queue.client.hset(queue.keys.steps(job_id), "a", '{"s":"done","k":"step","at":1,"r":')
    assert record_step(queue, job_id, "token-1", "a", text=record("done", "step", r=2)) == [
        0, '{"s":"done","k":"step","at":1,"r":']


def test_a_steps_key_of_another_type_fails_the_call_not_the_queue(queue):
    job_id = running(queue)
    other = queue.add("plain")
    queue.client.set(queue.keys.steps(job_id), "another client's")
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        record_step(queue, job_id, "token-1", "a", text=record("done", "step", r=1))
    assert [taken for taken, _ in fetch(queue, "token-2")] == [other]


def test_a_signal_to_a_name_or_id_that_is_no_key_part_is_refused_before_any_write(queue):
    job_id = parked_waiting(queue)
    for name in ("", "with space", "p:go", "caf\u00e9", "x" * 129, "{go}"):
        with pytest.raises(InvalidNameError):
            queue.signal(job_id, name, 1)
    for bad_id in ("{q}", "a:b", "meta", "wait"):
        with pytest.raises(InvalidNameError):
            queue.signal(bad_id, "go", 1)
    assert queue.client.hlen(queue.keys.signals(job_id)) == 0 and in_states(queue, job_id) == ["parked"]


# --- limits: bounded work per call ---------------------------------------------------------------------------

def test_parked_jobs_due_at_once_are_resumed_a_bounded_number_per_fetch_and_none_is_lost(queue):
    count = PROMOTE_LIMIT + 200
    ids = queue.add_bulk([NewJob("t.durable", {"n": n}) for n in range(count)])
    taken = [job_id for job_id, _ in fetch(queue, "token-1", count=count)]
    assert sorted(taken) == sorted(ids)
    deadline = now_ms() + 200
    call = queue.scripts.finish_call(queue.keys, [Finish(job_id, "token-1", False, "go", parked=True,
                                                         backoff_ms=deadline) for job_id in ids], now_ms(),
                                     default_attempts=3)
    queue.scripts.run_batch([call], raise_on_error=True)
    assert queue.client.zcard(queue.keys.parked) == count
    assert wait_until(lambda: now_ms() > deadline + 5, 10)
    raw_fetch(queue, "token-2", count=0)
    assert queue.client.llen(queue.keys.wait) == PROMOTE_LIMIT, "one fetch resumes at most its limit"
    assert int(queue.client.hget(queue.keys.meta, "parkedNext")) == deadline, "the rest stays due"
    raw_fetch(queue, "token-3", count=0)
    assert queue.client.llen(queue.keys.wait) == count and queue.client.zcard(queue.keys.parked) == 0


def test_a_job_keeps_at_most_max_signals_and_refuses_more(queue):
    from echomq_django.core.defaults import MAX_SIGNALS

    job_id = running(queue)
    pipe = queue.client.pipeline(transaction=False)
    for n in range(MAX_SIGNALS):
        pipe.hset(queue.keys.signals(job_id), mapping={f"p:s{n}": "1", f"c:s{n}": "x"})
    pipe.execute()
    with pytest.raises(SignalRefused, match="1,000 signals"):
        queue.signal(job_id, "one-more", 1)
