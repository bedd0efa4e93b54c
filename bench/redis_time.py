"""Redis time per job: what one job costs Redis over its whole life, and so how many jobs one Redis carries.

    python bench/redis_time.py [--jobs 10000] [--runs 3] [--redis-url URL] [--breakdown] [--baseline REV | --floor]

Redis runs scripts one at a time, so the Redis time a job costs decides how
many jobs a second one Redis (or one Cluster shard) can carry. For
concurrency 1 and 32: `--jobs` no-op jobs added one `Queue.add` call each,
then the same added with `Queue.add_bulk`, each batch run by a `Worker` with
`run(burst=True)`; Redis's time read from INFO commandstats around each phase.
Two measures are printed:

- "all commands": the sum of every command's `usec` (the measure of issue 30's
  baseline figures). Redis counts a command a script runs both in the script's
  time and on its own, so this counts script-internal commands twice.
- "scripts": EVALSHA's `usec` alone (each whole script, its commands
  included, counted once): the time other clients wait. A no-op job's life
  sends no command outside a script but the worker's heartbeat, once per
  renewal interval.

Each figure is the median of `--runs` runs (the runs of the two concurrencies
take turns, so a slower spell of the machine falls on both), with the lowest
beside it: on a virtual machine whose speed moves, the spread is wide and the
lowest is the machine at its best. So a change is measured against a named
baseline in the same run: `--baseline REV` (say `HEAD`, to measure the working
tree's changes) runs the code of a git worktree of REV in a process of its own
after each run of this checkout, and prints the median of the runs' ratios.
`--floor` measures the same way a tree whose add, fetch and finish scripts are
bench/floor's: a job's life with no promise kept beyond a hash, a ready list,
the lock index and `completed`, so the least Redis time any script protocol
of this shape can cost; it prints the floor's share of this checkout's time.
`--breakdown` prints the calls and µs per job of each command while the
bulk-added jobs run. `1e6 / whole life` is the jobs a second
that Redis time allows. "fetch + finish" is the run of the bulk-added jobs. A private redis-server (no persistence, a
free loopback port) is started unless `--redis-url` names an idle one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[1]
# The tree whose echomq_django is measured: this checkout, or (for `--baseline`) a worktree of another commit.
sys.path.insert(0, os.environ.get("REDIS_TIME_TREE") or str(CHECKOUT))

from bench.beat_cost import start_redis, stop_process  # noqa: E402
from bench.measure import drop  # noqa: E402
from echomq_django.core import NewJob, Queue, Worker, connect  # noqa: E402

CONCURRENCIES = (1, 32)
# The commands this harness itself sends between phases (their time is no job's).
HARNESS = {"cmdstat_info", "cmdstat_config", "cmdstat_flushdb", "cmdstat_scan", "cmdstat_unlink",
           "cmdstat_script|load", "cmdstat_script", "cmdstat_ping", "cmdstat_client|setinfo", "cmdstat_hello"}


def redis_times(client: Any) -> tuple[float, float, dict[str, dict[str, int]]]:
    """(all commands' usec, EVALSHA usec, each command's stats) so far, the harness's own left out."""
    stats = {name: value for name, value in client.info("commandstats").items() if name not in HARNESS}
    everything = sum(value["usec"] for value in stats.values())
    scripts = stats.get("cmdstat_evalsha", {}).get("usec", 0)
    return everything, scripts, stats


class Phase:
    """Redis's time over one phase of a run, per job."""

    def __init__(self, client: Any, jobs: int) -> None:
        self.client, self.jobs = client, jobs

    def __enter__(self) -> Phase:
        self.client.config_resetstat()
        return self

    def __exit__(self, *exc: object) -> None:
        everything, scripts, stats = redis_times(self.client)
        self.all_us = everything / self.jobs
        self.scripts_us = scripts / self.jobs
        self.calls_per_job = stats.get("cmdstat_evalsha", {}).get("calls", 0) / self.jobs
        # Per command: (calls, µs) per job; a script's own commands are among them.
        self.commands = {name.removeprefix("cmdstat_"): (value["calls"] / self.jobs, value["usec"] / self.jobs)
                         for name, value in stats.items()}


