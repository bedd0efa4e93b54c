"""Flow control with worker processes: a rate limit, a cap and RateLimited hold across all of a queue's workers.

Start times come from the `active` events, stamped by Redis in the script that
decided each start (the script reads Redis's clock for the window too, so the
two agree to within a millisecond or two).
"""

import threading
import time

import pytest

from echomq_django.core import JobOptions, NewJob, Queue, connect
from tests.helpers import wait_until
from tests.redis_servers import RedisServer
from tests.system.test_faults import Fleet, events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # up to 7 s each

CLOCKS_MS = 3  # how far the event's time and the window's may lie apart (see the docstring)


def starts_ms(queue) -> list[int]:
    return sorted(ms for ms, _ in events(queue, "active"))


ENDS = ("completed", "failed", "retried", "recovered", "limited")


def most_running_by(queue, key) -> dict:
    """The most jobs that ran at once, per key(job id), from the events stream in its own order."""
    running: dict = {}
    most: dict = {}
    for _id, fields in queue.client.xrange(queue.keys.events):
        change = 1 if fields["event"] == "active" else -1 if fields["event"] in ENDS else 0
        if change:
            which = key(fields["jobId"])
            running[which] = running.get(which, 0) + change
            most[which] = max(most.get(which, 0), running[which])
    return most


def most_running(queue) -> int:
    return most_running_by(queue, lambda job_id: None).get(None, 0)


def test_a_rate_limit_of_10_a_second_holds_across_3_workers_of_8_threads(queue, redis_url):
    jobs, rate = 60, 10
    with Fleet(queue, redis_url, 30_000, 30_000) as fleet:
        for _ in range(3):
            fleet.spawn(8, "--rate", f"{rate}/1000")
        added = time.monotonic()
        queue.add_bulk([NewJob("noop") for _ in range(jobs)])
        assert wait_until(lambda: queue.counts()["completed"] == jobs, 60), queue.counts()
        drained_s = time.monotonic() - added
    starts = starts_ms(queue)
    closest = min(later - first for first, later in zip(starts, starts[rate:]))
    ideal_s = jobs / rate - 1  # the first 10 start at once, the last 10 five windows later
    span_s = (starts[-1] - starts[0]) / 1000  # from the first start: the workers' own start-up is not the limit's
    print(f"\n{jobs} jobs, {rate}/s over 3 workers x 8 threads: drained in {drained_s:.2f} s, the starts spanned "
          f"{span_s:.2f} s (ideal {ideal_s:g} s); the closest 11 starts spanned {closest} ms")
    assert closest >= 1000 - CLOCKS_MS, "some 1-second window started more than 10 jobs"
    # Half again the ideal, and a second for a slow machine's wake-ups: a window lost each time would be 10 s.
    assert span_s <= ideal_s * 1.5 + 1, "the starts spread over half again as long as the limit allows"


def test_max_active_3_holds_across_3_workers_of_8_threads(queue, redis_url):
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            seen.append(queue.client.llen(queue.keys.active))
            time.sleep(0.002)

    with Fleet(queue, redis_url, 30_000, 30_000) as fleet:
        for _ in range(3):
            fleet.spawn(8, "--max-active", "3")
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        queue.add_bulk([NewJob("sleep", {"seconds": 0.1}) for _ in range(30)])
        assert wait_until(lambda: queue.counts()["completed"] == 30, 30), queue.counts()
        stop.set()
        sampler.join(5)
    print(f"\nMAX_ACTIVE 3, 3 workers x 8 threads: {len(seen)} samples, most seen {max(seen)}, "
          f"most running by the events {most_running(queue)}")
    assert max(seen) == 3, "the cap was never reached, or it was broken"
    assert most_running(queue) == 3


def test_the_slots_of_a_killed_worker_come_back_when_the_sweeper_recovers_its_jobs(queue, redis_url):
    ids = queue.add_bulk([NewJob("sleep", {"seconds": 60, "first_only": True}, JobOptions(attempts=3))
                          for _ in range(2)])
    with Fleet(queue, redis_url, 1000, 300) as fleet:
        victim = fleet.spawn(2, "--max-active", "2")
        assert wait_until(lambda: queue.counts()["active"] == 2, 10)
        victim.kill()  # SIGKILL, holding both slots
        victim.wait(5)
        more = queue.add_bulk([NewJob("noop") for _ in range(3)])
        fleet.spawn(4, "--max-active", "2")
        assert wait_until(lambda: queue.counts()["completed"] == 5, 20), queue.counts()
    recovered = sorted(ms for ms, _ in events(queue, "recovered"))
    started_after_kill = sorted(ms for ms, job_id in events(queue, "active") if job_id in more)
    assert len(recovered) == 2
    assert started_after_kill[0] >= recovered[0] - CLOCKS_MS, "a job started while the dead worker held the cap"
    assert [queue.get_job(job_id).stall_count for job_id in ids] == [1, 1]


