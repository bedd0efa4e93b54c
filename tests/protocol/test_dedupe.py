"""Deduplication (issue 28, item 1): a key taken and released by the scripts that add and end the job."""

import pytest

from echomq_django.core import Dedupe, JobOptions, NewJob, PayloadError
from echomq_django.core.producing.queue import now_ms
from tests.helpers import fetch, finish, kill_lock, redis_now_ms, sweep, take_jobs, wait_until


def holder(queue, key):
    return queue.client.get(queue.keys.base + "dedupe:" + key)


def test_until_the_job_ends_an_add_with_the_key_answers_with_the_holder(queue):
    first = queue.add("x", {"n": 1}, dedupe=Dedupe("user-42"))
    assert queue.add("x", {"n": 2}, dedupe=Dedupe("user-42")) == first, "waiting: no second job"
    [(taken, _)] = fetch(queue)
    assert queue.add("x", {"n": 3}, dedupe=Dedupe("user-42")) == first, "running: still none"
    assert queue.counts()["wait"] == 0 and queue.get_job(first).data == {"n": 1}
    finish(queue, taken, "token-1")
    assert holder(queue, "user-42") is None, "released by the finish that completed it"
    second = queue.add("x", {"n": 4}, dedupe=Dedupe("user-42"))
    assert second != first and queue.get_state(second) == "wait"


@pytest.mark.parametrize("end", ["failed", "cancelled", "removed", "expired", "stalled"])
def test_every_end_releases_the_key(queue, end):
    opts = JobOptions(attempts=1, expires_ms=1000) if end == "expired" else JobOptions(attempts=1)
    job_id = queue.add("x", opts=opts, dedupe=Dedupe("k"), timestamp_ms=now_ms() - (5000 if end == "expired" else 0))
    if end == "failed":
        [(taken, _)] = fetch(queue)
        finish(queue, taken, "token-1", completed=False, value="boom")
    elif end == "cancelled":
        queue.cancel(job_id)
    elif end == "removed":
        queue.remove(job_id)
    elif end == "expired":
        assert take_jobs(queue, "t", 30_000, now_ms(), 1, "w")[1] == []
    else:  # its worker died: the sweep fails it at its attempt ceiling
        fetch(queue)
        kill_lock(queue, job_id)
        sweep(queue)
        sweep(queue)
    assert queue.get_state(job_id) in ("failed", None) and holder(queue, "k") is None
    assert queue.add("x", dedupe=Dedupe("k")) != job_id


def test_a_retry_takes_the_key_back_unless_another_job_has_it(queue):
    job_id = queue.add("x", opts=JobOptions(attempts=1), dedupe=Dedupe("k"))
    [(taken, _)] = fetch(queue)
    finish(queue, taken, "token-1", completed=False, value="boom")
    assert queue.retry(job_id) and holder(queue, "k") == job_id
    assert queue.add("x", dedupe=Dedupe("k")) == job_id


def test_a_throttle_holds_its_ttl_whatever_the_job_does(queue):
    first = queue.add("x", dedupe=Dedupe("t", ttl_ms=60_000))
    [(taken, _)] = fetch(queue)
    finish(queue, taken, "token-1")
    assert queue.add("x", dedupe=Dedupe("t", ttl_ms=60_000)) == first, "completed, but within the TTL"
    ttl = queue.client.pttl(queue.keys.base + "dedupe:t")
    assert 0 < ttl <= 60_000, "the window is Redis's clock (PX)"
    queue.client.pexpire(queue.keys.base + "dedupe:t", 1)  # as if the minute had passed
    assert wait_until(lambda: not queue.client.exists(queue.keys.base + "dedupe:t"), 5)
    assert queue.add("x", dedupe=Dedupe("t", ttl_ms=60_000)) != first


def test_a_debounce_pushes_the_start_back_and_takes_the_new_data(queue):
    before = redis_now_ms(queue)
    # The window is Redis's clock: a producer whose clock is an hour off changes nothing.
    first = queue.add("x", {"v": 1}, dedupe=Dedupe("d", debounce_ms=5000), timestamp_ms=now_ms() - 3_600_000)
    due = queue.client.zscore(queue.keys.delayed, first)
    assert queue.get_state(first) == "delayed" and before + 5000 <= due <= redis_now_ms(queue) + 5000
    assert wait_until(lambda: redis_now_ms(queue) > due - 4990, 5)  # a few ms of the window pass
    assert queue.add("x", {"v": 2}, dedupe=Dedupe("d", debounce_ms=5000), timestamp_ms=now_ms() + 3_600_000) == first
    assert queue.client.zscore(queue.keys.delayed, first) > due
    assert queue.get_job(first).data == {"v": 2}
    assert queue.add("x", {"v": 3}, dedupe=Dedupe("d", debounce_ms=5000, keep_first=True)) == first
    assert queue.get_job(first).data == {"v": 2}, "keep: the data stays"


def test_a_debounce_after_the_start_adds_a_new_job(queue):
    first = queue.add("x", {"v": 1}, dedupe=Dedupe("d", debounce_ms=1000))
    assert queue.promote(first)  # its window over
    [(taken, _)] = fetch(queue)
    second = queue.add("x", {"v": 2}, dedupe=Dedupe("d", debounce_ms=1000))
    assert taken == first and second != first and holder(queue, "d") == second
    finish(queue, first, "token-1")
    assert holder(queue, "d") == second, "the first one's end does not release the second one's key"


def test_a_key_whose_holder_is_gone_is_free(queue):
    queue.client.set(queue.keys.base + "dedupe:orphan", "no-such-job")
    job_id = queue.add("x", dedupe=Dedupe("orphan"))
    assert job_id != "no-such-job" and holder(queue, "orphan") == job_id


@pytest.mark.parametrize("make, message", [
    (lambda: Dedupe(""), "1 to 200 characters"),
    (lambda: Dedupe("k" * 201), "1 to 200 characters"),
    (lambda: Dedupe(42), "a dedupe key is text"),
    (lambda: Dedupe("a\nb"), "control characters"),
    (lambda: Dedupe("k", ttl_ms=-1), "dedupe TTL"),
    (lambda: Dedupe("k", ttl_ms=10, debounce_ms=10), "not both"),
    (lambda: Dedupe("k", keep_first=True), "keep_first is for a debounce"),
])
def test_bad_dedupe_is_refused(make, message):
    with pytest.raises(PayloadError, match=message):
        make()


def test_a_bulk_add_dedupes_within_one_call(queue):
    ids = queue.add_bulk([NewJob("x", {"n": n}, dedupe=Dedupe("same")) for n in range(5)])
    assert len(set(ids)) == 1 and queue.counts()["wait"] == 1
