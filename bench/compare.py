"""echomq side by side with BullMQ (and RQ) on the same Redis, in one run: the table of issue 6.

    pip install -e ".[bench]"     # BullMQ's Python package, RQ, matplotlib
    python bench/compare.py [--redis-url URL] [--plot docs/performance-sweep.png] [--quick]
                            [--bullmq-dead-100k] [--echomq-only] [--json]

Every figure is measured for echomq and for the peer in this run, on this Redis,
and printed as a ratio against the peer with the target beside it. Redis-side
script time (how long every other client had to wait) is read from Redis:
the total from INFO commandstats, the longest single call from SLOWLOG.
Use a Redis nothing else is using while it runs.

  sweep, steady   N active jobs, all locked, and the state the previous sweep left
                  (no lock renewal in between): echomq reads the lapsed ids from its
                  lock index and finds none; BullMQ checks the lock of each of its
                  marks and re-marks the whole list. Printed too: BullMQ with its
                  marks cleared by renewals (its cheapest sweep), and echomq without
                  the index (how it sweeps ids another client put in `active`).
  sweep, recover  N jobs marked by an earlier sweep whose locks are gone: one sweep
                  (one forced sweep for echomq, in bounded calls) recovers them all.
                  10,000: each side's median of three runs.
  worker          no-op jobs through one worker process, already enqueued; each
                  queue's best of concurrency 1, 16 and 64.
  bulk enqueue    jobs/s of add_bulk / addBulk, 1,000 jobs per call to BullMQ.
  memory          Redis used_memory growth per waiting job after the bulk enqueue.

Then the figures a user feels, beside Huey, Dramatiq, Celery, RQ and BullMQ, on a
private Redis of their own (bench/everyday.py, which also runs alone): single
enqueue, pickup latency, no-op throughput at concurrency 1, 8 and 32, 50 ms jobs
at concurrency 32, and this machine's round-trip limits. --everyday-only runs
just those, --no-everyday leaves them out.

BullMQ's recovery of 100,000 dead jobs takes minutes in one script (Redis answers
BUSY to everyone meanwhile), so it runs only with --bullmq-dead-100k.
--quick uses small sizes and --echomq-only skips the peers: the test suite runs
both to keep this script working; their numbers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from measure import ScriptTime, drop, parse_rate, script_time, slowlog_on, used_memory  # noqa: E402
from sweep_cost import stage  # noqa: E402

from echomq_django.core import NewJob, Queue, Sweeper, connect  # noqa: E402
from echomq_django.core.protocol.keys import QueueKeys  # noqa: E402


@dataclass
class Row:
    figure: str
    echomq: str
    peer: str
    ratio: float | None
    target: str
    met: bool | None


# ---------------------------------------------------------------- echomq's side

def echomq_sweep(url: str, size: int, *, dead: bool, walk: bool = False) -> tuple[ScriptTime, int]:
    """One forced sweep over `size` active jobs (locked, or marked and lockless); (Redis time, recovered).

    With `walk`, the lock index is left out, so the sweep tests every lock key.
    """
    client = connect(url)
    prefix = f"cmp{uuid.uuid4().hex[:10]}"
    keys = QueueKeys("sweep", prefix)
    try:
        stage(client, keys, size, locked=not dead, marked=dead)
        if walk:
            client.delete(keys.locks)
        sweeper = Sweeper(client, [keys.queue], prefix=prefix)
        # Log every call: a steady sweep's calls are far below the usual 100 us threshold.
        with slowlog_on(client, threshold_us=0 if not dead else 100):
            timing, report = script_time(client, lambda: sweeper.sweep(sweeper.targets[0], force=True))
        assert report.recovered == (size if dead else 0) and report.marked == 0, report
        return timing, report.recovered
    finally:
        drop(client, f"{prefix}:*")


def echomq_add_bulk_rate(url: str, jobs: int) -> tuple[float, float]:
    """(jobs/s, bytes of Redis memory per waiting job) of add_bulk."""
    client = connect(url)
    queue = Queue("bulk", client, prefix=f"cmp{uuid.uuid4().hex[:10]}")
    new = [NewJob("bench", {"n": n}) for n in range(jobs)]
    try:
        before = used_memory(client)
        started = time.perf_counter()
        for at in range(0, jobs, 10_000):
            queue.add_bulk(new[at:at + 10_000])
        rate = jobs / (time.perf_counter() - started)
        per_job = (used_memory(client) - before) / jobs
        assert queue.counts()["wait"] == jobs
        return rate, per_job
    finally:
        queue.obliterate()


_ECHOMQ_WORKER = """
import sys, time
from echomq_django.core import Worker, WorkerOptions, connect
url, prefix, jobs, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
worker = Worker("work", lambda job: None, connect(url), WorkerOptions(prefix=prefix, concurrency=concurrency))
started = time.perf_counter()
done = worker.run(burst=True)
elapsed = time.perf_counter() - started
if done != jobs:
    sys.exit(f"the worker finished {done} jobs of {jobs}")
