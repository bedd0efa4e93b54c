"""A chord of 1,000 members on worker processes killed with SIGKILL at random while Redis is killed and
restarted from its AOF twice: every member counted once, the callback released and run once, nothing left."""

import random
import time

import pytest

from echomq_django.core import Chord, Group, JobOptions, Member, Plan, Queue, connect
from tests.helpers import wait_until
from tests.redis_servers import RedisServer
from tests.system.test_faults import Fleet, events, started_per_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
MEMBERS = 1000


def test_a_chord_survives_killed_workers_and_redis_restarts():
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    server.start()
    queue = Queue("q", connect(server.url), prefix="wf")
    opts = JobOptions(attempts=50)
    plan = Plan.of(Chord(Group(Member(queue, "value", {"n": n, "ms": 60}, opts) for n in range(MEMBERS)),
                         Member(queue, "collect", {}, opts)))
    callback = plan.steps[-1].id
    kills = restarts = 0
    try:
        with Fleet(queue, server.url, lock_ms=1000, interval_ms=500, max_stalled_count=50) as fleet:
            for _ in range(3):
                fleet.spawn(4, "--tag-starts")
            plan.add()
            # Kill until the callback is released (then it runs undisturbed, so "once" is exact).
            while queue.get_state(callback) == "deferred":
                time.sleep(random.uniform(0.2, 0.6))
                victim = random.choice([worker for worker in fleet.workers if worker.poll() is None])
                victim.kill()  # SIGKILL: its jobs stall, and the sweeper recovers them
                victim.wait(10)
                kills += 1
                if kills in (1, 3):
                    server.stop()  # SIGKILL
                    time.sleep(random.uniform(0.5, 1.5))
                    server.start()  # the AOF is replayed
                    restarts += 1
                fleet.spawn(4, "--tag-starts")
            assert wait_until(lambda: plan.handle().status == "succeeded", 120), plan.handle().status
            started = started_per_job(queue)
            completed = set(queue.client.zrange(queue.keys.completed, 0, -1))
            counts = queue.counts()
            released = [job_id for _, job_id in events(queue, "added") if job_id == callback]
            results = plan.handle().results()
    finally:
        server.stop()
        server.workdir.cleanup()
    members = {step.id for step in plan.steps[:-1]}
    print(f"\nchord of {MEMBERS}: {kills} workers killed, Redis restarted {restarts}x; "
          f"{sum(started[m] - 1 for m in members)} member re-runs after kills")
    assert restarts == 2, "the chord ended before the second restart: make it longer"
    assert results == list(range(MEMBERS)), "the callback got every result, in order"
    assert started[callback] == 1 and len(released) == 1, "the callback was released and ran exactly once"
    assert members <= completed and all(started[m] >= 1 for m in members)
    assert counts["deferred"] == counts["wait"] == counts["active"] == counts["failed"] == 0
