"""Aggregate jobs/s on a Redis Cluster of 1, 2 and 3 masters, with queues spread over them.

    python bench/cluster_throughput.py [--masters 1,2,3] [--queues 6] [--jobs 10000] [--concurrency 16] [--runs 3]

For each size a fresh cluster (masters only) is started on free loopback
ports. The queues are chosen so that each master owns as many of them as the
next. Every queue gets `--jobs` no-op jobs; then one worker process per queue
(the real Worker, `--concurrency` threads, burst mode) drains it, all started
together; each size is measured `--runs` times and the median run is
shown. Printed per size: the aggregate jobs/s and its ratio to the
1-master baseline of the same run; the busiest master's CPU (Redis's own
used_cpu_user + used_cpu_sys over the drain); and the jobs/s that master
could carry at 100% CPU, which is what grows with masters when the workers
have cores of their own. On a small machine the workers and the servers
share the cores, so the measured jobs/s is bounded by the machine, not by Redis.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from echomq_django.core import NewJob, Queue, Retention, Worker, WorkerOptions, connect  # noqa: E402
from tests.redis_servers import ClusterServers  # noqa: E402

PREFIX = "bench"


def drain(url: str, name: str, concurrency: int, start: multiprocessing.Event) -> None:
    client = connect(url)
    worker = Worker(name, lambda job: None, client, WorkerOptions(prefix=PREFIX, concurrency=concurrency,
                                                                  keep_completed=Retention(count=0)))
    start.wait()
    worker.run(burst=True)


def cpu_seconds(port: int) -> float:
    with redis.Redis(port=port) as node:
        info = node.info("cpu")
    return info["used_cpu_user"] + info["used_cpu_sys"]


def measure(masters: int, queues: int, jobs: int, concurrency: int) -> tuple[float, float]:
    """(aggregate jobs/s, busiest master's CPU share during the drain)."""
    cluster = ClusterServers(masters=masters, replicas=0)
    cluster.start()
    try:
        client = connect(cluster.url)
        names = cluster.queues_on_each_master(client, PREFIX, queues // masters)
        for name in names:
            queue = Queue(name, client, prefix=PREFIX)
            for start in range(0, jobs, 5000):
                queue.add_bulk([NewJob("noop") for _ in range(min(5000, jobs - start))])
        start = multiprocessing.Event()
        processes = [multiprocessing.Process(target=drain, args=(cluster.url, name, concurrency, start))
                     for name in names]
        for process in processes:
            process.start()
        time.sleep(1.0)  # let every worker connect and load its scripts
        cpu_before = [cpu_seconds(node.port) for node in cluster.masters]
        began = time.perf_counter()
        start.set()
        for process in processes:
            process.join()
        elapsed = time.perf_counter() - began
        cpu_after = [cpu_seconds(node.port) for node in cluster.masters]
        done = sum(Queue(name, client, prefix=PREFIX).counts()["wait"] == 0 for name in names)
        if done != len(names) or any(process.exitcode for process in processes):
            raise SystemExit(f"{masters} masters: a worker failed or left jobs behind")
        busiest = max(after - before for before, after in zip(cpu_before, cpu_after)) / elapsed
        return queues * jobs / elapsed, busiest
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masters", default="1,2,3")
    parser.add_argument("--queues", type=int, default=6, help="a multiple of every size in --masters")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs per queue")
    parser.add_argument("--concurrency", type=int, default=16, help="threads per worker process")
    parser.add_argument("--runs", type=int, default=3, help="runs per size; the median is shown")
    args = parser.parse_args()
    sizes = [int(size) for size in args.masters.split(",")]
    if any(args.queues % size for size in sizes):
        parser.error(f"--queues {args.queues} cannot be spread evenly over {sizes} masters")
    print(f"{args.queues} queues x {args.jobs} no-op jobs, one worker process per queue "
          f"(concurrency {args.concurrency}), {multiprocessing.cpu_count()} CPU cores\n")
    print(f"{'masters':>7}  {'jobs/s':>8}  {f'vs {sizes[0]}':>11}  {'busiest master CPU':>18}  "
          f"{'jobs/s at 100% CPU':>18}")
    baseline = None
    for size in sizes:
        runs = sorted(measure(size, args.queues, args.jobs, args.concurrency) for _ in range(args.runs))
        rate, busiest = runs[len(runs) // 2]
        baseline = baseline or rate
        ceiling = rate / busiest if busiest else float("inf")
        print(f"{size:>7}  {rate:>8,.0f}  {rate / baseline:>10.2f}x  {busiest:>17.0%}  {ceiling:>18,.0f}",
              flush=True)


if __name__ == "__main__":
    main()