def bench_worker(client: Any, **options: Any) -> Worker:
    """A no-op worker of the tree measured: its options in a WorkerOptions, or, in a tree from before
    WorkerOptions (a --baseline), as the keyword arguments Worker took then."""
    try:
        from echomq_django.core import WorkerOptions
    except ImportError:
        return Worker("bench", lambda job: None, client, **options)
    return Worker("bench", lambda job: None, client, WorkerOptions(**options))


def one_run(url: str, jobs: int, concurrency: int) -> dict[str, float]:
    client = connect(url)
    prefix = f"rt{uuid.uuid4().hex[:8]}"
    queue = Queue("bench", client, prefix=prefix)
    figures: dict[str, float] = {}
    try:
        for kind in ("single", "bulk"):
            drop(client, f"{prefix}:*")
            with Phase(client, jobs) as add:
                if kind == "single":
                    for _ in range(jobs):
                        queue.add("noop")
                else:
                    queue.add_bulk(NewJob("noop") for _ in range(jobs))
            worker = bench_worker(client, prefix=prefix, concurrency=concurrency, block_timeout_s=0.2)
            with Phase(client, jobs) as life:
                done = worker.run(burst=True)
            if done != jobs:
                sys.exit(f"the worker ran {done} of {jobs} jobs")
            figures[f"add_{kind}_all"], figures[f"add_{kind}_scripts"] = add.all_us, add.scripts_us
            figures["run_all"], figures["run_scripts"] = life.all_us, life.scripts_us
            figures[f"whole_{kind}_all"] = add.all_us + life.all_us
            figures[f"whole_{kind}_scripts"] = add.scripts_us + life.scripts_us
            figures["run_calls"] = life.calls_per_job
            if kind == "bulk":
                figures.update({f"cmd:{name}": cost for name, (_calls, cost) in life.commands.items()})
                figures.update({f"calls:{name}": calls for name, (calls, _cost) in life.commands.items()})
    finally:
        drop(client, f"{prefix}:*")
        client.close()
    return figures


ROWS = [
    ("add, one call per job", "add_single"),
    ("add, bulk", "add_bulk"),
    ("fetch + finish", "run"),
    ("whole life, single adds", "whole_single"),
    ("whole life, bulk adds", "whole_bulk"),
]


def baseline_tree(rev: str, workdir: Path) -> Path:
    """A worktree of `rev` (its scripts and its echomq_django), to measure beside this checkout."""
    tree = workdir / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), rev], check=True,
                   cwd=CHECKOUT)
    return tree


def floor_tree(workdir: Path) -> Path:
    """A worktree of HEAD whose hot scripts are replaced by bench/floor's."""
    tree = baseline_tree("HEAD", workdir)
    for script in (CHECKOUT / "bench" / "floor").glob("*.lua"):
        target = tree / "lua" / script.name
        if not target.exists():
            raise SystemExit(f"bench/floor/{script.name} replaces no script of lua/: rename it after the script "
                             "it stands for")
        shutil.copyfile(script, target)
    return tree


def baseline_run(tree: Path, url: str, jobs: int, concurrency: int) -> dict[str, float]:
    """one_run of the baseline's code, in a process of its own (its package first on the path)."""
    out = subprocess.run([sys.executable, __file__, "--one-run", str(concurrency), "--jobs", str(jobs),
                          "--redis-url", url], check=True, capture_output=True, text=True,
                         env={**os.environ, "REDIS_TIME_TREE": str(tree)})
    return json.loads(out.stdout)


