"""A result TTL (issue 28, item 5): a completed job with opts resultTtl is removed once it passed, by a later finish."""

from echomq_django.core import JobOptions
from echomq_django.core.producing.queue import now_ms
from tests.helpers import fetch, finish, finish_attempt


def test_a_completed_job_is_removed_once_its_result_ttl_passed(queue):
    kept = queue.add("x", opts=JobOptions(result_ttl_ms=1000))
    plain = queue.add("x")
    (first, _), (second, _) = fetch(queue, count=2)
    assert finish(queue, first, "token-1", value='"r"') == 1
    assert queue.client.hget(queue.keys.job(kept), "rexp") is not None
    # A completion two seconds later (its clock) trims the first: its TTL has passed.
    finish_attempt(queue, second, "token-1", now_ms() + 2000, completed=True, value="1", default_attempts=3)
    assert queue.get_job(kept) is None and queue.get_state(kept) is None
    assert queue.get_state(plain) == "completed", "a job without a TTL stays, as retention says"
    assert queue.client.zcard(queue.keys.base + "result-ttl") == 0


def test_a_caller_id_added_again_is_not_removed_by_its_old_entry(queue):
    queue.add("x", opts=JobOptions(result_ttl_ms=1000), job_id="report-1")
    [(job_id, _)] = fetch(queue)
    finish(queue, job_id, "token-1")
    queue.remove("report-1")  # gone before its TTL; its entry in result-ttl stays
    queue.add("x", opts=JobOptions(result_ttl_ms=3_600_000), job_id="report-1")
    queue.add("y")
    for taken, _ in fetch(queue, token="token-2", count=2):  # both complete two seconds on: past the old TTL
        finish_attempt(queue, taken, "token-2", now_ms() + 2000, completed=True, value="1", default_attempts=3)
    assert queue.get_state("report-1") == "completed", "the new job's own TTL is an hour"
