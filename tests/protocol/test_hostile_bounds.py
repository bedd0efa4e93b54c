"""Hostile input at the bounds of what the Python side hands the scripts: refused before Redis, nothing written."""

import math

import pytest

from echomq_django.core import JobOptions, PayloadError
from echomq_django.core.protocol.options import MAX_DELAY_MS


def _written(queue, redis_client) -> list[str]:
    return sorted(redis_client.scan_iter(f"{queue.keys.base}*"))


# Found (hostile test of issue 25): Queue.add handed `timestamp_ms` to addJob unchecked. Text failed in
# the script with Lua's "command arguments must be strings or integers" after it had taken an id; NaN with a
# delay failed on the ZADD after the job's hash was written, leaving a job in no state (lost to every
# worker and sweep); 1e20 and inf were stored as "1e+20" and "inf", and a creation time beyond 2**53
# minus the longest delay makes a due time no double holds exactly.
@pytest.mark.parametrize("timestamp_ms", [
    "abc", "123", math.nan, math.inf, -math.inf, 1.5, True, -1, 10**20, 2**53 - MAX_DELAY_MS,
])
def test_a_creation_time_that_is_not_a_whole_number_of_ms_in_range_is_refused_and_writes_nothing(
        queue, redis_client, timestamp_ms):
    before = _written(queue, redis_client)
    with pytest.raises(PayloadError, match="timestamp"):
        queue.add("work", opts=JobOptions(delay_ms=1000), timestamp_ms=timestamp_ms)
    assert _written(queue, redis_client) == before
    assert queue.counts() == dict.fromkeys(queue.counts(), 0)


def test_a_creation_time_at_the_bounds_is_kept_exactly(queue, redis_client):
    last = 2**53 - 1 - MAX_DELAY_MS
    for timestamp_ms in (0, last):
        job_id = queue.add("work", opts=JobOptions(delay_ms=MAX_DELAY_MS), timestamp_ms=timestamp_ms)
        job = queue.get_job(job_id)
        assert job is not None and job.timestamp == timestamp_ms
        assert redis_client.zscore(queue.keys.delayed, job_id) == timestamp_ms + MAX_DELAY_MS


# Found (hostile test of issue 25): Queue.get_jobs(state, start, count) read positions start to start+count-1,
# so a count of 0 read up to -1, Redis's "the last one": every job of the state (a million-job queue in one
# reply); a count of -1 all but the last, a negative start the tail.
@pytest.mark.parametrize("state", ["wait", "prioritized", "delayed"])
def test_a_page_of_no_jobs_is_empty_and_a_negative_position_is_refused(queue, state):
    opts = JobOptions(priority=1) if state == "prioritized" else JobOptions(delay_ms=60_000) \
        if state == "delayed" else None
    for _ in range(5):
        queue.add("work", opts=opts)
    assert len(queue.get_jobs(state, 0, 5)) == 5
    assert queue.get_jobs(state, 0, 0) == []
    assert queue.get_jobs(state, 4, 0) == []
    for start, count in ((0, -1), (-2, 1), (0, 2.5), ("0", 1)):
        with pytest.raises(ValueError):
            queue.get_jobs(state, start, count)
