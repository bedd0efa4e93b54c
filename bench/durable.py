"""Durable steps: a checkpoint's Redis time, a job replayed after a kill, and the longest call of a 10,000-step job.

    python bench/durable.py [--steps 10000] [--replay-steps 1000] [--rounds 3] [--jobs 200] [--job-steps 50]
                            [--redis-url URL] [--quick]

A durable step (core/worker/durable.py, under echomq_django.durable.step) costs its
job a read of the step's record (an HGET, one round trip) and, on the run
that does the work, recordStep (a script that checks the attempt's token and
writes the record once); a replayed step costs the read only. Three
measures, on a private redis-server (no persistence, a free loopback port)
unless --redis-url names an idle one (part 3 changes its slow log settings,
and restores them):

1. Redis time of one checkpoint. Each of --rounds rounds runs --jobs no-op
   jobs, the baseline (a whole life: one Queue.add each, fetched and finished
   by a Worker at concurrency 1), then as many jobs of --job-steps steps each,
   the same way; Redis's time from INFO commandstats around each (every
   command; EVALSHA alone: the scripts) and its CPU from INFO cpu (the whole
   server: network and parsing too). A checkpoint is a durable job's figure
   less a no-op job's, over its steps; beside it, its share of the no-op life
   (the median of the rounds' ratios).
2. A job of --replay-steps steps on a worker in a process of its own (this
   script, the threads pool): once every step is recorded, the process is
   killed (SIGKILL); a forced sweep recovers the job once its lock lapsed, and
   a second worker process runs it again, every step replayed. The handler's
   wall time of both runs, per step, and Redis's CPU per step over each
   worker's life (its start included); median of the rounds.
3. A job of --steps steps (results of a few bytes) run by a Worker with every
   call logged (slowlog-log-slower-than 0): the longest top-level call of each
   script and command Redis saw over the job's run, a getJob, a page of its
   steps (HLEN and an HSCAN of 200), the admin's own read of them (read_steps:
   200 names, their sizes, their records) and its removal (removeJob deletes
   the steps with the job). The target: no call over 50 ms.
"""

from __future__ import annotations

import argparse
import hashlib
import select
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.beat_cost import start_redis, stop_process  # noqa: E402
from bench.measure import drop  # noqa: E402
from bench.redis_time import redis_times  # noqa: E402
from echomq_django.core import (  # noqa: E402
    Job,
    JobOptions,
    Queue,
    Sweeper,
    SweepTarget,
    Worker,
    WorkerOptions,
    connect,
    read_steps,
)
from echomq_django.core.defaults import MAX_STEPS  # noqa: E402
from echomq_django.core.protocol.lua import script_names, script_source  # noqa: E402
from echomq_django.core.worker.durable import run_step  # noqa: E402

QUEUE = "durable"
LOCK_MS = 2000  # part 2's worker: the killed run's lock lapses this long after its last renewal
RECORDED = "RECORDED"  # what part 2's first run prints once its steps are recorded, with their wall time
PROCESS_TIMEOUT_S = 300  # for a worker process to record its steps, or to end, on a slow machine
ADMIN_PAGE = 200  # the steps the admin's job page reads in one HSCAN
TARGET_MS = 50
# Commands this bench sends itself around part 3's job: no call of the job's.
HARNESS = {"SLOWLOG", "CONFIG", "MEMORY", "INFO", "CLIENT", "HELLO", "PING", "SCRIPT"}


def new_prefix(kind: str) -> str:
    return f"bench-durable-{kind}-{uuid.uuid4().hex[:8]}"


def small_result(n: int) -> int:
    return n


def stepping(steps: int) -> Callable[[Job], None]:
    """A handler that takes `steps` durable steps (none: a no-op job)."""
    def handler(job: Job) -> None:
        for n in range(steps):
            run_step(job, f"s{n}", small_result, (n,), {})
    return handler


def load_scripts(client: Any) -> None:
    """Load every script before anything is measured: a first EVALSHA that finds none is a call of its own."""
    for name in script_names():
        client.script_load(script_source(name))