print(f"RATE {jobs / elapsed}")
"""


def echomq_worker_rate(url: str, jobs: int, concurrency: int) -> float:
    """jobs/s of one echomq worker process draining `jobs` enqueued no-op jobs."""
    client = connect(url)
    queue = Queue("work", client, prefix=f"cmp{uuid.uuid4().hex[:10]}")
    try:
        for at in range(0, jobs, 10_000):
            queue.add_bulk([NewJob("noop") for _ in range(min(10_000, jobs - at))])
        proc = subprocess.run([sys.executable, "-c", _ECHOMQ_WORKER, url, queue.keys.prefix, str(jobs),
                               str(concurrency)], capture_output=True, text=True, timeout=jobs / 200 + 60,
                              cwd=BENCH.parent)
        return parse_rate(proc)
    finally:
        queue.obliterate()


def median_run(measure: Callable[[], ScriptTime], runs: int = 3) -> ScriptTime:
    """The run with the median Redis time of `runs` runs."""
    return sorted((measure() for _ in range(runs)), key=lambda t: t.total_ms)[runs // 2]


# ---------------------------------------------------------------- the table

def ratio_row(figure: str, ours: float, theirs: float | None, unit: str, target: str,
              limit: float | None = None, higher_is_better: bool = False) -> Row:
    """A row comparing `ours` with `theirs`: met when ours/theirs is within `limit` (<= or >=).

    Without a limit the row is context, with no target to meet.
    """
    if theirs is None:
        return Row(figure, f"{number(ours)} {unit}", "not measured", None, target, None)
    ratio = ours / theirs if theirs else math.inf
    met = None if limit is None else ratio >= limit if higher_is_better else ratio <= limit
    return Row(figure, f"{number(ours)} {unit}", f"{number(theirs)} {unit}", ratio, target, met)


def number(value: float) -> str:
    """Two decimals below 10 (a sweep of a fraction of a millisecond), one above."""
    return f"{value:,.2f}" if value < 10 else f"{value:,.1f}"


def print_table(rows: list[Row]) -> None:
    widths = [max(len(getattr(row, col)) for row in rows + [Row("figure", "echomq", "BullMQ", 0, "target", 0)])
              for col in ("figure", "echomq", "peer", "target")]
    header = ("figure", "echomq", "BullMQ", "ratio", "target", "")
    print(f"{header[0]:<{widths[0]}}  {header[1]:>{widths[1]}}  {header[2]:>{widths[2]}}  {'ratio':>7}  "
          f"{header[4]:<{widths[3]}}  met")
    for row in rows:
        ratio = "" if row.ratio is None else f"{row.ratio:.3f}"
        met = {True: "yes", False: "NO", None: "-"}[row.met]
        print(f"{row.figure:<{widths[0]}}  {row.echomq:>{widths[1]}}  {row.peer:>{widths[2]}}  {ratio:>7}  "
              f"{row.target:<{widths[3]}}  {met}")


def plot(path: Path, sizes: list[int], ours: list[ScriptTime], walk: list[ScriptTime],
         theirs: list[ScriptTime] | None, cleared: list[ScriptTime] | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    lines = [(ours, "o-", "tab:blue", "echomq (lock index)"),
             (walk, "o--", "tab:cyan", "echomq walking every lock (no index)")]
    if theirs and cleared:
        lines += [(theirs, "s-", "tab:red", "BullMQ, marks left by the previous sweep"),
                  (cleared, "s--", "tab:orange", "BullMQ, marks cleared by renewals")]
    for times, style, color, label in lines:
        axis.plot(sizes, [t.total_ms for t in times], style, color=color, label=label)
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("jobs in active, all locked")
    axis.set_ylabel("Redis time per sweep, ms")
    axis.set_title("Steady sweep: Redis time against the size of the active list")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path)
    print(f"plot written to {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--plot", type=Path, default=BENCH.parent / "docs" / "performance-sweep.png")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script runs")
    parser.add_argument("--echomq-only", action="store_true", help="measure echomq alone (no peers installed)")
    parser.add_argument("--bullmq-dead-100k", action="store_true", help="also time BullMQ recovering 100,000")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    parser.add_argument("--everyday-only", action="store_true", help="only the figures a user feels (everyday.py)")
    parser.add_argument("--no-everyday", action="store_true", help="leave out the figures a user feels")
    args = parser.parse_args()
    if not args.no_everyday:
        import everyday

        result = everyday.run(quick=args.quick, only=["echomq"] if args.echomq_only else None)
        everyday.print_tables(result)
        if args.json:
            print(json.dumps(result, indent=1))
        if not args.quick:
            everyday.plot(result, args.plot.with_name("performance-everyday.png"))
        if args.everyday_only:
            return
    url = args.redis_url
    peers = None
    if not args.echomq_only:
        try:
            import peers
        except ImportError as error:
            sys.exit(f"the peers are not installed ({error}); pip install -e '.[bench]', or run --echomq-only")

    steady_sizes = [200, 2000] if args.quick else [1_000, 3_000, 10_000, 30_000, 100_000]
    small_dead, big_dead = (500, 2000) if args.quick else (10_000, 100_000)
    bulk_jobs, worker_jobs, peer_worker_jobs, rq_jobs = (
        (2_000, 1_000, 500, 50) if args.quick else (100_000, 30_000, 5_000, 300))
    client = connect(url)
    print(f"Redis {client.info('server')['redis_version']} at {url}; python {sys.version.split()[0]}")
    rows: list[Row] = []

    # Steady sweeps, for the table and the plot.
    ours_steady = [echomq_sweep(url, size, dead=False)[0] for size in steady_sizes]
    ours_walk = [echomq_sweep(url, size, dead=False, walk=True)[0] for size in steady_sizes]
    theirs_steady = theirs_cleared = theirs_cleared_all = None
    if peers:
        theirs_steady = [peers.bullmq_sweep(url, size, dead=False, marks_left=True)[0] for size in steady_sizes]
        theirs_cleared_all = [peers.bullmq_sweep(url, size, dead=False)[0] for size in steady_sizes]
        theirs_cleared = theirs_cleared_all[-1]
    big, small = ours_steady[-1], ours_steady[0]
    n = f"{steady_sizes[-1]:,}"
    rows.append(ratio_row(f"steady sweep {n}: longest script", big.longest_ms,
                          theirs_steady and theirs_steady[-1].longest_ms, "ms", "<= 0.15 x", 0.15, False))
    rows.append(ratio_row(f"steady sweep {n}: Redis time per sweep", big.total_ms,
                          theirs_steady and theirs_steady[-1].total_ms, "ms", "<= 1 x", 1.0, False))
    rows.append(ratio_row(f"  (BullMQ marks cleared by renewals) {n}", big.total_ms,
                          theirs_cleared and theirs_cleared.total_ms, "ms", "(context)"))
    rows.append(ratio_row(f"  (echomq walking every lock, no index) {n}", ours_walk[-1].total_ms,
                          theirs_cleared and theirs_cleared.total_ms, "ms", "(context)"))
    growth = big.longest_ms / small.longest_ms
    size_ratio = steady_sizes[-1] / steady_sizes[0]
    rows.append(Row(f"steady longest script, {steady_sizes[0]:,} -> {n}", f"x {growth:.2f}",
                    f"x {theirs_steady[-1].longest_ms / theirs_steady[0].longest_ms:.2f}" if theirs_steady
                    else "not measured", None, f"flat or log (jobs x {size_ratio:,.0f})",
                    growth <= 1 + math.log10(size_ratio)))

    # Recovery of marked dead jobs.
    # Each side's median of three runs: a single run of either varies by 20-40% on a shared machine.
    ours_small = median_run(lambda: echomq_sweep(url, small_dead, dead=True)[0])
    theirs_small = median_run(lambda: peers.bullmq_sweep(url, small_dead, dead=True)[0]) if peers else None
    rows.append(ratio_row(f"recover {small_dead:,} dead: Redis time", ours_small.total_ms,
                          theirs_small and theirs_small.total_ms, "ms", "<= 0.2 x", 0.2, False))
    ours_big, _ = echomq_sweep(url, big_dead, dead=True)
    theirs_big = peers.bullmq_sweep(url, big_dead, dead=True)[0] if peers and args.bullmq_dead_100k else None
    rows.append(ratio_row(f"recover {big_dead:,} dead: wall time of the sweep", ours_big.wall_ms,
                          theirs_big and theirs_big.wall_ms, "ms", "< 3000 ms"))
    rows[-1].met = ours_big.wall_ms < 3000
    rows.append(Row(f"recover {big_dead:,} dead: longest script", f"{ours_big.longest_ms:,.1f} ms",
                    f"{theirs_big.longest_ms:,.1f} ms" if theirs_big else "not measured", None, "<= 50 ms",
                    ours_big.longest_ms <= 50))

    # Worker throughput: each queue's best of three concurrencies.
    levels = (1, 16, 64)
    ours_rates = {c: echomq_worker_rate(url, worker_jobs, c) for c in levels}
    theirs_rates = {c: peers.bullmq_worker_rate(url, peer_worker_jobs, c) for c in levels} if peers else None
    rows.append(ratio_row("worker, no-op jobs/s (best of conc. 1, 16, 64)", max(ours_rates.values()),
                          theirs_rates and max(theirs_rates.values()), "jobs/s", ">= 5 x", 5.0, True))
    for c in levels:
        rows.append(ratio_row(f"  worker at concurrency {c}", ours_rates[c], theirs_rates and theirs_rates[c],
                              "jobs/s", "(context)"))
    if peers:
        rq_rate = peers.rq_worker_rate(url, rq_jobs)
        rows.append(Row("  RQ's default (forking) worker", "", f"{rq_rate:,.1f} jobs/s", None, "(context)", None))

    # Bulk enqueue and memory per waiting job.
    ours_bulk, ours_bytes = echomq_add_bulk_rate(url, bulk_jobs)
    theirs_bulk, theirs_bytes = peers.bullmq_add_bulk_rate(url, bulk_jobs) if peers else (None, None)
    rows.append(ratio_row(f"bulk enqueue of {bulk_jobs:,}", ours_bulk, theirs_bulk, "jobs/s", ">= 3 x", 3.0, True))
    rows.append(ratio_row("Redis memory per waiting job", ours_bytes, theirs_bytes, "B", "<= 1 x", 1.0, False))

    print()
    print_table(rows)
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=1))
    if not args.quick:
        plot(args.plot, steady_sizes, ours_steady, ours_walk, theirs_steady, theirs_cleared_all)
    missed = [row.figure for row in rows if row.met is False]
    if missed and not args.quick:
        print(f"\ntargets missed: {', '.join(missed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
