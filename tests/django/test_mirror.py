"""The mirror: JobRecord rows follow the failed and stalled sets, incrementally."""

import pytest
from django.utils import timezone

from echomq_django.core import JobOptions, NewJob
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.codec import TOO_DEEP_CHARS
from echomq_django.mirror import sync_queue
from echomq_django.models import FailedJob, JobRecord, MirrorCursor, StalledJob
from tests.helpers import fetch, finish, finish_attempt, kill_lock, sweep

pytestmark = pytest.mark.django_db


def fail_jobs(queue, count, reason="boom"):
    ids = queue.add_bulk([NewJob("work", {"n": n}, JobOptions(attempts=1)) for n in range(count)])
    for job_id, _ in fetch(queue, count=count):
        finish(queue, job_id, "token-1", completed=False, value=reason)
    return ids


def test_failed_jobs_are_mirrored_with_their_fields(queue):
    [job_id] = fail_jobs(queue, 1, reason="<b>bad</b>")
    result = sync_queue(queue)
    assert result.written == 1
    row = FailedJob.objects.get(queue="q", job_id=job_id)
    assert (row.name, row.data, row.attempts_made, row.failed_reason) == ("work", {"n": 0}, 1, "<b>bad</b>")
    assert row.opts["attempts"] == 1 and row.finished_at is not None


def test_a_second_sync_with_no_news_writes_nothing(queue):
    fail_jobs(queue, 20)
    assert sync_queue(queue).written == 20
    again = sync_queue(queue)
    assert (again.written, again.deleted, again.compared_all) == (0, 0, False)


def test_jobs_failed_by_another_client_with_an_old_score_are_found(queue):
    fail_jobs(queue, 3)
    sync_queue(queue)
    # Written straight into Redis, scored long before the mirror's cursor.
    queue.client.hset(queue.keys.job("legacy-1"), mapping={"name": "old", "data": '"x"', "failedReason": "ancient"})
    queue.client.zadd(queue.keys.failed, {"legacy-1": 1_000})
    result = sync_queue(queue)
    assert result.compared_all and result.written == 1
    assert FailedJob.objects.get(job_id="legacy-1").failed_reason == "ancient"


def test_jobs_that_leave_the_failed_set_leave_the_mirror(queue):
    first, second, third = fail_jobs(queue, 3)
    sync_queue(queue)
    queue.retry(first)
    queue.remove(second)
    result = sync_queue(queue)
    assert result.deleted == 2
    assert list(FailedJob.objects.values_list("job_id", flat=True)) == [third]


def test_a_job_that_fails_again_is_updated(queue):
    [job_id] = fail_jobs(queue, 1, reason="first")
    sync_queue(queue)
    queue.retry(job_id)
    fetch(queue, token="t2")
    finish(queue, job_id, "t2", completed=False, value="second")
    sync_queue(queue)
    row = FailedJob.objects.get(job_id=job_id)
    assert (row.failed_reason, row.attempts_made) == ("second", 2)


def test_marked_jobs_are_mirrored_until_recovered(queue):
    job_id = queue.add("work")
    fetch(queue)
    kill_lock(queue, job_id)
    sweep(queue)
    sync_queue(queue)
    assert list(StalledJob.objects.values_list("job_id", flat=True)) == [job_id]
    sweep(queue)
    sync_queue(queue)
    assert not StalledJob.objects.exists()


def test_the_cursor_survives_a_restart_and_only_news_are_read(queue, django_assert_max_num_queries):
    fail_jobs(queue, 2000)
    sync_queue(queue)
    assert MirrorCursor.objects.get(queue="q").failed_through_ms >= now_ms() - 60_000
    fail_jobs(queue, 1)
    # A new sync (as after a restart of the sweeper) reads from the stored cursor: a handful
    # of queries whatever the size of the failed set.
    with django_assert_max_num_queries(12):
        result = sync_queue(queue)
    assert (result.written, result.compared_all) == (1, False)
    assert JobRecord.objects.filter(queue="q").count() == 2001


