"""The processes pool beside the threads pool and Celery's prefork pool, on the same Redis, in one run (issue 15).

    pip install -e ".[bench]"     # Celery, for its prefork pool (skipped, and said so, without it)
    python bench/pool_cost.py [--redis-url URL] [--jobs 5000] [--runs 3] [--cpu-seconds 1.0] [--quick]

no-op jobs/s  `--jobs` jobs, all enqueued first, then one worker process is launched and
              timed from its launch (the bench's clock, before the subprocess starts: the
              interpreter, the imports and the pool's start-up count) to the last job:
              echomq's Worker with pool="threads" and pool="processes" (children spawned,
              then reused), and Celery's `celery worker --pool prefork` (Redis as broker on
              the same Redis, task_ignore_result, no result backend, prefetch multiplier at
              its default; --without-gossip --without-mingle --without-heartbeat, which
              spares it a second of start-up and the cluster chatter), at concurrency 2 and
              8. echomq's no-op handler does nothing (its last job: the last result written,
              by the scripts' clock). A Celery task cannot say "all done" without
              doing something, so each task INCRs a Redis counter (the one that reaches
              `--jobs` pushes the time); echomq's processes pool runs that same counting
              function as a handler too, and the echomq/Celery ratio compares those two.
              Printed: start-up (launch to the first job; for echomq also run() to the
              first job, the pool's own start-up), total time, jobs/s over the
              total and jobs/s after the start-up (first job to last), the median of
              `--runs` runs each; ratios processes/threads and echomq processes/Celery.
CPU-bound     4 jobs of pure-Python work (a loop adding integers, sized here to take
              `--cpu-seconds` each in this process) at concurrency 2, threads against
              processes, each worker in a process of its own; wall time from the worker's
              run() to the end of the 4th job (children's spawn included), and the
              start-up apart (run() to the first job); the median of `--runs` runs.
              Issue 15's target: the processes pool at least 1.5 x faster.

The keys go under a random prefix (Celery's too, through kombu's global_keyprefix) and
are deleted at the end. --quick uses 200 jobs, 0.2 s jobs and one run: the test suite runs
it to keep this script working; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from measure import drop  # noqa: E402

from echomq_django.core import Job, NewJob, Queue, connect  # noqa: E402

CONCURRENCIES = (2, 8)
CPU_JOBS, CPU_CONCURRENCY = 4, 2
TARGET = 1.5  # issue 15: the processes pool finishes the CPU-bound jobs at least this much faster
CELERY_QUEUE = "pool_cost"
CELERY_FLAGS = ["--without-gossip", "--without-mingle", "--without-heartbeat"]


# ---------------------------------------------------------------- the work (module-level: children import it)

_first_said = False
_tally: tuple[int, Any] | None = None  # (pid, client): a forked child makes its own


def _say(line: str) -> None:
    """One write of one line to standard output, which the worker and its children share (no interleaving)."""
    os.write(1, f"{line}\n".encode())


def _say_first() -> None:
    """Print, once per process, when it starts its first job (for a child: its start-up is over)."""
    global _first_said
    if not _first_said:
        _first_said = True
        _say(f"FIRST {time.time()}")


def noop(job: Job) -> None:
    _say_first()


def spin(n: int) -> int:
    """Pure-Python CPU work that holds the GIL (switched every 5 ms like any Python code)."""
    total = 0
    for i in range(n):
        total += i
    return total


def burn(job: Job) -> None:
    _say_first()
    spin(job.data["n"])
    _say(f"END {time.time()}")


def tally(url: str, key: str, total: int) -> None:
    """Count one job done in Redis; the first says when it started, the `total`-th when it ended."""
    global _tally
    started = time.time()
    if _tally is None or _tally[0] != os.getpid():
        _tally = (os.getpid(), connect(url))
    client = _tally[1]
    done = client.incr(key)
    if done == 1:
        client.set(f"{key}:first", started)
    if done == total:
        client.rpush(f"{key}:last", time.time())


def count(job: Job) -> None:
    """echomq's handler doing what each Celery task does."""
    tally(job.data["url"], job.data["key"], job.data["total"])


