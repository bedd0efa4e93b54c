"""Bulk changes: a state's ids read in windows (state_ids), and retry_many, remove_many, cancel_many."""

import pytest

from echomq_django.core import GONE, JobOptions, state_ids
from tests.helpers import fail_jobs, fetch, kill_lock, sweep


@pytest.mark.parametrize("page", [1, 7, 30, 500])
def test_state_ids_reads_each_id_of_a_state_once_whatever_the_window(queue, page):
    waiting = [queue.add("work", {"n": n}) for n in range(30)]
    assert sorted(state_ids(queue, "wait", page)) == sorted(waiting)
    queue.client.delete(queue.keys.wait)
    failed = fail_jobs(queue, 30)
    ids = state_ids(queue, "failed", page)
    assert len(ids) == 30 and set(ids) == set(failed)
    assert state_ids(queue, "completed", page) == []


def test_state_ids_reads_the_stalled_set(queue):
    ids = [queue.add("work", {"n": n}, opts=JobOptions(attempts=3)) for n in range(12)]
    fetch(queue, count=12)
    for job_id in ids:
        kill_lock(queue, job_id)
    sweep(queue)
    assert sorted(state_ids(queue, "stalled", 5)) == sorted(ids)


def test_state_ids_refuses_a_state_or_window_it_does_not_know(queue):
    for state, page in (("nowhere", 10), ("wait", 0), ("wait", 10_001)):
        with pytest.raises(ValueError):
            state_ids(queue, state, page)


def test_retry_many_sorts_each_job_by_what_the_script_answered(queue):
    ids = fail_jobs(queue, 5)
    queue.retry(ids[0])  # no longer failed
    queue.client.delete(queue.keys.job(ids[1]))  # no job hash to run
    outcome = queue.retry_many([*ids, "bad id", ids[2]], batch=2)
    assert outcome.done == ids[2:]
    assert outcome.gone == [ids[0], ids[2]], "a second retry of a job finds it gone"
    assert [len(v) for k, v in outcome.other.items() if k != GONE] == [1, 1]  # no hash; an id no job can have
    assert queue.client.lrange(queue.keys.wait, 0, -1).count(ids[2]) == 1


def test_remove_many_and_cancel_many(queue):
    delayed = [queue.add("later", {"n": n}, opts=JobOptions(delay_ms=60_000)) for n in range(3)]
    outcome = queue.cancel_many(delayed[:2], reason="by hand")
    assert outcome.done == delayed[:2] and queue.get_job(delayed[0]).failed_reason == "cancelled: by hand"
    outcome = queue.remove_many(delayed, only_from="delayed")
    assert outcome.done == [delayed[2]] and outcome.gone == delayed[:2], "the cancelled ones are failed now"
    running = queue.add("work")
    fetch(queue)
    outcome = queue.remove_many([running])
    assert outcome.done == [] and list(outcome.other) == ["a worker holds it"]
    assert queue.cancel_many([running]).other == {"running: its worker stops it at its next lock renewal": [running]}
