"""What flow control costs: a queue that does not use it, against a git revision; and a fetch among many groups.

    python bench/flow_cost.py [--before REV] [--jobs 20000] [--runs 5] [--concurrency 8]
                              [--groups 1,100,10000] [--fetches 2000] [--redis-url URL] [--skip-before]

The baseline is the tree at `--before` (default a93e85a, the commit before
rate limits and caps), checked out in a temporary git worktree. Each run
enqueues `--jobs` no-op jobs and times one Worker process (burst, concurrency
8, its default retention) draining them; the two trees' runs alternate, so a
busy moment of the machine costs each alike. Printed: jobs/s of every run, the
medians and their ratio (this tree / baseline). The issue's bar: no more than
5% slower.

Then the fetch among groups: a queue with G groups of jobs (G from `--groups`;
every group holds enough jobs for the whole run), `--fetches` fetches of 8 jobs
each, as a worker sends them; printed: Redis time per job taken (the EVALSHA
usec of INFO commandstats, so measure on a Redis nobody else uses), against
the same fetches from a queue without groups (the baseline, in the same run).
The jobs go under prefixes of their own, deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.measure import parse_rate, script_time  # noqa: E402
from echomq_django.core import JobOptions, NewJob, Queue, connect, now_ms  # noqa: E402

# A worker of the tree on sys.path[0] (PYTHONPATH), draining the queue once.
_WORKER = """
import sys, time
from echomq_django.core import Queue, Worker, connect
url, prefix, jobs, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
client = connect(url)
try:
    from echomq_django.core import WorkerOptions
    def options(**given): return {"options": WorkerOptions(**given)}
except ImportError:  # a tree from before WorkerOptions: Worker took them as keyword arguments
    def options(**given): return given
worker = Worker("work", lambda job: None, client, **options(prefix=prefix, concurrency=concurrency))
started = time.perf_counter()
done = worker.run(burst=True)
elapsed = time.perf_counter() - started
assert done == jobs, (done, jobs)
print(f"RATE {jobs / elapsed:.1f}")
"""


def drain_rate(tree: Path, url: str, jobs: int, concurrency: int) -> float:
    """jobs/s of one Worker process of `tree` draining `jobs` fresh no-op jobs."""
    prefix = f"flowbench{uuid.uuid4().hex[:8]}"
    queue = Queue("work", connect(url), prefix=prefix)
    try:
        for at in range(0, jobs, 10_000):
            queue.add_bulk([NewJob("noop") for _ in range(min(10_000, jobs - at))])
        proc = subprocess.run([sys.executable, "-c", _WORKER, url, prefix, str(jobs), str(concurrency)],
                              capture_output=True, text=True, timeout=jobs / 100 + 60, cwd=tree,
                              env={**os.environ, "PYTHONPATH": str(tree)})
        return parse_rate(proc)
    finally:
        queue.obliterate()


def fetch_cost_us(url: str, groups: int, fetches: int, batch: int = 8) -> float:
    """Redis time (us) per job taken, fetching `batch` at a time from a queue with `groups` groups (0: none)."""
    client = connect(url)
    queue = Queue("work", client, prefix=f"groupbench{uuid.uuid4().hex[:8]}")
    jobs = fetches * batch
    try:
        per_group = -(-jobs // groups) if groups else jobs
        for group in range(groups or 1):
            options = JobOptions(group=f"g{group}") if groups else JobOptions()
            left = per_group
            while left:
                queue.add_bulk([NewJob("noop", opts=options) for _ in range(min(left, 10_000))])
                left -= min(left, 10_000)
        calls = [queue.scripts.fetch_call(queue.keys, f"t{n}", 30_000, now_ms(), batch, "bench")
                 for n in range(fetches)]
        timed, taken = script_time(client, lambda: [queue.scripts.run_batch([call]) for call in calls])
        assert sum(len(queue.scripts.fetched(reply)[2]) for [reply] in taken) == jobs
        return timed.total_ms * 1000 / jobs
    finally:
        queue.obliterate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="a93e85a")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--groups", default="1,100,10000")
    parser.add_argument("--fetches", type=int, default=2000)
    parser.add_argument("--skip-before", action="store_true", help="only the fetch among groups")
    parser.add_argument("--redis-url", default=os.environ.get("ECHOMQ_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = parser.parse_args()
    if not args.skip_before:
        unlimited(args)
    baseline = statistics.median(fetch_cost_us(args.redis_url, 0, args.fetches) for _ in range(3))
    print(f"fetch of 8 jobs, Redis time per job taken: no groups (baseline) {baseline:.1f} us")
    for groups in map(int, args.groups.split(",")):
        cost = statistics.median(fetch_cost_us(args.redis_url, groups, args.fetches) for _ in range(3))
        print(f"{groups:>6,} groups: {cost:.1f} us per job, {cost / baseline:.2f}x the baseline")


def unlimited(args: argparse.Namespace) -> None:
    """No-op jobs/s of this tree against --before, no limits set."""
    with tempfile.TemporaryDirectory(prefix="echomq-before-") as scratch:
        before = Path(scratch) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=BENCH.parent,
                       check=True, capture_output=True)
        try:
            rates: dict[str, list[float]] = {"before": [], "this tree": []}
            for run in range(args.runs):
                order = [("before", before), ("this tree", BENCH.parent)]
                for name, tree in order if run % 2 == 0 else reversed(order):
                    rates[name].append(drain_rate(tree, args.redis_url, args.jobs, args.concurrency))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=BENCH.parent, check=True)
    for name, values in rates.items():
        print(f"{name:>10}: " + ", ".join(f"{value:,.0f}" for value in values)
              + f" jobs/s; median {statistics.median(values):,.0f}")
    ratio = statistics.median(rates["this tree"]) / statistics.median(rates["before"])
    print(f"unlimited queue, {args.jobs:,} no-op jobs, concurrency {args.concurrency}: this tree / {args.before} "
          f"= {ratio:.3f}")


if __name__ == "__main__":
    main()
