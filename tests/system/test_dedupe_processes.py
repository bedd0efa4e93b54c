"""Dedupe keys under races, SIGKILLed workers and Redis restarts: one job per key at a time, no key outlives its job."""

import random
import threading
import time

import pytest

from echomq_django.core import UNREACHABLE, Dedupe, JobOptions, Queue, connect
from tests.helpers import wait_until
from tests.redis_servers import RedisServer
from tests.system.test_faults import Fleet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_two_producers_racing_a_thousand_adds_of_one_key_make_one_job(queue):
    ids: list[str] = []
    start = threading.Barrier(2)

    def produce() -> None:
        start.wait()
        ids.extend(queue.add("noop", {"n": n}, dedupe=Dedupe("the-key")) for n in range(1000))

    threads = [threading.Thread(target=produce) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(ids) == 2000 and len(set(ids)) == 1 and queue.counts()["wait"] == 1


def test_no_key_outlives_its_job_through_killed_workers_and_redis_restarts():
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    server.start()
    queue = Queue("q", connect(server.url), prefix="dd")
    keys = [f"k{n}" for n in range(20)]
    returned: dict[str, set[str]] = {key: set() for key in keys}
    stop = threading.Event()

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            key = rng.choice(keys)
            try:
                job_id = queue.add("jitter", {"ms": 40}, opts=JobOptions(attempts=30), dedupe=Dedupe(key))
            except UNREACHABLE:
                time.sleep(0.05)
                continue
            returned[key].add(job_id)

    producers = [threading.Thread(target=produce, args=(seed,), daemon=True) for seed in (1, 2)]
    try:
        with Fleet(queue, server.url, lock_ms=1000, interval_ms=500, max_stalled_count=30) as fleet:
            for _ in range(3):
                fleet.spawn(4, "--tag-starts")
            for producer in producers:
                producer.start()
            for round_ in range(6):
                time.sleep(random.uniform(0.3, 0.7))
                victim = random.choice([worker for worker in fleet.workers if worker.poll() is None])
                victim.kill()  # SIGKILL
                victim.wait(10)
                if round_ in (1, 4):
                    server.stop()  # SIGKILL, then the AOF is replayed
                    time.sleep(random.uniform(0.5, 1.0))
                    server.start()
                fleet.spawn(4, "--tag-starts")
            stop.set()
            for producer in producers:
                producer.join(30)
            assert wait_until(lambda: (lambda c: c["wait"] + c["active"] + c["delayed"] == 0)(queue.counts()), 120)
            left = {key: queue.client.get(f"dd:{{q}}:dedupe:{key}") for key in keys}
            states = {job_id: queue.get_state(job_id) for ids in returned.values() for job_id in ids}
            again = {key: queue.add("noop", dedupe=Dedupe(key)) for key in keys}
    finally:
        server.stop()
        server.workdir.cleanup()
    added = sum(len(ids) for ids in returned.values())
    print(f"\n{added} jobs added under 20 keys by two producers; 6 workers killed, Redis restarted twice")
    assert added >= 20, "the producers ran"
    assert left == dict.fromkeys(keys), f"keys left behind by ended jobs: {left}"
    assert all(state == "completed" for state in states.values()), f"lost or failed: {states}"
    assert all(job_id not in returned[key] for key, job_id in again.items()), "every key was free again"
