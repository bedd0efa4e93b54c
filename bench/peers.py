"""The same costs measured on two peer queues, BullMQ (Python package, Lua scripts) and RQ.

bullmq_sweep          Redis time of ONE call of BullMQ's stalled-job sweep (its own Lua,
                      moveStalledJobsToWait-9.lua, called through bullmq's Scripts class), with
                      `size` jobs in the active list. steady: every job is alive (locked) and the
                      stalled set is empty, so the sweep only re-marks the whole active list.
                      dead: nobody holds a lock and every id was marked by an earlier sweep, so
                      this sweep moves them all back to wait.
bullmq_add_bulk_rate  Queue.addBulk throughput (jobs/s) and Redis memory per waiting job.
bullmq_worker_rate    jobs/s of one bullmq Worker (asyncio, no-op processor) at a concurrency,
                      in its own process, from worker start until the last job completed.
rq_worker_rate        jobs/s of one RQ burst worker with RQ's default Worker class (it forks a
                      work horse per job, which is what RQ users get), in its own process.

Why staging the sweep by hand is fair: the sweep script only looks at the active list, the
stalled set, the `<id>:lock` keys and the job hashes, and the staged keys are exactly what
BullMQ leaves there. After addBulk a job hash holds name, data, opts, timestamp, delay,
priority; moveToActive (RPOPLPUSH wait -> active, so the active list runs newest to oldest)
adds processedOn and ats=1 and sets `<id>:lock` to "<worker id>:<n>" with PX lockDuration.
A worker's lock renewal (extendLocks-1.lua) SREMs its ids from the stalled set, so in steady
state the set is empty when the sweep runs; a dead worker's jobs keep the mark the previous
sweep left and have no lock. Staging (pipelined, not measured) only saves running a real
worker through `size` jobs first.

Every function uses a fresh random prefix (or RQ job ids / queue name) and deletes its keys
at the end, even on error. Timings come from measure.py: Redis-side EVALSHA time from INFO
commandstats and the longest top-level EVALSHA from SLOWLOG, so use an otherwise idle Redis.
Try alone with `python bench/peers.py [redis url]`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from urllib.parse import urlsplit

import redis
from bullmq import Queue
from bullmq.redis_connection import RedisConnection, loadScript
from bullmq.scripts import Scripts
from measure import ScriptTime, drop, parse_rate, script_time, slowlog_on, used_memory

STAGE_BATCH = 5000
ADD_BULK_CHUNK = 1000
QUEUE = "peers"


def _prefix() -> str:
    """A fresh BullMQ key prefix; keys are '<prefix>:<queue>:...'. Hex only, so safe in a SCAN pattern."""
    return f"peerbench{uuid.uuid4().hex[:12]}"


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


# ---------------------------------------------------------------- BullMQ stalled sweep

def _stage_active(client: redis.Redis, base: str, size: int, *, dead: bool, marked: bool) -> None:
    """Leave `size` jobs in '<base>active' as BullMQ's moveToActive would (base = '<prefix>:<queue>:')."""
    now = int(time.time() * 1000)
    worker_id = uuid.uuid4().hex
    opts = json.dumps({"delay": 0, "attempts": 0}, separators=(",", ":"))
    client.hset(f"{base}meta", "opts.maxLenEvents", 10000)
    client.set(f"{base}id", size)
    for start in range(1, size + 1, STAGE_BATCH):
        ids = [str(i) for i in range(start, min(start + STAGE_BATCH, size + 1))]
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hset(f"{base}{job_id}", mapping={
                "name": "bench", "data": json.dumps({"n": int(job_id)}, separators=(",", ":")), "opts": opts,
                "timestamp": now, "delay": 0, "priority": 0, "processedOn": now + 1, "ats": 1,
            })
            if not dead:
                pipe.set(f"{base}{job_id}:lock", f"{worker_id}:{job_id}", px=600_000)
        # RPOPLPUSH puts each newly taken job at the head: the oldest job ends up at the tail.
        pipe.lpush(f"{base}active", *ids)
        if marked:
            pipe.sadd(f"{base}stalled", *ids)
        pipe.execute()