def cpu_us(client: Any) -> float:
    """The Redis server's CPU time so far (user and system), µs."""
    info = client.info("cpu")
    return (float(info["used_cpu_sys"]) + float(info["used_cpu_user"])) * 1e6


# -- 1. Redis time of one checkpoint ------------------------------------------------------------------------------

Cost = tuple[float, float, float]  # Redis µs: all commands, scripts (EVALSHA), CPU
COLUMNS = ("all commands", "scripts", "Redis CPU")


def job_life(url: str, jobs: int, steps: int) -> Cost:
    """Redis's cost per job of `jobs` jobs of `steps` steps each (0: no-op jobs), added and run at concurrency 1."""
    client = connect(url)
    prefix = new_prefix("life")
    queue = Queue(QUEUE, client, prefix=prefix)
    worker = Worker(QUEUE, stepping(steps), client, WorkerOptions(prefix=prefix, concurrency=1, block_timeout_s=0.2),
                    scripts=queue.scripts)
    try:
        client.config_resetstat()
        cpu_before = cpu_us(client)
        for _ in range(jobs):
            queue.add("durable" if steps else "noop")
        done = worker.run(burst=True)
        cpu = cpu_us(client) - cpu_before
        everything, scripts, _ = redis_times(client)
        if done != jobs:
            sys.exit(f"the worker ran {done} of {jobs} jobs")
        return everything / jobs, scripts / jobs, cpu / jobs
    finally:
        drop(client, f"{prefix}:*")
        client.close()


def checkpoint_rounds(url: str, rounds: int, jobs: int, steps: int) -> list[tuple[Cost, Cost]]:
    """Each round's cost of a no-op job's life, and of one checkpoint (a durable job's extra cost over its steps)."""
    found = []
    for _ in range(rounds):
        noop = job_life(url, jobs, 0)
        durable = job_life(url, jobs, steps)
        checkpoint = ((durable[0] - noop[0]) / steps, (durable[1] - noop[1]) / steps, (durable[2] - noop[2]) / steps)
        found.append((noop, checkpoint))
    return found


def print_checkpoints(found: list[tuple[Cost, Cost]], jobs: int, steps: int) -> None:
    print(f"\n1. Redis time of one checkpoint: {jobs} jobs of {steps} steps beside {jobs} no-op jobs (concurrency 1); "
          f"µs, median of {len(found)} rounds (lowest)")
    print(f"   {'':<40}" + "".join(f"{column:>16}" for column in COLUMNS))
    for row, label in enumerate(("no-op job's life (add, fetch, finish)", "one checkpoint (HGET + recordStep)")):
        cells = []
        for column in range(len(COLUMNS)):
            figures = [cost[row][column] for cost in found]
            cells.append(f"{statistics.median(figures):.1f} ({min(figures):.1f})")
        print(f"   {label:<40}" + "".join(f"{cell:>16}" for cell in cells))
    ratios = [statistics.median(checkpoint[column] / noop[column] for noop, checkpoint in found)
              for column in range(len(COLUMNS))]
    print(f"   {'checkpoint / no-op life, median ratio':<40}" + "".join(f"{ratio:>16.3f}" for ratio in ratios))
    per_s = 1e6 / statistics.median(checkpoint[2] for _noop, checkpoint in found)
    print(f"   checkpoints a second one Redis's CPU carries: {per_s:,.0f}")


# -- 2. A job replayed after a kill -------------------------------------------------------------------------------

def replaying(steps: int) -> Callable[[Job], dict[str, float]]:
    """Part 2's handler: the first run records its steps, says so and waits to be killed; a later one replays."""
    def handler(job: Job) -> dict[str, float]:
        started = time.perf_counter()
        for n in range(steps):
            run_step(job, f"s{n}", small_result, (n,), {})
        took = time.perf_counter() - started
        if job.attempts_started == 1:
            print(f"{RECORDED} {took:.6f}", flush=True)
            time.sleep(PROCESS_TIMEOUT_S)  # the bench kills the process meanwhile: this attempt never ends
            raise RuntimeError("the bench did not kill this worker")
        return {"took_s": took}
    return handler


