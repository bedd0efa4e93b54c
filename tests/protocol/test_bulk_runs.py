"""A bulk change run in steps outside a request (core/reading/bulk_runs.py): each job changed once, and counted once,
whatever crashes or runs twice."""

import pytest

from echomq_django.core import GONE
from echomq_django.core.reading.bulk_runs import ANSWERS_MS, read_run, run_step, start_run
from tests.helpers import fail_jobs, fetch, finish


def test_a_run_over_a_state_reads_its_ids_then_changes_them_a_step_at_a_time(queue):
    ids = fail_jobs(queue, 30)
    run_id = start_run(queue, "retry", "failed", None, {"who": "ops"})
    assert read_run(queue, run_id).status == "reading" and queue.counts()["failed"] == 30, "nothing yet"
    run = run_step(queue, run_id, limit=10, batch=5)
    assert (run.status, run.total, run.cursor, run.counts.done) == ("running", 30, 10, 10)
    assert queue.counts()["failed"] == 20 and run.fields == {"who": "ops"}
    while not run.finished:
        run = run_step(queue, run_id, limit=10, batch=5)
    assert (run.cursor, run.counts.done, run.counts.other) == (30, 30, {})
    assert sorted(queue.client.lrange(queue.keys.wait, 0, -1)) == sorted(ids)


def test_a_runner_that_died_after_its_round_trip_is_replaced_without_changing_or_counting_a_job_twice(queue):
    ids = fail_jobs(queue, 10)
    run_id = start_run(queue, "retry", "failed", list(ids), {})
    # The first runner's round trip reached Redis, and the runner died before it counted it.
    assert queue.retry_many(ids[:5], token=f"{run_id}.0", record_ms=ANSWERS_MS).done == ids[:5]
    # Meanwhile one of those jobs ran and failed again: the run must not send it back a second time.
    [(taken, _)] = fetch(queue, token="again")
    finish(queue, taken, "again", completed=False, value="boom again")
    assert queue.get_state(taken) == "failed"
    run = run_step(queue, run_id, batch=5)
    assert run.finished and run.counts.done == 10 and run.counts.other == {}, run.counts
    assert queue.get_state(taken) == "failed", "the job the dead runner retried was retried again"
    assert queue.counts()["wait"] == 9


def test_a_run_counts_the_jobs_it_left_alone_with_the_first_ids_of_each_reason(queue):
    ids = fail_jobs(queue, 15)
    for job_id in ids[:12]:
        queue.retry(job_id)  # another operator's retry, before the run's
    run_id = start_run(queue, "retry", "failed", list(ids), {})
    run = run_step(queue, run_id, batch=4)
    assert run.counts.done == 3
    assert run.counts.other == {GONE: [12, ids[:10]]}


@pytest.mark.parametrize("counts", ['{"done": Infinity}', '{"done": 1e400}', '{"done": -3}', '{"other": {"x": 5}}',
                                    '{"other": {"x": [3, 7]}}', '[', "[" * 5000, '"text"'])
def test_a_run_whose_counts_another_client_broke_still_runs_to_its_end(queue, counts):
    ids = fail_jobs(queue, 4)
    run_id = start_run(queue, "retry", "failed", list(ids), {})
    queue.client.hset(queue.keys.bulk_run(run_id), "counts", counts)
    run = read_run(queue, run_id)
    assert run is not None and run.counts.done >= 0
    assert all(isinstance(count, int) and isinstance(first, list) for count, first in run.counts.other.values())
    run = run_step(queue, run_id)
    assert run.finished and queue.counts()["wait"] == 4


@pytest.mark.parametrize("field, value", [("cursor", "x"), ("cursor", "-5"), ("total", "1e3"), ("cursor", "²")])
def test_a_run_whose_place_another_client_broke_is_left_alone(queue, field, value):
    """A cursor of -5 ran the same ids three times under other tokens: the record is no run's any more."""
    ids = fail_jobs(queue, 4)
    run_id = start_run(queue, "retry", "failed", list(ids), {})
    queue.client.hset(queue.keys.bulk_run(run_id), field, value)
    assert read_run(queue, run_id) is None
    assert run_step(queue, run_id) is None and queue.counts()["failed"] == 4, "nothing changed"
