"""How many commands a job's fetch and finish run inside Redis: an exact count, where Redis time is not.

Redis time per job is what bench/redis_time.py measures, and on this machine it moves by a quarter between
runs; the number of commands a script runs per job does not move, and each costs one trip between Lua and
Redis (about 1 to 2.5 µs). MONITOR shows every command a script runs (client "lua"), so these tests count
them for jobs fetched and finished 1 and 32 to a call, retention at work, and fail when a change adds a
command per job. Skipped on a cluster: MONITOR reaches one node.
"""

import threading
import uuid
from collections import Counter

import pytest

from echomq_django.core import NewJob
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.scripts import Finish
from tests.helpers import take_jobs, wait_until


def commands_run_by_scripts(queue, action) -> Counter:
    """The commands (by name) the scripts ran on `queue`'s keys while `action()` ran."""
    from redis.cluster import RedisCluster

    if isinstance(queue.client, RedisCluster):
        pytest.skip("MONITOR reaches one node")
    seen: Counter = Counter()
    end = f"{queue.keys.base}monitor-end-{uuid.uuid4().hex}"
    ended = threading.Event()
    monitor = queue.client.monitor()
    monitor.__enter__()

    def watch() -> None:
        try:
            for command in monitor.listen():
                words = command["command"].split(" ")
                if end in command["command"]:
                    ended.set()
                elif command["client_type"] == "lua" and any(queue.keys.base in word for word in words[1:]):
                    seen[words[0].lower()] += 1
        except Exception:  # the connection closed at the end of the test
            pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        queue.client.exists(end)  # MONITOR is on once its own connection shows a command
        assert wait_until(ended.is_set, 10), "MONITOR showed no command"
        ended.clear()
        seen.clear()
        action()
        queue.client.exists(end)
        assert wait_until(ended.is_set, 10), "MONITOR did not show the end of the action"
    finally:
        monitor.connection.disconnect()
        watcher.join(10)
    return seen


def fetch_and_finish(queue, jobs: int, per_call: int, keep_count: int) -> Counter:
    """Commands the scripts ran to fetch and complete `jobs` ready jobs, `per_call` to a call."""
    def run() -> None:
        for n in range(jobs // per_call):
            token = f"t{n}"
            _due, taken = take_jobs(queue, token, 30_000, now_ms(), per_call, "w-count")
            assert len(taken) == per_call
            call = queue.scripts.finish_call(
                queue.keys, [Finish(job_id, token, True, "null") for job_id, _ in taken], now_ms(),
                default_attempts=3, keep_completed=(keep_count, 0))
            [codes] = queue.scripts.run_batch([call], raise_on_error=True)
            assert codes == [1] * per_call

    return commands_run_by_scripts(queue, run)


def per_job(counts: Counter, jobs: int) -> str:
    return ", ".join(f"{name} {n / jobs:.2f}" for name, n in counts.most_common())


def test_a_job_fetched_and_finished_32_to_a_call_costs_at_most_13_commands(queue):
    # The commands every job needs (LMOVE, HGETALL, SET of its lock, HSET at start and end, XADD twice, LREM,
    # HDEL, ZADD into completed) plus its share of one command per call for each set it leaves (the lock index,
    # `stalled`, one DEL of the lock keys and fetch records) and of retention's ZPOPMIN and UNLINK.
    queue.add_bulk([NewJob("n", {}) for _ in range(128 + 64)])
    fetch_and_finish(queue, 64, 32, keep_count=32)  # `completed` at its retention count from here on
    counts = fetch_and_finish(queue, 128, 32, keep_count=32)
    total = sum(counts.values())
    assert total / 128 <= 13, f"{total / 128:.2f} commands per job: {per_job(counts, 128)}"
    # The ids leave each set in one command per call (4 calls), not one per job; a finish reads its job once.
    for name, most in (("zrem", 4), ("srem", 4), ("del", 8), ("zadd", 128 + 8), ("hmget", 128 + 12)):
        assert counts[name] <= most, f"{counts[name]} {name} for 128 jobs: {per_job(counts, 128)}"


def test_a_job_fetched_and_finished_alone_costs_at_most_34_commands(queue):
    # Alone, a job also pays each call's reads and writes: the fetch record, the earliest delayed job, meta,
    # the lock index's type, the groups' ring, the marker, results past their TTL, retention's count, and the
    # metrics (an HMGET and an HSET at each end, and the all-time total).
    queue.add_bulk([NewJob("n", {}) for _ in range(40)])
    fetch_and_finish(queue, 8, 1, keep_count=8)
    counts = fetch_and_finish(queue, 32, 1, keep_count=8)
    total = sum(counts.values())
    assert total / 32 <= 34, f"{total / 32:.2f} commands per job: {per_job(counts, 32)}"