def serve_worker(url: str, prefix: str, steps: int) -> None:
    """Part 2's worker process: run the queue's jobs until none is ready."""
    options = WorkerOptions(prefix=prefix, concurrency=1, lock_duration_ms=LOCK_MS, block_timeout_s=0.2)
    Worker(QUEUE, replaying(steps), connect(url), options).run(burst=True)


def spawn_worker(url: str, prefix: str, steps: int, log: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--serve-worker", prefix, "--redis-url", url,
                             "--replay-steps", str(steps)], cwd=ROOT, stdout=subprocess.PIPE, stderr=log, text=True)


def recorded_in(process: subprocess.Popen[str]) -> float:
    """The first run's wall time, which the worker process prints once every step is recorded."""
    assert process.stdout is not None
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while time.monotonic() < deadline:
        if select.select([process.stdout], [], [], 1.0)[0]:
            line = process.stdout.readline()
            if not line:
                break
            if line.startswith(RECORDED):
                return float(line.split()[1])
    sys.exit(f"the worker process did not record its steps (exit status {process.poll()})")


def recover(queue: Queue, job_id: str) -> None:
    """Sweep (forced) until the killed run's job is back in wait: its lock lapsed, it was marked, then recovered."""
    sweeper = Sweeper(queue.client, [SweepTarget(QUEUE, lock_duration_ms=LOCK_MS)], prefix=queue.keys.prefix,
                      scripts=queue.scripts)
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while queue.get_state(job_id) != "wait":
        if time.monotonic() > deadline:
            sys.exit(f"the killed job was not recovered; it is {queue.get_state(job_id)}")
        sweeper.sweep(sweeper.targets[0], force=True)
        time.sleep(0.1)  # a sweep a tenth of a second while the lock lapses


def replay_round(url: str, steps: int, log: Any) -> dict[str, float]:
    """One job of `steps` steps: its first run, killed at its end, and its replay by a new worker process."""
    client = connect(url)
    prefix = new_prefix("replay")
    queue = Queue(QUEUE, client, prefix=prefix)
    processes: list[subprocess.Popen[str]] = []
    try:
        job_id = queue.add("durable", opts=JobOptions(attempts=3))
        cpu_before = cpu_us(client)
        processes.append(spawn_worker(url, prefix, steps, log))
        first_s = recorded_in(processes[0])
        first_cpu = cpu_us(client) - cpu_before
        processes[0].kill()
        processes[0].wait()
        killed = time.monotonic()
        recover(queue, job_id)
        recovery_s = time.monotonic() - killed
        cpu_before = cpu_us(client)
        processes.append(spawn_worker(url, prefix, steps, log))
        if processes[1].wait(PROCESS_TIMEOUT_S) != 0:
            sys.exit(f"the replaying worker exited {processes[1].returncode}")
        replay_cpu = cpu_us(client) - cpu_before
        job, state = queue.get_job_with_state(job_id)
        if state != "completed" or job is None or not isinstance(job.returnvalue, dict):
            sys.exit(f"the replayed job is {state}: {job and job.failed_reason}")
        return {"first_s": first_s, "replay_s": job.returnvalue["took_s"], "first_cpu": first_cpu / steps,
                "replay_cpu": replay_cpu / steps, "recovery_s": recovery_s}
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        drop(client, f"{prefix}:*")
        client.close()