def bullmq_sweep(url: str, size: int, *, dead: bool, marks_left: bool = False) -> tuple[ScriptTime, int]:
    """One moveStalledJobsToWait over `size` active jobs; returns (its Redis time, jobs it recovered).

    With `marks_left` (steady case only) the stalled set still holds every id, as the previous
    sweep left it when no lock renewal ran in between: the sweep then checks each mark's lock too.
    """
    client = _client(url)
    prefix = _prefix()
    loop = asyncio.new_event_loop()
    connection = RedisConnection(url)  # its async client connects lazily, on `loop`
    try:
        # BullMQ's own Scripts class, so the keys/args and the Lua are exactly what a Worker sends.
        scripts = Scripts(prefix, QUEUE, connection)
        base = scripts.keys[""]
        _stage_active(client, base, size, dead=dead, marked=dead or marks_left)
        assert client.llen(f"{base}active") == size
        assert client.scard(f"{base}stalled") == (size if dead or marks_left else 0)
        # Load the script first so the measured window holds one EVALSHA and no NOSCRIPT retry.
        sha = client.script_load(loadScript("moveStalledJobsToWait-9.lua"))
        assert sha == connection.commands["moveStalledJobsToWait"].sha
        client.delete(f"{base}stalled-check")
        # maxStalledCount far above 1 so no job gets the deferred-failure mark; 30 s is the default interval.
        with slowlog_on(client):
            timing, recovered = script_time(
                client, lambda: loop.run_until_complete(scripts.moveStalledJobsToWait(1_000_000, 30_000)))
        if dead:
            assert len(recovered) == size and client.llen(f"{base}wait") == size
        else:
            assert not recovered and client.scard(f"{base}stalled") == size
        return timing, len(recovered)
    finally:
        loop.run_until_complete(connection.close())
        loop.close()
        drop(client, f"{prefix}:*")
        client.close()


# ---------------------------------------------------------------- BullMQ addBulk

async def _add_bulk(url: str, prefix: str, jobs: int, counter: list[float] | None = None) -> None:
    """addBulk `jobs` jobs in chunks; if `counter` is given, append the seconds the adds took."""
    queue = Queue(QUEUE, {"connection": url, "prefix": prefix})
    try:
        started = time.perf_counter()
        for start in range(0, jobs, ADD_BULK_CHUNK):
            await queue.addBulk([{"name": "bench", "data": {"n": i}}
                                 for i in range(start, min(start + ADD_BULK_CHUNK, jobs))])
        if counter is not None:
            counter.append(time.perf_counter() - started)
    finally:
        await queue.close()


def bullmq_add_bulk_rate(url: str, jobs: int) -> tuple[float, int]:
    """Returns (jobs/s through Queue.addBulk, bytes of Redis memory per waiting job)."""
    client = _client(url)
    prefix = _prefix()
    try:
        before = used_memory(client)
        seconds: list[float] = []
        asyncio.run(_add_bulk(url, prefix, jobs, seconds))
        after = used_memory(client)
        waiting = client.llen(f"{prefix}:{QUEUE}:wait")
        if waiting != jobs:
            raise RuntimeError(f"addBulk left {waiting} jobs in wait, expected {jobs}")
        return jobs / seconds[0], round((after - before) / jobs)
    finally:
        drop(client, f"{prefix}:*")
        client.close()


# ---------------------------------------------------------------- BullMQ worker

_BULLMQ_WORKER = """
import asyncio, sys, time
from bullmq import Worker

url, prefix, queue, jobs, concurrency = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])

async def process(job, token):
    return None

async def main():
    done = asyncio.Event()
    completed = 0
    failures = []

    def on_completed(job, result):
        nonlocal completed
        completed += 1
        if completed >= jobs:
            done.set()

    def on_failed(job, error):
        failures.append(error)
        done.set()

    started = time.perf_counter()
    worker = Worker(queue, process, {"connection": url, "prefix": prefix, "concurrency": concurrency,
                                     "removeOnComplete": {"count": 1000}})
    worker.on("completed", on_completed)
    worker.on("failed", on_failed)
    await done.wait()
    elapsed = time.perf_counter() - started
    await worker.close()
    if failures:
        sys.exit(f"job failed: {failures[0]!r}")
    print(f"RATE {jobs / elapsed}")

asyncio.run(main())
"""