def celery_app(url: str, prefix: str) -> Any:
    from celery import Celery

    app = Celery("pool_cost", broker=url)
    app.conf.update(task_ignore_result=True, task_default_queue=CELERY_QUEUE, broker_connection_retry_on_startup=True,
                    broker_transport_options={"global_keyprefix": f"{prefix}:"})
    app.task(name="pool_cost.count")(tally)
    return app


def celery_missing(url: str) -> str | None:
    """Why Celery's side cannot run here, or None."""
    try:
        import celery  # noqa: F401
    except ImportError:
        return "celery not installed: pip install -e '.[bench]'"
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return f"Celery's Redis broker needs a redis:// URL, not {url.split('://')[0]}://"
    return None


# ---------------------------------------------------------------- one measured run

@dataclass
class Run:
    jobs: int
    launched: float  # the bench's time.time() before the worker process started
    first: float  # the first job started
    last: float  # the last job ended
    ran: float | None = None  # echomq: the worker's run() started

    @property
    def startup(self) -> float:
        return self.first - self.launched

    @property
    def total(self) -> float:
        return self.last - self.launched

    @property
    def rate(self) -> float:
        return self.jobs / self.total

    @property
    def steady(self) -> float:
        return (self.jobs - 1) / (self.last - self.first)

    @property
    def children(self) -> float:
        """run() to the first job: the pool's start-up alone."""
        assert self.ran is not None
        return self.first - self.ran


_ECHOMQ_WORKER = """
import sys, time
sys.path.insert(0, sys.argv[1])
import pool_cost
from echomq_django.core import Worker, WorkerOptions, connect
url, prefix, pool, concurrency, handler = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6]
worker = Worker("work", getattr(pool_cost, handler), connect(url),
                WorkerOptions(prefix=prefix, concurrency=concurrency, pool=pool))
pool_cost._say(f"RUN {time.time()}")
done = worker.run(burst=True)
pool_cost._say(f"DONE {time.time()} {done}")
"""

_CELERY_WORKER = """
import sys
sys.path.insert(0, sys.argv[1])
import pool_cost
pool_cost.celery_app(sys.argv[2], sys.argv[3]).worker_main(sys.argv[4:])
"""


def _stamps(stdout: str, tag: str) -> list[float]:
    return [float(line.split()[1]) for line in stdout.splitlines() if line.startswith(f"{tag} ")]


def echomq_run(url: str, pool: str, concurrency: int, handler: str, jobs: int, data: Any = None) -> Run:
    """One echomq worker process with pool `pool` draining `jobs` jobs (each with `data`) with `handler`.

    The counting handler's data (where to count) is made here.
    """
    client = connect(url)
    prefix = f"poolcost{uuid.uuid4().hex[:10]}"
    queue = Queue("work", client, prefix=prefix)
    key = f"{prefix}:count"
    if handler == "count":
        data = {"url": url, "key": key, "total": jobs}
    try:
        for at in range(0, jobs, 10_000):
            queue.add_bulk([NewJob(handler, data) for _ in range(min(10_000, jobs - at))])
        launched = time.time()
        proc = subprocess.run([sys.executable, "-c", _ECHOMQ_WORKER, str(BENCH), url, prefix, pool, str(concurrency),
                               handler], capture_output=True, text=True, timeout=jobs / 50 + 120,
                              cwd=BENCH.parent)
        done = [line.split() for line in proc.stdout.splitlines() if line.startswith("DONE ")]
        if proc.returncode != 0 or not done:
            raise RuntimeError(f"echomq worker exited {proc.returncode}: {proc.stdout[-2000:]} {proc.stderr[-3000:]}")
        if int(done[0][2]) != jobs:
            raise RuntimeError(f"the worker finished {done[0][2]} jobs of {jobs}")
        [ran] = _stamps(proc.stdout, "RUN")
        if handler == "count":
            first, last = float(client.get(f"{key}:first")), float(client.lpop(f"{key}:last"))
        else:
            first = min(_stamps(proc.stdout, "FIRST"))
            # The last job's end: its handler's (burn), or the last result written (the scripts' clock, in
            # ms; not run() returning, which waits for the children to exit).
            [(_, written_ms)] = client.zrevrange(queue.keys.completed, 0, 0, withscores=True)
            last = max(_stamps(proc.stdout, "END") or [written_ms / 1000])
        return Run(jobs, launched, first, last, ran)
    finally:
        drop(client, f"{prefix}:*")