def print_replays(found: list[dict[str, float]], steps: int) -> None:
    def median(key: str) -> float:
        return statistics.median(run[key] for run in found)

    print(f"\n2. A job of {steps:,} steps on a worker process, killed (SIGKILL) once every step was recorded, then run "
          f"again by a new worker process; median of {len(found)} rounds")
    print(f"   {'':<40}{'wall s':>12}{'ms per step':>14}{'Redis CPU µs per step':>24}")
    for label, kind in (("first run (records each step)", "first"), ("replay (reads each record)", "replay")):
        print(f"   {label:<40}{median(f'{kind}_s'):>12.3f}{median(f'{kind}_s') * 1000 / steps:>14.3f}"
              f"{median(f'{kind}_cpu'):>24.1f}")
    ratio = statistics.median(run["replay_s"] / run["first_s"] for run in found)
    cpu_ratio = statistics.median(run["replay_cpu"] / run["first_cpu"] for run in found)
    print(f"   {'replay / first run, median ratio':<40}{ratio:>12.3f}{'':>14}{cpu_ratio:>24.3f}")
    print(f"   from the kill to the job back in wait: {median('recovery_s'):.2f} s (a lock of {LOCK_MS} ms to lapse, "
          "then forced sweeps)")


# -- 3. The longest calls of a long job ---------------------------------------------------------------------------

@contextmanager
def every_call_logged(client: Any, max_len: int) -> Iterator[None]:
    """Have the slow log keep every call (up to `max_len`) while inside; its settings restored after."""
    saved = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", 0)
    client.config_set("slowlog-max-len", max_len)
    client.slowlog_reset()
    try:
        yield
    finally:
        client.config_set("slowlog-log-slower-than", saved["slowlog-log-slower-than"])
        client.config_set("slowlog-max-len", saved["slowlog-max-len"])
        client.slowlog_reset()


