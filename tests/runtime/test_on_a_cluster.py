"""On the CI line that runs the protocol and runtime tests on a Redis Cluster: the fixtures really use it.

Each test is skipped unless ECHOMQ_TEST_REDIS_URL names a cluster (`ECHOMQ_TEST_REDIS_URL=cluster`).
"""

import pytest
import redis
from redis.cluster import RedisCluster

from tests.conftest import current_redis_url
from tests.helpers import wait_until


@pytest.mark.skipif(not current_redis_url().startswith("redis+cluster://"), reason="the run is not on a cluster")
def test_this_run_is_on_a_cluster(redis_client, queue):
    """On the CI line that runs the whole suite on a cluster, the fixtures really use it."""
    assert isinstance(redis_client, RedisCluster)
    queue.add("x")
    owner = redis_client.get_node_from_key(queue.keys.wait)
    with redis.Redis(host=owner.host, port=owner.port, decode_responses=True) as node:
        assert node.llen(queue.keys.wait) == 1


@pytest.mark.skipif(not current_redis_url().startswith("redis+cluster://"), reason="the run is not on a cluster")
def test_the_processes_pool_runs_reports_and_cancels_on_a_cluster(queue, redis_url):
    """The pool's own tests are system tests, which the cluster line skips; this one checks its Redis side here."""
    from echomq_django.core import Cancel, JobOptions
    from tests.helpers import running
    from tests.system.test_pool import make_worker, progress_pid, recording, state

    done = [queue.add("noop", recording(queue, redis_url)) for _ in range(3)]
    long = queue.add("sleep", recording(queue, redis_url, seconds=30), opts=JobOptions(attempts=3))
    with running(make_worker(queue, "processes", concurrency=2)):
        assert wait_until(lambda: all(state(queue, job_id, "completed")() for job_id in done), 30)
        assert wait_until(lambda: progress_pid(queue, long), 15), "its progress came through the pipe"
        assert queue.cancel(long, "on a cluster") is Cancel.STOPPING
        assert wait_until(state(queue, long, "failed"), 10)
    job = queue.get_job(long)
    assert (job.failed_reason, job.attempts_made) == ("cancelled: on a cluster", 1)