def test_a_hash_that_vanished_is_mirrored_with_a_reason(queue):
    queue.client.zadd(queue.keys.failed, {"ghost": now_ms()})
    sync_queue(queue)
    assert FailedJob.objects.get(job_id="ghost").failed_reason == "the job hash no longer exists in Redis"


@pytest.mark.parametrize("score", [1e17, 1e20, float("inf"), float("-inf")])
def test_failed_scores_out_of_datetime_range_are_mirrored(queue, score):
    [healthy] = fail_jobs(queue, 1)
    queue.client.hset(queue.keys.job("far-off"), mapping={"name": "odd", "failedReason": "written by hand"})
    queue.client.zadd(queue.keys.failed, {"far-off": score})
    sync_queue(queue)
    assert set(FailedJob.objects.values_list("job_id", flat=True)) == {healthy, "far-off"}
    cursor = MirrorCursor.objects.get(queue="q").failed_through_ms
    assert cursor <= now_ms(), "a score from the far future must not move the cursor past the present"
    [later] = fail_jobs(queue, 1)
    again = sync_queue(queue)
    assert (again.written, again.compared_all) == (1, False), "the next sync still reads only what is new"
    assert FailedJob.objects.filter(job_id=later).exists()


@pytest.mark.parametrize("value", ["1e20", "inf", "-inf", "abc"])
def test_job_timestamps_out_of_range_are_mirrored_without_them(queue, value):
    queue.client.hset(queue.keys.job("odd-times"), mapping={
        "name": "odd", "timestamp": value, "processedOn": value, "finishedOn": value})
    queue.client.zadd(queue.keys.failed, {"odd-times": now_ms()})
    sync_queue(queue)
    row = FailedJob.objects.get(job_id="odd-times")
    assert (row.created_at, row.processed_at) == (None, None)


def test_a_counter_no_column_holds_is_clamped_and_the_other_rows_are_written(queue):
    healthy = fail_jobs(queue, 3)
    queue.client.hset(queue.keys.job("huge-count"), mapping={"name": "odd", "atm": str(10**20)})
    queue.client.zadd(queue.keys.failed, {"huge-count": now_ms()})
    sync_queue(queue)
    assert set(healthy) <= set(FailedJob.objects.values_list("job_id", flat=True))
    assert FailedJob.objects.get(job_id="huge-count").attempts_made == 2**31 - 1, "clamped to the column"


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("field", ["data", "stacktrace"])
def test_a_deeply_nested_field_is_mirrored_as_the_start_of_its_text_beside_the_others(queue, field, depth):
    healthy = fail_jobs(queue, 5)
    queue.client.hset(queue.keys.job("deep"), mapping={"name": "odd", field: "[" * depth + "]" * depth})
    queue.client.zadd(queue.keys.failed, {"deep": now_ms()})
    for _ in range(2):  # and again: the next sync goes on as well
        sync_queue(queue)
        assert set(FailedJob.objects.values_list("job_id", flat=True)) == {*healthy, "deep"}
    stored = getattr(FailedJob.objects.get(job_id="deep"), field)
    text = stored[0] if field == "stacktrace" else stored
    assert isinstance(text, str) and text.startswith("[[[") and len(text) <= TOO_DEEP_CHARS, "flat, and cut"


def fail_at(queue, *scores_ms):
    """One failed job per score (ms), in order."""
    ids = queue.add_bulk([NewJob("work", {"n": n}, JobOptions(attempts=1)) for n in range(len(scores_ms))])
    for job_id, score in zip(ids, scores_ms):
        fetch(queue, token=f"t-{job_id}")
        finish_attempt(queue, job_id, f"t-{job_id}", score, completed=False, value="boom",
                                       default_attempts=1)
    return ids


