"""The workers registry: a worker is listed while it runs, with what it is doing, and gone once it stops."""

import os
import socket
import threading

from echomq_django import __version__
from echomq_django.core import JobOptions, NewJob, Queue, Worker, WorkerOptions
from tests.helpers import running, wait_until


def make_worker(queue: Queue, handler, worker_id=None, queues=(), **options) -> Worker:
    options.setdefault("block_timeout_s", 0.2)
    return Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, **options),
                  worker_id=worker_id, queues=queues)


def test_a_running_worker_is_listed_with_its_jobs_and_leaves_on_a_clean_stop(queue):
    release = threading.Event()
    worker = make_worker(queue, lambda job: release.wait(30), concurrency=3, lock_duration_ms=4000,
                         renew_interval_ms=100, queues=("q", "other"))
    assert queue.workers() == []
    with running(worker):
        ids = queue.add_bulk([NewJob("hold") for _ in range(2)])
        assert wait_until(lambda: [w.busy_slots for w in queue.workers()] == [2], 10)
        [info] = queue.workers()
        assert (info.id, info.queue, info.host, info.pid) == (worker.worker_id, "q", socket.gethostname(), os.getpid())
        assert (info.queues, info.pool, info.concurrency, info.version) == (("q", "other"), "threads", 3, __version__)
        assert sorted(job_id for job_id, _ in info.running) == sorted(ids)
        assert info.started_at_ms <= info.running[0][1] <= info.heartbeat_at_ms
        release.set()
        assert wait_until(lambda: [(w.done, w.busy_slots) for w in queue.workers()] == [(2, 0)], 10)
        # The record lives a lock duration and is written again each renewal round.
        assert 0 < queue.client.pttl(queue.keys.worker(worker.worker_id)) <= 4000
    assert queue.workers() == []
    assert not queue.client.exists(queue.keys.workers, queue.keys.worker(worker.worker_id))


def test_failed_attempts_are_counted_apart(queue):
    def handler(job):
        if job.data["fail"]:
            raise ValueError("no")

    queue.add_bulk([NewJob("x", {"fail": n % 2 == 0}, JobOptions(attempts=1)) for n in range(5)])
    worker = make_worker(queue, handler, renew_interval_ms=50, lock_duration_ms=2000)
    with running(worker):
        assert wait_until(lambda: [(w.done, w.failed) for w in queue.workers()] == [(5, 3)], 10)


def test_several_workers_are_listed_oldest_first_and_a_stranger_record_is_skipped(queue):
    workers = [make_worker(queue, lambda job: None, worker_id=f"w{n}", renew_interval_ms=100,
                           lock_duration_ms=3000) for n in range(3)]
    queue.client.zadd(queue.keys.workers, {"junk": 2**40})
    queue.client.set(queue.keys.worker("junk"), "not json")
    with running(workers[0]), running(workers[1]), running(workers[2]):
        assert wait_until(lambda: sorted(w.id for w in queue.workers()) == ["w0", "w1", "w2"], 10)
        listed = queue.workers()
        assert [w.started_at_ms for w in listed] == sorted(w.started_at_ms for w in listed)
    assert queue.workers() == []