def test_rate_limited_pauses_every_worker_and_uses_no_attempt(queue, redis_url):
    with Fleet(queue, redis_url, 30_000, 30_000) as fleet:
        for _ in range(2):
            fleet.spawn(4)
        limited = queue.add("limited", {"seconds": 1.5}, opts=JobOptions(attempts=1))
        assert wait_until(lambda: queue.client.hexists(queue.keys.meta, "limitedUntil"), 10)
        queue.add_bulk([NewJob("noop") for _ in range(20)])
        assert wait_until(lambda: queue.counts()["completed"] == 21, 20), queue.counts()
    [(limited_at, _)] = events(queue, "limited")
    until = int(queue.client.hget(queue.keys.meta, "limitedUntil"))
    starts = sorted(ms for ms, _ in events(queue, "active") if ms > limited_at)
    assert until - limited_at >= 1500 - CLOCKS_MS
    assert starts[0] >= until - CLOCKS_MS, f"a job started {until - starts[0]} ms before the pause ended"
    job = queue.get_job(limited)
    assert (job.attempts_made, job.attempts_started, queue.get_state(limited)) == (1, 2, "completed"), \
        "attempts=1 was enough"


def test_a_rate_limited_worker_waits_without_polling_redis():
    server = RedisServer()
    server.start()
    try:
        queue = Queue("q", connect(server.url), prefix="idle")
        fleet = Fleet(queue, server.url, 30_000, 600_000)
        with fleet:
            fleet.spawn(4, "--rate", "1/60000")  # the window stays shut through the measurement, however late
            queue.add_bulk([NewJob("noop") for _ in range(10)])
            assert wait_until(lambda: queue.counts()["completed"] == 1, 30)
            time.sleep(0.5)  # the worker's own round trips after its first job settle
            before = int(queue.client.info("stats")["total_commands_processed"])
            time.sleep(3)  # the measurement: how many calls this worker makes in 3 s held back
            calls = int(queue.client.info("stats")["total_commands_processed"]) - before - 1
    finally:
        server.stop()
        server.workdir.cleanup()
    print(f"\nan idle rate-limited worker (4 threads, 1 job a minute): {calls / 3:.1f} Redis calls a second")
    assert calls / 3 <= 3, f"{calls} Redis calls in 3 s while held back"


def most_running_per_group(queue) -> dict[str, int]:
    return most_running_by(queue, lambda job_id: queue.client.hget(queue.keys.job(job_id), "grp"))


def test_a_big_group_does_not_starve_a_small_one_across_workers(queue, redis_url):
    big = queue.add_bulk([NewJob("noop", opts=JobOptions(group="tenant-a")) for _ in range(10_000)])
    small = queue.add_bulk([NewJob("noop", opts=JobOptions(group="tenant-b")) for _ in range(10)])
    with Fleet(queue, redis_url, 30_000, 30_000) as fleet:
        for _ in range(2):
            fleet.spawn(4)
        assert wait_until(lambda: queue.counts()["completed"] == len(big) + len(small), 120), queue.counts()
    # The order the fetches took the jobs in: each job's processedOn, the time of the moveToActive that took
    # it (not the order the handlers began in, which a busy machine's thread scheduling shuffles; the events
    # stream keeps only the newest 10,000 entries).
    pipe = queue.client.pipeline(transaction=False)
    for job_id in big + small:
        pipe.hget(queue.keys.job(job_id), "processedOn")
    taken_at = dict(zip(big + small, (int(ms) for ms in pipe.execute())))
    last_small = max(taken_at[job_id] for job_id in small)
    before = sum(taken_at[job_id] < last_small for job_id in big) + len(small) - 1
    print(f"\n10,000 jobs of tenant A, 10 of tenant B, 2 workers x 4 threads: B's last job was taken "
          f"#{before + 1} (fetches of the same ms count as one)")
    assert before < 20 + 8, "B's 10 jobs are taken within the first 20 turns (give or take one fetch of each worker)"


def test_group_max_active_holds_across_3_workers_of_8_threads(queue, redis_url):
    queue.add_bulk([NewJob("sleep", {"seconds": 0.05}, JobOptions(group=f"t{n % 3}")) for n in range(60)])
    with Fleet(queue, redis_url, 30_000, 30_000) as fleet:
        for _ in range(3):
            fleet.spawn(8, "--group-max-active", "2")
        assert wait_until(lambda: queue.counts()["completed"] == 60, 30), queue.counts()
    most = most_running_per_group(queue)
    print(f"\nGROUP_MAX_ACTIVE 2, 3 groups, 3 workers x 8 threads: most running per group {most}")
    assert most == {"t0": 2, "t1": 2, "t2": 2}