def test_a_limited_sync_copies_both_ends_of_a_backlog_and_the_next_ones_finish(queue):
    ids = fail_at(queue, *(1_700_000_000_000 + n * 60_000 for n in range(10)))
    first = sync_queue(queue, limit=3)
    copied = set(FailedJob.objects.values_list("job_id", flat=True))
    assert not first.complete and first.pending > 0 and first.written == 6
    assert copied == {*ids[:3], *ids[-3:]}, "the oldest (the cursor moves past them) and the newest"
    assert MirrorCursor.objects.get(queue="q").synced_at is None, "never complete yet"
    results = [sync_queue(queue, limit=3) for _ in range(3)]
    assert results[-1].complete and FailedJob.objects.count() == 10
    assert MirrorCursor.objects.get(queue="q").synced_at is not None


def test_a_limited_sync_takes_a_burst_inside_the_clock_margin_for_no_backlog(queue):
    # Failures within CLOCK_MARGIN_MS of the cursor are read again by every sync: they must not look
    # like news that a limited sync leaves behind.
    fail_at(queue, *(1_700_000_000_000 + n for n in range(8)))
    sync_queue(queue)
    again = sync_queue(queue, limit=3)
    assert (again.complete, again.written, again.pending) == (True, 0, 0)


def test_a_limited_sync_leaves_a_large_whole_set_comparison_to_the_sweeper(queue):
    from echomq_django.mirror import COMPARE_FACTOR

    fail_at(queue, *(1_700_000_000_000 + n for n in range(COMPARE_FACTOR + 2)))
    sync_queue(queue)
    queue.client.zrem(queue.keys.failed, queue.client.zrange(queue.keys.failed, 0, 0)[0])
    limited = sync_queue(queue, limit=1)
    assert (limited.complete, limited.compared_all, limited.pending) == (False, False, 1)
    full = sync_queue(queue)
    assert full.complete and full.deleted == 1


def test_a_limited_sync_leaves_deleting_many_rows_to_the_sweeper(queue):
    from echomq_django.mirror import COMPARE_FACTOR

    fail_at(queue, *(1_700_000_000_000 + n for n in range(COMPARE_FACTOR + 2)))
    sync_queue(queue)
    queue.clean("failed", 0)  # every failed job is gone from Redis (another client, a FLUSHDB)
    limited = sync_queue(queue, limit=1)
    assert (limited.complete, limited.deleted) == (False, 0) and FailedJob.objects.count() == COMPARE_FACTOR + 2
    assert sync_queue(queue).deleted == COMPARE_FACTOR + 2


def test_a_limited_sync_copies_at_most_limit_new_marks(queue):
    ids = queue.add_bulk([NewJob("work") for _ in range(5)])
    fetch(queue, count=5)
    for job_id in ids:
        kill_lock(queue, job_id)
    sweep(queue)
    limited = sync_queue(queue, limit=2)
    assert (limited.complete, limited.pending, StalledJob.objects.count()) == (False, 3, 2)
    assert sync_queue(queue).complete and StalledJob.objects.count() == 5


def test_a_complete_sync_stamps_the_time_of_the_copy(queue):
    fail_jobs(queue, 1)
    before = timezone.now()
    assert sync_queue(queue).complete
    assert MirrorCursor.objects.get(queue="q").synced_at >= before


def test_text_no_database_can_store_is_stored_replaced(queue):
    job_id = queue.add("work", {"n": 1}, opts=JobOptions(attempts=1))
    queue.client.hset(queue.keys.job(job_id), "data", '{"k\\u0000": "a\\u0000b", "s": "\\ud800"}')
    fetch(queue, token="t")
    finish_attempt(queue, job_id, "t", 1_700_000_000_000, completed=False, value="byte \x00 at 3",
                   default_attempts=1)
    queue.client.hset(queue.keys.job(job_id), "atm", 99_999_999_999)
    sync_queue(queue)
    row = FailedJob.objects.get(job_id=job_id)
    assert row.failed_reason == "byte \ufffd at 3" and row.data == {"k\ufffd": "a\ufffdb", "s": "?"}
    assert row.attempts_made == 2**31 - 1
