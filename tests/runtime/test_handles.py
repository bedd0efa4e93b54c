"""A job's handle (issue 28, item 5): still its id, a str; its status, result, and a wait that ends on every end."""

import json
import pickle
import threading
import time

import pytest

from echomq_django.core import JobFailedError, JobNotFinishedError, JobNotFoundError, JobOptions, Worker, WorkerOptions
from tests.helpers import wait_until


@pytest.fixture
def later(queue):
    """Run an action on a thread once some seconds passed (the thing a waiter waits for, from elsewhere).

    The waiter may return while the action is still at work (a cancel delivers its handoffs after the
    waiter saw the job fail), so every thread is joined here, before the queue's client is closed.
    """
    threads = []

    def start(seconds: float, action) -> threading.Thread:
        thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
        thread.start()
        threads.append(thread)
        return thread

    yield start
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "an action outlived its test by 60 s"


def work(queue, handler) -> None:
    options = WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.1)
    Worker(queue.name, handler, queue.client, options).run(burst=True)


def test_a_handle_is_the_id(queue):
    handle = queue.handle(queue.add("x"))
    assert isinstance(handle, str) and handle == handle.id and {handle: 1}[handle.id] == 1
    assert json.dumps({"id": handle}) == json.dumps({"id": handle.id})
    assert type(pickle.loads(pickle.dumps(handle))) is str
    assert handle.status == "wait"
    with pytest.raises(JobNotFinishedError, match="has not finished: it is wait"):
        handle.result


def test_wait_returns_the_result_when_a_worker_completes_it(queue, later):
    handle = queue.handle(queue.add("x", {"n": 21}))
    later(0.2, lambda: work(queue, lambda job: job.data["n"] * 2))
    assert handle.wait(timeout=30) == 42 and handle.status == "completed" and handle.result == 42


def test_wait_raises_on_failure_and_on_cancel(queue, later):
    failing = queue.handle(queue.add("x", opts=JobOptions(attempts=1)))
    worker = later(0.2, lambda: work(queue, lambda job: 1 / 0))
    with pytest.raises(JobFailedError, match="ZeroDivisionError"):
        failing.wait(timeout=30)
    worker.join(30)  # its burst is over before the next job is added: the cancel is the only thing to end it
    assert not worker.is_alive()
    cancelled = queue.handle(queue.add("x"))
    later(0.2, lambda: queue.cancel(cancelled, "not needed"))
    with pytest.raises(JobFailedError, match="cancelled: not needed") as raised:
        cancelled.wait(timeout=30)
    assert raised.value.job_id == cancelled and cancelled.status == "failed"


def test_wait_does_not_hang_on_a_removed_job(queue, later):
    handle = queue.handle(queue.add("x"))
    later(0.2, lambda: queue.remove(handle))
    started = time.monotonic()
    with pytest.raises(JobNotFoundError, match="not in Redis"):
        handle.wait(timeout=60)
    assert time.monotonic() - started < 60, "ended by the removal, not by the timeout"
    assert handle.status == "missing"


def test_wait_times_out_and_wakes_for_its_own_job_only(queue, later):
    handle = queue.handle(queue.add("x", opts=JobOptions(delay_ms=3_600_000)))
    others = [queue.add("x") for _ in range(50)]
    later(0.1, lambda: work(queue, lambda job: None))  # 50 other jobs' events meanwhile
    with pytest.raises(TimeoutError, match="did not finish within 1.5 s"):
        handle.wait(timeout=1.5)
    assert wait_until(lambda: all(queue.get_state(other) == "completed" for other in others), 30)
    assert handle.status == "delayed"
