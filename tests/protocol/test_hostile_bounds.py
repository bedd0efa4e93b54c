"""Hostile input at the bounds of what the Python side hands the scripts: refused before Redis, nothing written."""

import math

import pytest

from echomq_django.core import JobOptions, PayloadError
from echomq_django.core.job import MAX_DELAY_MS


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