def calls_seen(entries: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The durations (µs) of the top-level calls in slow log `entries`, by script name or command."""
    names = {hashlib.sha1(script_source(name).encode()).hexdigest(): name for name in script_names()}
    found: dict[str, list[int]] = {}
    for entry in entries:
        if entry["client_address"] in (b"?:0", "?:0"):  # a command a script ran: its time is the script's
            continue
        command = entry["command"]
        words = (command.decode(errors="replace") if isinstance(command, bytes) else command).split()
        label = words[0].upper()
        if label == "EVALSHA":
            label = names.get(words[1], "another script")
        if label not in HARNESS:
            found.setdefault(label, []).append(int(entry["duration"]))
    return found


def long_job(url: str, steps: int) -> dict[str, Any]:
    """Run one job of `steps` steps, read it and remove it, every call logged: what Redis saw, and wall times."""
    client = connect(url)
    prefix = new_prefix("long")
    queue = Queue(QUEUE, client, prefix=prefix)
    worker = Worker(QUEUE, stepping(steps), client, WorkerOptions(prefix=prefix, concurrency=1, block_timeout_s=0.2),
                    scripts=queue.scripts)
    max_len = steps * 10 + 10_000  # about 7 entries a step: the read, recordStep and the 4 commands it runs
    try:
        with every_call_logged(client, max_len):
            job_id = queue.add("durable")
            started = time.perf_counter()
            worker.run(burst=True)
            run_s = time.perf_counter() - started
            if queue.get_job(job_id) is None:
                sys.exit("the long job is gone after its run")
            started = time.perf_counter()
            count, (_cursor, page) = client.hlen(queue.keys.steps(job_id)), client.hscan(
                queue.keys.steps(job_id), 0, count=ADMIN_PAGE)  # (a dict: step name -> record)
            page_ms = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            shown = read_steps(queue, job_id)  # the admin's own read: names, their sizes, then the records
            admin_ms = (time.perf_counter() - started) * 1000
            memory = client.memory_usage(queue.keys.steps(job_id), samples=0)
            queue.remove(job_id)
            entries = client.slowlog_get(max_len)
        if count != steps or len(entries) >= max_len:
            sys.exit(f"{count} of {steps} steps recorded; {len(entries)} calls logged (the log keeps {max_len})")
        return {"run_s": run_s, "page_ms": page_ms, "page_rows": len(page), "memory": memory, "admin_ms": admin_ms,
                "admin_rows": len(shown.steps),
                "calls": calls_seen(entries)}
    finally:
        drop(client, f"{prefix}:*")
        client.close()


def print_long_job(found: dict[str, Any], steps: int) -> None:
    run_s = found["run_s"]
    print(f"\n3. One job of {steps:,} steps (results of a few bytes), every call logged: run in {run_s:.2f} s, "
          f"{run_s * 1000 / steps:.3f} ms per step")
    print(f"   {'call (top-level)':<28}{'calls':>8}{'longest ms':>12}{'median µs':>11}{'total ms':>10}")
    calls: dict[str, list[int]] = found["calls"]
    for label, durations in sorted(calls.items(), key=lambda item: max(item[1]), reverse=True):
        print(f"   {label:<28}{len(durations):>8,}{max(durations) / 1000:>12.3f}{statistics.median(durations):>11.0f}"
              f"{sum(durations) / 1000:>10.1f}")
    longest_script_us, longest_script = max((max(durations), label) for label, durations in calls.items()
                                            if label in script_names())
    longest_us = max(max(durations) for durations in calls.values())
    print(f"   longest script call: {longest_script_us / 1000:.3f} ms ({longest_script}); longest call of any kind: "
          f"{longest_us / 1000:.3f} ms; target, none over {TARGET_MS} ms: "
          f"{'met' if longest_us <= TARGET_MS * 1000 else 'NOT MET'}")
    print(f"   a page of the steps (HLEN, HSCAN COUNT {ADMIN_PAGE}): {found['page_ms']:.2f} ms wall, "
          f"{found['page_rows']} records; the admin's read_steps: {found['admin_ms']:.2f} ms wall, "
          f"{found['admin_rows']} records")
    print(f"   the steps hash: {found['memory']:,} bytes, "
          f"{found['memory'] / steps:.0f} per step")


# -- the run ------------------------------------------------------------------------------------------------------

def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=MAX_STEPS, help="steps of part 3's job (%(default)r, the most "
                        "a job records)")
    parser.add_argument("--replay-steps", type=int, default=1000, help="steps of part 2's job (%(default)r)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of parts 1 and 2 (%(default)r)")
    parser.add_argument("--jobs", type=int, default=200, help="jobs of each kind in a round of part 1 (%(default)r)")
    parser.add_argument("--job-steps", type=int, default=50, help="steps of each of part 1's jobs (%(default)r)")
    parser.add_argument("--redis-url", help="an idle Redis to use instead of a private redis-server")
    parser.add_argument("--quick", action="store_true", help="small sizes and one round: that it runs, not a figure")
    parser.add_argument("--serve-worker", metavar="PREFIX", help=argparse.SUPPRESS)  # part 2's worker process
    args = parser.parse_args()
    if args.quick:
        args.steps, args.replay_steps, args.rounds, args.jobs, args.job_steps = 1000, 200, 1, 20, 20
    for name in ("steps", "replay_steps", "job_steps"):
        if not 1 <= getattr(args, name) <= MAX_STEPS:
            parser.error(f"--{name.replace('_', '-')} takes 1 to {MAX_STEPS:,} (a job records at most that many)")
    if args.rounds < 1 or args.jobs < 1:
        parser.error("--rounds and --jobs take 1 or more")
    return args


def main() -> None:
    args = options()
    if args.serve_worker:
        serve_worker(args.redis_url, args.serve_worker, args.replay_steps)
        return
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="echomq-durable-")))
        url = args.redis_url
        if url is None:
            server, url = start_redis(workdir)
            stack.callback(stop_process, server)
        client = stack.enter_context(connect(url))
        load_scripts(client)
        print(f"Redis {client.info('server')['redis_version']}")
        print_checkpoints(checkpoint_rounds(url, args.rounds, args.jobs, args.job_steps), args.jobs, args.job_steps)
        log = stack.enter_context((workdir / "workers.log").open("w+"))
        try:
            replays = [replay_round(url, args.replay_steps, log) for _ in range(args.rounds)]
        except BaseException:
            log.seek(0)
            print(f"the worker processes' stderr:\n{log.read()[-3000:]}", file=sys.stderr)
            raise
        print_replays(replays, args.replay_steps)
        print_long_job(long_job(url, args.steps), args.steps)


if __name__ == "__main__":
    main()