def celery_run(url: str, concurrency: int, jobs: int) -> Run:
    """One `celery worker --pool prefork` process draining `jobs` counting tasks, enqueued before it starts."""
    client = connect(url)
    prefix = f"poolcost{uuid.uuid4().hex[:10]}"
    key = f"{prefix}:count"
    app = celery_app(url, prefix)
    argv = ["worker", "--pool", "prefork", "--concurrency", str(concurrency), "--loglevel", "WARNING",
            "--hostname", f"{prefix}@%h", *CELERY_FLAGS]
    try:
        with app.producer_or_acquire() as producer:
            for _ in range(jobs):
                app.send_task("pool_cost.count", args=(url, key, jobs), producer=producer)
        waiting = client.llen(f"{prefix}:{CELERY_QUEUE}")
        if waiting != jobs:
            raise RuntimeError(f"{waiting} Celery messages in {prefix}:{CELERY_QUEUE}, not {jobs}")
        with tempfile.TemporaryFile("w+") as log:
            launched = time.time()
            worker = subprocess.Popen([sys.executable, "-c", _CELERY_WORKER, str(BENCH), url, prefix, *argv],
                                      stdout=log, stderr=subprocess.STDOUT, cwd=BENCH.parent, start_new_session=True)
            try:
                deadline = time.monotonic() + jobs / 50 + 120
                while (reply := client.blpop([f"{key}:last"], timeout=1)) is None:
                    if worker.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise RuntimeError(f"the Celery worker finished {client.get(key)} tasks of {jobs} "
                                           f"(exit code {worker.poll()}): {log.read()[-3000:]}")
            finally:
                stop(worker)
        return Run(jobs, launched, float(client.get(f"{key}:first")), float(reply[1]))
    finally:
        app.close()
        drop(client, f"{prefix}:*")


def stop(worker: subprocess.Popen) -> None:
    """A warm shutdown of the Celery worker we started (SIGTERM), then SIGKILL to its process group."""
    if worker.poll() is None:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(worker.pid, signal.SIGKILL)  # its own session: the worker and its children only
    except ProcessLookupError:
        pass
    worker.wait()


# ---------------------------------------------------------------- the tables

def calibrate(seconds: float) -> int:
    """The loop count that spins for about `seconds` in this process."""
    n = 200_000
    while True:
        started = time.perf_counter()
        spin(n)
        took = time.perf_counter() - started
        if took > 0.2:
            return max(int(n * seconds / took), 1)
        n *= 4


def throughput(url: str, jobs: int, runs: int, celery_reason: str | None) -> None:
    cases = [("echomq threads", "no-op"), ("echomq processes", "no-op"), ("echomq processes", "counting")]
    if celery_reason is None:
        cases.append(("celery prefork", "counting"))
    results: dict[tuple[str, str, int], list[Run]] = {}
    for number in range(runs):
        for concurrency in CONCURRENCIES:
            order = cases if number % 2 == 0 else cases[::-1]  # a busy moment of the machine costs each alike
            for name, handler in order:
                if name.startswith("celery"):
                    run = celery_run(url, concurrency, jobs)
                else:
                    pool = name.split()[1]
                    run = echomq_run(url, pool, concurrency, "count" if handler == "counting" else "noop", jobs)
                results.setdefault((name, handler, concurrency), []).append(run)

    print(f"no-op jobs: {jobs:,} per case, enqueued before the worker process is launched; timed from its launch "
          f"to the last job; median of {runs} run(s)")
    print("  counting: each job INCRs a Redis counter (what tells the bench that Celery's last task ran)")
    header = (f"{'pool':<18}{'handler':<10}{'conc':>5}{'start-up s':>12}{'(run() to 1st)':>16}{'total s':>9}"
              f"{'jobs/s':>9}{'jobs/s after start-up':>23}")
    print(header)
    figures: dict[tuple[str, str, int], tuple[float, float]] = {}
    for concurrency in CONCURRENCIES:
        for name, handler in cases:
            taken = results[name, handler, concurrency]
            rate, steady = median([r.rate for r in taken]), median([r.steady for r in taken])
            figures[name, handler, concurrency] = rate, steady
            children = f"{median([r.children for r in taken]):.3f}" if taken[0].ran is not None else "-"
            print(f"{name:<18}{handler:<10}{concurrency:>5}{median([r.startup for r in taken]):>12.3f}"
                  f"{children:>16}{median([r.total for r in taken]):>9.2f}{rate:>9,.0f}{steady:>23,.0f}")
    if celery_reason is not None:
        print(f"celery prefork: not measured, {celery_reason}")
    print()
    print(f"{'ratio':<52}{'conc':>5}{'jobs/s':>9}{'after start-up':>16}")
    pairs = [("processes / threads, no-op", ("echomq processes", "no-op"), ("echomq threads", "no-op")),
             ("echomq processes / celery prefork, counting", ("echomq processes", "counting"),
              ("celery prefork", "counting"))]
    for label, ours, theirs in pairs:
        for concurrency in CONCURRENCIES:
            if (*theirs, concurrency) not in figures:
                print(f"{label:<52}{concurrency:>5}{'not measured':>25}")
                continue
            (rate, steady), (rate0, steady0) = figures[(*ours, concurrency)], figures[(*theirs, concurrency)]
            print(f"{label:<52}{concurrency:>5}{rate / rate0:>9.2f}{steady / steady0:>16.2f}")


