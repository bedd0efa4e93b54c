"""Real processes: a worker killed with SIGKILL mid-job, and SIGTERM shutdown."""

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from echomq_django.core import JobOptions, Sweeper
from tests.helpers import sweep, wait_until

WORKER = Path(__file__).resolve().parents[1] / "worker_process.py"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # waits of up to 50 s in all, and processes to start


def spawn_worker(redis_url, queue, lock_ms):
    process = subprocess.Popen(
        [sys.executable, str(WORKER), redis_url, queue.keys.prefix, queue.name, str(lock_ms)],
        stdout=subprocess.PIPE, text=True,
    )
    assert process.stdout.readline().strip() == "ready"
    return process


def starts(queue):
    return queue.client.lrange(f"{queue.keys.prefix}:starts", 0, -1)


def test_a_job_whose_worker_is_killed_is_recovered_and_completed_exactly_once(queue, redis_url):
    lock_ms, interval_ms = 1000, 500
    job_id = queue.add("sleep", {"seconds": 60, "first_only": True}, opts=JobOptions(attempts=3))
    victim = spawn_worker(redis_url, queue, lock_ms)
    sweeper = Sweeper(queue.client, [queue.name], prefix=queue.keys.prefix, interval_ms=interval_ms)
    sweeping = threading.Thread(target=sweeper.run, daemon=True)
    rescuer = None
    try:
        assert wait_until(lambda: len(starts(queue)) == 1, 10), "the first attempt never started"
        victim.kill()  # SIGKILL: no cleanup, the lock is simply never renewed
        victim.wait(5)
        killed_at = time.monotonic()
        sweeping.start()
        assert wait_until(lambda: queue.get_state(job_id) == "wait", 30)
        recovery_s = time.monotonic() - killed_at
        # Within a lock duration and two intervals (2 s), ten times over for a slow machine.
        assert recovery_s <= 10 * (lock_ms + 2 * interval_ms) / 1000

        rescuer = spawn_worker(redis_url, queue, lock_ms)
        assert wait_until(lambda: queue.get_state(job_id) == "completed", 10)
    finally:
        sweeper.stop()
        for process in (victim, rescuer):
            if process and process.poll() is None:
                process.terminate()
                process.wait(10)

    job = queue.get_job(job_id)
    assert (job.attempts_made, job.attempts_started, job.stall_count) == (2, 2, 1)
    first, second = starts(queue)
    assert first == f"{job_id}:{victim.pid}" and second == f"{job_id}:{rescuer.pid}"
    assert job.returnvalue == {"pid": rescuer.pid}
    completions = [f for _id, f in queue.client.xrange(queue.keys.events) if f["event"] == "completed"]
    assert len(completions) == 1
    counts = queue.counts()
    assert counts["completed"] == 1 and sum(counts.values()) == 1, counts


def test_sigterm_finishes_the_running_job_then_exits(queue, redis_url):
    job_id = queue.add("sleep", {"seconds": 1})
    queue.add("noop")
    worker = spawn_worker(redis_url, queue, 5000)
    assert wait_until(lambda: len(starts(queue)) == 1, 10)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(10) == 0
    assert queue.get_state(job_id) == "completed"
    assert queue.counts()["wait"] == 1, "nothing fetched after the first signal"


def test_a_second_sigterm_exits_at_once_leaving_the_job_to_the_sweeper(queue, redis_url):
    job_id = queue.add("sleep", {"seconds": 30})
    worker = spawn_worker(redis_url, queue, 500)
    assert wait_until(lambda: len(starts(queue)) == 1, 10)
    worker.send_signal(signal.SIGTERM)
    assert worker.stdout.readline().strip() == "stopping"  # the first is taken: the second is one more
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0, "the second SIGTERM did not end the 30 s job's worker"
    assert queue.get_state(job_id) == "active"
    assert wait_until(lambda: not queue.client.exists(queue.keys.lock(job_id)), 20)
    sweep(queue)
    assert sweep(queue).recovered == 1