def bullmq_worker_rate(url: str, jobs: int, concurrency: int) -> float:
    """jobs/s of one bullmq Worker (own process) draining `jobs` pre-enqueued no-op jobs."""
    client = _client(url)
    prefix = _prefix()
    try:
        asyncio.run(_add_bulk(url, prefix, jobs))
        proc = subprocess.run(
            [sys.executable, "-c", _BULLMQ_WORKER, url, prefix, QUEUE, str(jobs), str(concurrency)],
            capture_output=True, text=True, timeout=jobs / 200 + 60)
        return parse_rate(proc)
    finally:
        drop(client, f"{prefix}:*")
        client.close()


# ---------------------------------------------------------------- RQ worker

_RQ_WORKER = """
import sys, time
import redis
from rq import Worker

url, queue, name, jobs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
worker = Worker([queue], name=name, connection=redis.Redis.from_url(url))
started = time.perf_counter()
# WARNING instead of the default INFO: the BullMQ worker logs nothing per job either.
worker.work(burst=True, logging_level="WARNING")
elapsed = time.perf_counter() - started
print(f"RATE {jobs / elapsed}")
"""

_RQ_TASK = "def noop():\n    return None\n"


def _with_db(url: str, db: int) -> str:
    return urlsplit(url)._replace(path=f"/{db}").geturl()


def rq_worker_rate(url: str, jobs: int) -> float:
    """jobs/s of one RQ burst worker (default forking Worker, own process) on `jobs` no-op jobs, in DB 3."""
    from rq import Queue as RQQueue
    from rq.registry import FailedJobRegistry, FinishedJobRegistry

    rq_url = _with_db(url, 3)
    tag = f"peerbench{uuid.uuid4().hex[:12]}"  # in the queue name, every job id and the worker name
    client = redis.Redis.from_url(rq_url)  # RQ stores pickles: no decode_responses
    try:
        with tempfile.TemporaryDirectory() as module_dir:
            with open(os.path.join(module_dir, f"{tag}_task.py"), "w") as module:
                module.write(_RQ_TASK)
            queue = RQQueue(tag, connection=client)
            for start in range(0, jobs, STAGE_BATCH):
                queue.enqueue_many([RQQueue.prepare_data(f"{tag}_task.noop", job_id=f"{tag}-{i}")
                                    for i in range(start, min(start + STAGE_BATCH, jobs))])
            if queue.count != jobs:
                raise RuntimeError(f"RQ queue holds {queue.count} jobs, expected {jobs}")
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (module_dir, env.get("PYTHONPATH")) if p)
            proc = subprocess.run([sys.executable, "-c", _RQ_WORKER, rq_url, tag, f"{tag}-worker", str(jobs)],
                                  capture_output=True, text=True, timeout=jobs / 20 + 60, env=env, cwd=module_dir)
            rate = parse_rate(proc)
            finished, failed = FinishedJobRegistry(queue=queue).count, FailedJobRegistry(queue=queue).count
            if finished != jobs:
                raise RuntimeError(f"RQ finished {finished} of {jobs} jobs ({failed} failed)")
            return rate
    finally:
        drop(client, f"*{tag}*")
        client.srem("rq:queues", f"rq:queue:{tag}")
        client.srem("rq:workers", f"rq:worker:{tag}-worker")
        client.delete("rq:clean_groups")  # the worker's maintenance lock (10 min TTL), in our DB 3
        client.close()


# ---------------------------------------------------------------- try alone

def main(url: str) -> None:
    for size in (1000, 10_000):
        for dead in (False, True):
            timing, recovered = bullmq_sweep(url, size, dead=dead)
            print(f"bullmq sweep  size={size:>6} {'dead  ' if dead else 'steady'}  calls={timing.calls} "
                  f"redis={timing.total_ms:9.2f} ms  longest={timing.longest_ms:9.2f} ms  "
                  f"wall={timing.wall_ms:9.2f} ms  recovered={recovered}")
    rate, per_job = bullmq_add_bulk_rate(url, 20_000)
    print(f"bullmq addBulk  20000 jobs: {rate:9.0f} jobs/s  {per_job} bytes/waiting job")
    for concurrency in (1, 16):
        print(f"bullmq worker   5000 jobs, concurrency {concurrency:>2}: "
              f"{bullmq_worker_rate(url, 5000, concurrency):7.0f} jobs/s")
    print(f"rq worker        500 jobs (forking Worker): {rq_worker_rate(url, 500):7.0f} jobs/s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379/0")
