"""The seeds' contrast as an experiment: N sweepers at once over M marked, lockless jobs.

    python bench/race.py [--sweepers 2,8,32] [--jobs 10000] [--budget 1000] [--redis-url URL] [--json]

Two strategies, each run in N processes released together by a barrier:
  atomic      echomq's sweep: moveStalledJobsToWait-8.lua, forced (no gate)
  non-atomic  the Go port's loop, kept here only as the thing never to do:
              LRANGE, then per job EXISTS, HGETALL, atm + 1 in Python, LREM,
              LPUSH, HSET, each its own round trip
It prints, per strategy and N, the jobs recovered more than once (their id
sits in `wait` twice or more) and the lost attempt-count updates (recoveries
performed minus the attempts recorded). Every run uses a key prefix of its own
and deletes it afterwards.
"""

import argparse
import json
import multiprocessing
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from echomq_django.core import Queue, Sweeper, connect  # noqa: E402
from echomq_django.core.protocol.keys import QueueKeys  # noqa: E402

STAGE_BATCH = 5000


def stage(queue: Queue, jobs: int) -> None:
    """`jobs` jobs in active, each marked by an earlier sweep, none with a lock."""
    for start in range(1, jobs + 1, STAGE_BATCH):
        ids = [str(n) for n in range(start, min(start + STAGE_BATCH, jobs + 1))]
        pipe = queue.client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hset(queue.keys.job(job_id), mapping={"name": "race", "data": "{}", "opts": '{"attempts":5}',
                                                        "atm": 0, "stc": 0})
        pipe.lpush(queue.keys.active, *ids)
        pipe.sadd(queue.keys.stalled, *ids)
        pipe.execute()


def atomic(url: str, prefix: str, budget: int, barrier, results) -> None:
    sweeper = Sweeper(connect(url), ["race"], prefix=prefix, max_stalled_count=5, budget=budget)
    barrier.wait()
    results.put(sweeper.sweep(sweeper.targets[0], force=True).recovered)


def non_atomic(url: str, prefix: str, budget: int, barrier, results) -> None:
    """The multi-round-trip sweep. Never do this: it is here to be measured."""
    client, keys = connect(url), QueueKeys("race", prefix)
    barrier.wait()
    recovered = 0
    for job_id in client.lrange(keys.active, 0, -1):
        if client.exists(keys.lock(job_id)) == 0 and client.sismember(keys.stalled, job_id):
            attempts = int(client.hgetall(keys.job(job_id))["atm"]) + 1
            client.lrem(keys.active, 1, job_id)
            client.lpush(keys.wait, job_id)
            client.hset(keys.job(job_id), "atm", attempts)
            client.srem(keys.stalled, job_id)
            recovered += 1
    results.put(recovered)


def run(strategy, url: str, sweepers: int, jobs: int, budget: int) -> dict:
    prefix = f"race{uuid.uuid4().hex[:8]}"
    queue = Queue("race", connect(url), prefix=prefix)
    try:
        stage(queue, jobs)
        context = multiprocessing.get_context("spawn")
        barrier, results = context.Barrier(sweepers), context.Queue()
        processes = [context.Process(target=strategy, args=(url, prefix, budget, barrier, results))
                     for _ in range(sweepers)]
        started = time.perf_counter()
        for process in processes:
            process.start()
        recoveries = [results.get(timeout=600) for _ in processes]
        for process in processes:
            process.join(60)
        seconds = time.perf_counter() - started
        waiting = Counter(queue.client.lrange(queue.keys.wait, 0, -1))
        pipe = queue.client.pipeline(transaction=False)
        for n in range(1, jobs + 1):
            pipe.hget(queue.keys.job(str(n)), "atm")
        attempts = sum(int(value) for value in pipe.execute())
        return {
            "strategy": strategy.__name__.replace("_", "-"), "sweepers": sweepers, "jobs": jobs,
            "sweepers_that_recovered": sum(1 for count in recoveries if count),
            "recovered_twice": sum(1 for count in waiting.values() if count > 1),
            "lost_updates": sum(recoveries) - attempts,
            "never_recovered": jobs - len(waiting),
            "seconds": round(seconds, 2),
        }
    finally:
        queue.obliterate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweepers", default="2,8,32", help="comma-separated numbers of sweeper processes")
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--budget", type=int, default=1000,
                        help="ids one script call examines (smaller: more, shorter calls that interleave more)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    rows = [run(strategy, args.redis_url, int(n), args.jobs, args.budget)
            for n in args.sweepers.split(",") for strategy in (atomic, non_atomic)]
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'strategy':<11} {'sweepers':>8} {'jobs':>7} {'overlapped':>10} {'recovered twice':>15} "
          f"{'lost atm updates':>16} {'never recovered':>15} {'seconds':>8}")
    for row in rows:
        print(f"{row['strategy']:<11} {row['sweepers']:>8} {row['jobs']:>7} {row['sweepers_that_recovered']:>10} "
              f"{row['recovered_twice']:>15} {row['lost_updates']:>16} {row['never_recovered']:>15} "
              f"{row['seconds']:>8}")


if __name__ == "__main__":
    main()
