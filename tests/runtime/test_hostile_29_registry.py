"""Records another client wrote into the workers registry: a stranger one is skipped, never a crash of the reader."""

import json

import pytest

from echomq_django.core import Queue, now_ms


def record(**fields) -> str:
    now = now_ms()
    return json.dumps({"id": "w", "host": "h", "pid": 1, "queues": ["q"], "pool": "threads", "concurrency": 1,
                       "version": "1", "started_at_ms": now, "heartbeat_at_ms": now, "done": 0, "failed": 0,
                       "running": [], **fields})


def write(queue: Queue, worker_id: str, text: str) -> None:
    queue.client.set(queue.keys.worker(worker_id), text, px=60_000)
    queue.client.zadd(queue.keys.workers, {worker_id: now_ms() + 60_000})


@pytest.mark.parametrize("text", [
    "[" * 100_000,  # json.loads: RecursionError, not a ValueError
    '{"id": ' * 50_000,
    record(started_at_ms=10**400),  # an int no float (nor datetime) holds: the readers divide it by 1000
    record(heartbeat_at_ms=-10**30),
    record(running=[["j", 10**400]]),
    record(concurrency=10**400),
    record(pid=-5),
    record(host="\x1b[2Jhost"),  # terminal control: echomq_status prints a record's text as it is
    record(running=[["j\nfake line", 1]]),
    record(queues=["q\x07"]),
], ids=["deep-array", "deep-object", "huge-start", "huge-negative-beat", "huge-job-start", "huge-concurrency",
        "negative-pid", "escape-in-host", "newline-in-job", "bell-in-queue"])
def test_a_stranger_record_is_skipped_and_the_good_one_listed(queue, text):
    write(queue, "stranger", text)
    write(queue, "good", record(id="good"))
    assert [worker.id for worker in queue.workers()] == ["good"]


def test_a_worker_whose_clock_is_behind_stays_listed_when_another_writes(queue):
    """Each beat prunes the index by its own clock: a live worker of a host two lock durations behind stays."""
    from echomq_django.core import Worker, WorkerOptions
    from tests.helpers import running, wait_until

    lock_ms = 2000
    behind = now_ms() - 3 * lock_ms  # its clock: it scores its record as lapsing one lock duration after that
    queue.client.set(queue.keys.worker("behind"), record(id="behind", heartbeat_at_ms=behind), px=60_000)
    queue.client.zadd(queue.keys.workers, {"behind": behind + lock_ms})
    options = WorkerOptions(prefix=queue.keys.prefix, lock_duration_ms=lock_ms, renew_interval_ms=100,
                            block_timeout_s=0.2)
    worker = Worker(queue.name, lambda job: None, queue.client, options, worker_id="here")
    with running(worker):
        assert wait_until(lambda: "here" in [w.id for w in queue.workers()], 10)
        # (Not the key's PTTL: each beat sets the same PX, so a later one need not read higher.)
        def last_beat() -> int:
            return json.loads(queue.client.get(queue.keys.worker("here")) or "{}").get("heartbeat_at_ms", 0)

        first = last_beat()
        assert wait_until(lambda: last_beat() > first, 10), "a second beat"
        assert sorted(w.id for w in queue.workers()) == ["behind", "here"]