def summary(found: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """The median and the lowest of each figure over the runs."""
    names = set().union(*found)
    median = {key: statistics.median(run.get(key, 0.0) for run in found) for key in names}
    lowest = {key: min(run.get(key, 0.0) for run in found) for key in names}
    return median, lowest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="500 jobs, one run: that it runs, not a figure")
    parser.add_argument("--breakdown", action="store_true",
                        help="also print each command's calls and µs per job while running the bulk-added jobs")
    parser.add_argument("--baseline", metavar="REV",
                        help="also measure the commit REV (a git worktree of it), taking turns with this checkout "
                             "run by run, and print each figure's ratio to it")
    parser.add_argument("--floor", action="store_true",
                        help="also measure bench/floor's bare add, fetch and finish scripts the same way, and print "
                             "their share of this checkout's time")
    parser.add_argument("--one-run", type=int, metavar="CONCURRENCY", help=argparse.SUPPRESS)  # baseline_run's
    parser.add_argument("--redis-url", help="an idle Redis to use instead of a private redis-server")
    args = parser.parse_args()
    if args.baseline and args.floor:
        parser.error("--baseline and --floor each name the tree measured beside this checkout: give one")
    if args.quick:
        args.jobs, args.runs = 500, 1
    if args.one_run:
        print(json.dumps(one_run(args.redis_url, args.jobs, args.one_run)))
        return
    server, workdir = None, Path(tempfile.mkdtemp(prefix="echomq-redis-time-"))
    url = args.redis_url
    if url is None:
        server, url = start_redis(workdir)
    try:
        version = connect(url).info("server")["redis_version"]
        print(f"Redis {version}; {args.jobs:,} no-op jobs a run, median of {args.runs} runs; µs of Redis time per job")
        tree = baseline_tree(args.baseline, workdir) if args.baseline else floor_tree(workdir) if args.floor else None
        runs: dict[int, list[dict[str, float]]] = {concurrency: [] for concurrency in CONCURRENCIES}
        base: dict[int, list[dict[str, float]]] = {concurrency: [] for concurrency in CONCURRENCIES}
        for _ in range(args.runs):
            for concurrency in CONCURRENCIES:
                runs[concurrency].append(one_run(url, args.jobs, concurrency))
                if tree:
                    base[concurrency].append(baseline_run(tree, url, args.jobs, concurrency))
        for concurrency, found in runs.items():
            median, lowest = summary(found)
            print(f"\nconcurrency {concurrency} (script calls per job while running: {median['run_calls']:.2f}); "
                  "median (lowest)")
            print(f"{'':<26}{'all commands':>16}{'scripts':>16}   jobs/s one Redis carries, median (all; scripts)")
            for label, key in ROWS:
                everything, scripts = median[f"{key}_all"], median[f"{key}_scripts"]
                allows = f"{1e6 / everything:,.0f}; {1e6 / scripts:,.0f}" if key.startswith("whole") else ""
                cells = "".join(f"{f'{median[name]:.1f} ({lowest[name]:.1f})':>16}"
                                for name in (f"{key}_all", f"{key}_scripts"))
                print(f"{label:<26}{cells}   {allows}")
            if tree:
                # Each run's figure over the baseline's run beside it (the same spell of the machine), median.
                print(f"  {'the floor / this checkout' if args.floor else f'this checkout / {args.baseline}'}, "
                      "median of the runs' ratios (all; scripts):")
                for label, key in ROWS:
                    pairs = [(ours, theirs) if not args.floor else (theirs, ours)
                             for ours, theirs in zip(found, base[concurrency])]
                    ratios = [statistics.median(top[f"{key}_{kind}"] / bottom[f"{key}_{kind}"] for top, bottom in pairs)
                              for kind in ("all", "scripts")]
                    print(f"    {label:<24}{ratios[0]:>8.2f}{ratios[1]:>8.2f}")
            if args.breakdown:
                print("  fetch + finish by command (script-internal ones included), median: calls, µs per job")
                for key in sorted((k for k in median if k.startswith("cmd:")), key=lambda k: median[k], reverse=True):
                    name = key.removeprefix("cmd:")
                    print(f"    {name:<22}{median[f'calls:{name}']:>8.2f}{median[key]:>10.2f}")
    finally:
        if server is not None:
            stop_process(server)
        if (workdir / "baseline").exists():
            subprocess.run(["git", "worktree", "remove", "--force", str(workdir / "baseline")],
                           cwd=CHECKOUT)


if __name__ == "__main__":
    main()
