"""Hostile tests of the runtime added with progress, logs, metrics, cancel and promote.

Each test here reproduces a defect a hostile run found (and that is now fixed): faults, clock
skew, corrupt fields, re-sent calls and outages.
"""

import threading
import time

import pytest
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq_django.core import JobOptions, Queue, Retention, Worker, WorkerOptions, connect, recent_minutes
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.reading.metrics import MINUTE_MS
from tests.fault_proxy import FaultProxy
from tests.helpers import finish_attempt, take_jobs, wait_until
from tests.redis_servers import RedisServer


def test_a_corrupt_processed_on_does_not_erase_the_minutes_run_sum(queue):
    at = now_ms() // MINUTE_MS * MINUTE_MS + 1000
    for job_id in ("a", "b", "c"):
        queue.add("ok", opts=JobOptions(attempts=1), timestamp_ms=at, job_id=job_id)
        take_jobs(queue, f"t{job_id}", 30_000, at, 1, "w")
    assert finish_attempt(queue, "a", "ta", at + 100, completed=True, value="1", default_attempts=1) == 1
    queue.client.hset(queue.keys.job("b"), "processedOn", "-inf")  # another client's garbage
    assert finish_attempt(queue, "b", "tb", at + 100, completed=True, value="1", default_attempts=1) == 1
    assert finish_attempt(queue, "c", "tc", at + 100, completed=True, value="1", default_attempts=1) == 1
    [minute] = recent_minutes(queue, 1, now=at)
    assert minute.completed == 3
    # The two good runs of 100 ms each must still be in the sum (today: 100, run "a" was erased).
    assert minute.run_sum_ms >= 200, minute


def test_promoting_a_delayed_id_without_a_hash_runs_nothing(queue):
    job_id = queue.add("w", opts=JobOptions(delay_ms=3_600_000))
    queue.client.delete(queue.keys.job(job_id))  # the hash went (another client, eviction)
    queue.promote(job_id)
    ran = []
    Worker(queue.name, lambda job: ran.append(job.id), queue.client, WorkerOptions(prefix=queue.keys.prefix,
                                                                                   block_timeout_s=0.2)).run(burst=True)
    assert ran == [], "the handler ran a job that does not exist"
    assert queue.get_state(job_id) in (None, "failed")


def test_a_huge_metrics_minutes_strands_no_job(queue):
    ids = [queue.add("ok") for _ in range(3)]
    ran = []
    try:
        worker = Worker(queue.name, lambda job: ran.append(job.id), queue.client,
                        WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.2, metrics_minutes=10**15,
                                      keep_completed=Retention()))
    except ValueError:
        return  # refused up front: fine
    worker.run(burst=True)
    counts = queue.counts()
    assert (counts["active"], counts["wait"], counts["completed"]) == (0, 0, 3), counts
    assert sorted(ran) == sorted(ids)


def test_a_worker_clock_ahead_makes_no_minute_key_outlive_metrics_minutes(queue):
    keep = 1440
    job_id = queue.add("ok", opts=JobOptions(attempts=1))
    skewed = now_ms() + 365 * 86_400_000  # this worker's clock is a year ahead
    take_jobs(queue, "skewed", 30_000, skewed, 1, "w")
    assert finish_attempt(queue, job_id, "skewed", skewed + 10, completed=True, value="1", default_attempts=1) == 1
    minute_keys = [key for key in queue.client.scan_iter(match=queue.keys.base.replace("{", "[{]") + "metrics:*")
                   if not key.endswith(":total")]
    assert minute_keys
    ttls = {key: queue.client.ttl(key) for key in minute_keys}
    assert all(ttl <= (keep + 2) * 60 for ttl in ttls.values()), ttls


def test_a_resent_log_line_is_kept_once(queue):
    job_id = queue.add("w")
    [(taken, flat)] = take_jobs(queue, "tok", 30_000, now_ms(), 1, "w")[1]
    assert taken == job_id
    call = queue.scripts.log_call(queue.keys, job_id, "tok", "one line", 1000)
    for _ in range(2):  # the same call twice, as after a lost reply
        assert queue.scripts.run_batch([call], raise_on_error=True) == [1]
    assert queue.client.lrange(queue.keys.logs(job_id), 0, -1) == ["one line"]


@pytest.mark.parametrize("action", ["cancel", "promote"])
def test_a_resent_cancel_or_promote_still_says_it_did_it(queue, action):
    job_id = queue.add("w", opts=JobOptions(delay_ms=3_600_000))
    now = now_ms()
    if action == "cancel":
        answers = [queue.scripts.cancel_job(queue.keys, job_id, "stop", now) == 1 for _ in range(2)]
        assert queue.get_state(job_id) == "failed"
    else:
        answers = [queue.scripts.promote_job(queue.keys, job_id, now) for _ in range(2)]
        assert queue.get_state(job_id) == "wait"
    assert answers == [True, True], "the re-send tells the caller nothing was done"


@pytest.mark.parametrize("report", ["log", "progress"])
def test_an_outage_the_worker_rides_out_does_not_fail_a_job_that_reports(report):
    server = RedisServer()
    server.start()
    proxy = FaultProxy(server.port).start()
    worker = None
    try:
        direct = connect(server.url)
        queue = Queue("q", direct, prefix="hostile-outage")
        started, resumed = threading.Event(), threading.Event()

        def handler(job):
            started.set()
            resumed.wait(30)
            job.log("after the outage") if report == "log" else job.update_progress(1)
            return 1

        job_id = queue.add("x", opts=JobOptions(attempts=1))
        # A client that gives up quickly, so a short outage outlasts its own retries (as a real
        # client's ~17 s of retries are outlasted by a longer one); the lock (30 s) outlasts the outage.
        worker = Worker("q", handler, connect(proxy.url, retry=Retry(NoBackoff(), 1)),
                        WorkerOptions(prefix="hostile-outage", lock_duration_ms=30_000, block_timeout_s=0.2))
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        assert started.wait(10)
        proxy.down()
        resumed.set()
        time.sleep(2)  # the outage itself, not a synchronisation
        proxy.up()
        assert wait_until(lambda: queue.get_state(job_id) in ("completed", "failed"), 30)
        assert queue.get_state(job_id) == "completed", direct.hget(queue.keys.job(job_id), "failedReason")
    finally:
        if worker is not None:
            worker.stop()
        proxy.stop()
        server.stop()
        server.workdir.cleanup()