def cpu_bound(url: str, seconds: float, runs: int) -> bool:
    n = calibrate(seconds)
    started = time.perf_counter()
    spin(n)
    took = time.perf_counter() - started
    wall: dict[str, list[float]] = {"threads": [], "processes": []}
    startup: dict[str, list[float]] = {"threads": [], "processes": []}
    for number in range(runs):
        for pool in ("threads", "processes") if number % 2 == 0 else ("processes", "threads"):
            run = echomq_run(url, pool, CPU_CONCURRENCY, "burn", CPU_JOBS, {"n": n})
            assert run.ran is not None
            wall[pool].append(run.last - run.ran)
            startup[pool].append(run.children)
    print(f"CPU-bound: {CPU_JOBS} jobs of a pure-Python loop ({n:,} additions, {took:.2f} s in this process), "
          f"concurrency {CPU_CONCURRENCY}; timed in the worker process from run() to the end of the "
          f"{CPU_JOBS}th job; median of {runs} run(s)")
    print(f"{'pool':<12}{'wall s':>8}{'run() to 1st job s':>20}   runs, wall s")
    for pool in ("threads", "processes"):
        print(f"{pool:<12}{median(wall[pool]):>8.2f}{median(startup[pool]):>20.3f}   "
              f"{' '.join(f'{w:.2f}' for w in wall[pool])}")
    ratio = median(wall["threads"]) / median(wall["processes"])
    met = ratio >= TARGET
    print(f"threads / processes wall time: {ratio:.2f} (target {TARGET}x: {'met' if met else 'NOT met'})")
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--jobs", type=int, default=5_000, help="no-op jobs per case")
    parser.add_argument("--runs", type=int, default=3, help="runs of each case (median)")
    parser.add_argument("--cpu-seconds", type=float, default=1.0, help="length of one CPU-bound job")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script runs")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.runs, args.cpu_seconds = 200, 1, 0.2
    url = args.redis_url
    client = connect(url)
    cpus = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    celery_reason = celery_missing(url)
    versions = f"; celery {__import__('celery').__version__}" if celery_reason is None else ""
    print(f"Redis {client.info('server')['redis_version']} at {url}; python {sys.version.split()[0]}{versions}; "
          f"{cpus} CPUs ({usable} usable by this process); load average {os.getloadavg()[0]:.2f}")
    if celery_reason is not None:
        print(celery_reason)
    print()
    throughput(url, args.jobs, args.runs, celery_reason)
    print()
    met = cpu_bound(url, args.cpu_seconds, args.runs)
    print(f"load average at the end {os.getloadavg()[0]:.2f} (other work on the machine shares its CPUs)")
    if not met and not args.quick:
        sys.exit(1)


if __name__ == "__main__":
    main()
