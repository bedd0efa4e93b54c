"""Issue 30's light-load figures, echomq beside Huey, measured in interleaved blocks of one run.

    pip install -e ".[bench]"    # Huey; without it only echomq's figures (and echomq / ping()) are measured
    python bench/light_load.py [--rounds 24] [--calls 300] [--latency-jobs 20] [--jobs 500]
                               [--figures enqueue,latency,c1] [--redis-url URL] [--quick]

This VM's speed moves by a quarter between one minute and the next, more than the gaps these
figures are about; bench/everyday.py measures one system after the other, so a slow spell can
fall on one of them only. Here the systems take turns every few hundred calls or few dozen
jobs, within one run: each round measures one block of each, in an order that changes every
round, and a figure's ratio is the MEDIAN OF THE ROUNDS' RATIOS (each ratio is of two blocks
measured a second or so apart). The absolute figures printed beside it are the medians of the
blocks, so the ratios can be checked, not recomputed from them. The systems, their handlers and
their workers are bench/everyday.py's: echomq through its core API (Queue.add, Queue.add_bulk,
Worker(concurrency=c) on threads, in a process of its own); Huey as RedisHuey(results=False),
its blocking dequeue, `huey_consumer -k thread -w c`.

  enqueue   single enqueue, one call per job, in this process, on one thread: echomq's
            Queue.add, Huey's task call, and redis-py's ping() on a plain redis.Redis (one
            round trip: the floor of any producer that makes one per job). After a warm-up of
            --calls calls each, each round times a block of --calls calls (300) of each, the
            order of the three rotated every round; no worker runs. Targets: echomq / huey
            >= 1.0 and echomq / ping() >= 0.85 (jobs/s).
  latency   pickup latency at light load, at concurrency 1 and then 8: one echomq worker and
            one Huey consumer both running and idle (each warmed by 3 jobs run one after the
            other). Each round sends a block of --latency-jobs jobs (20), one every 20 ms, to
            one system, waits for the last one, then the same to the other (who goes first
            alternates). Each job carries the time.time() taken right before its enqueue call;
            the handler's first act is time.time(), and it RPUSHes the difference, which this
            process BLPOPs. The round's ratio is echomq's block p50 over Huey's. Target <= 0.8.
  c1        no-op jobs a second at concurrency 1, both workers running: each round, for each
            system (who goes first alternates), a "gate" job is sent and its start awaited,
            which holds the worker's one slot; then --jobs no-op jobs (500) are enqueued (echomq:
            Queue.add_bulk; Huey, which has no bulk API: a loop of task calls), not timed; then
            the gate opens. The rate is the jobs over the time from job 0's start to the last
            job's end, as the handlers report them. (Without the gate, Huey's consumer would
            start on its jobs while this process still enqueues them: on a small machine the
            two would share the CPU, and the consumer could catch up with the producer and wait,
            both charged to Huey; echomq's bulk add is one call.) Target echomq / huey >= 1.5.

A private redis-server (no persistence, a free loopback port) is started unless --redis-url
names an idle one; every measurement's keys are under a tag of its own, deleted at the end,
and each worker process is stopped by its id. The run's wall time is printed at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

import redis  # noqa: E402
from beat_cost import start_redis, stop_process  # noqa: E402
from everyday import _ECHOMQ_TASKS, _HUEY_TASKS, GAP_S, EchoMQ, Huey, Measurement, System  # noqa: E402

FIGURES = ("enqueue", "latency", "c1")
LATENCY_CONCURRENCIES = (1, 8)
WARM_LATENCY_JOBS = 3  # run one after the other before a latency measurement, as bench/everyday.py does
TARGETS = {  # figure: (relation, bound)
    "enqueue / huey": (">=", 1.0), "enqueue / ping": (">=", 0.85),
    "latency c1": ("<=", 0.8), "latency c8": ("<=", 0.8), "c1": (">=", 1.5),
}

# The gate: its handler says it has started, then holds its slot until this process pushes to TAG:gate.
_GATE = '''

def _gate():
    _marks.rpush(TAG + ":gated", time.time())
    _marks.blpop([TAG + ":gate"], timeout=300)
'''


class GatedEchoMQ(EchoMQ):
    tasks_source = _ECHOMQ_TASKS + _GATE + 'HANDLERS["gate"] = _gate\n'


class GatedHuey(Huey):
    tasks_source = _HUEY_TASKS + _GATE + '\n\n@huey.task()\ndef gate():\n    _gate()\n'


def sizes(quick: bool) -> dict[str, int]:
    if quick:
        return {"rounds": 2, "calls": 50, "latency_jobs": 5, "jobs": 50}
    # 24 rounds: the three enqueue orders and the two latency and c1 orders each come up equally often.
    return {"rounds": 24, "calls": 300, "latency_jobs": 20, "jobs": 500}


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def workers(systems: list[System], client: redis.Redis, concurrency: int | None) -> Iterator[list[Measurement]]:
    """A Measurement per system (a fresh tag), with its worker at `concurrency` running (None: no worker)."""
    with ExitStack() as stack:
        found = [stack.enter_context(Measurement(system, client)) for system in systems]
        if concurrency is not None:
            for m in found:
                m.start_worker(concurrency)
        yield found


# ---------------------------------------------------------------- the figures

def timed(calls_of: Callable[[range], None], calls: int) -> float:
    """Calls a second of `calls` calls."""
    started = time.perf_counter()
    calls_of(range(calls))
    return calls / (time.perf_counter() - started)


def measure_enqueue(systems: list[System], client: redis.Redis, url: str, rounds: int,
                    calls: int) -> dict[str, list[float]]:
    """Each round: a block of `calls` single enqueues of each system and of ping(), the order rotated."""
    pinger = redis.Redis.from_url(url)

    def pings(indices: range) -> None:
        ping = pinger.ping
        for _ in indices:
            ping()

    try:
        with workers(systems, client, None):
            callers: dict[str, Callable[[range], None]] = {s.label: s.enqueue_noops for s in systems}
            callers["ping"] = pings
            names = list(callers)
            for name in names:  # the warm-up: connections made, scripts loaded, code paths warm
                timed(callers[name], calls)
            rates: dict[str, list[float]] = {name: [] for name in names}
            for n in range(rounds):
                turn = n % len(names)
                for name in names[turn:] + names[:turn]:
                    rates[name].append(timed(callers[name], calls))
        return rates
    finally:
        pinger.close()


def latency_block(m: Measurement, jobs: int) -> list[float]:
    """Pickup latencies (ms) of `jobs` jobs sent one every GAP_S to an idle worker."""
    add = m.system.add
    started = time.perf_counter()
    for n in range(jobs):
        time.sleep(max(0.0, started + n * GAP_S - time.perf_counter()))
        add("ping", [time.time()])
    return [m.wait_mark(":lat", 60, "latency jobs") * 1000 for _ in range(jobs)]


def measure_latency(systems: list[System], client: redis.Redis, rounds: int, jobs: int,
                    concurrency: int) -> dict[str, list[float]]:
    """Each round: a block of `jobs` latency jobs to each system's idle worker, who goes first alternating."""
    with workers(systems, client, concurrency) as found:
        for m in found:
            for n in range(WARM_LATENCY_JOBS):  # the worker is up, connected and has run a job: idle now
                m.system.add("ping", [time.time()])
                m.wait_mark(":lat", 120 if n == 0 else 30, "warm-up job")
        p50s: dict[str, list[float]] = {m.system.label: [] for m in found}
        for n in range(rounds):
            for m in found if n % 2 == 0 else found[::-1]:
                p50s[m.system.label].append(statistics.median(latency_block(m, jobs)))
    return p50s


def rate_block(m: Measurement, client: redis.Redis, jobs: int) -> float:
    """No-op jobs a second of `jobs` jobs enqueued behind a gate job, from job 0's start to the last one's end."""
    m.system.add("gate", [])
    m.wait_mark(":gated", 60, "the gate job")
    m.system.add_bulk("noop", [[n, jobs - 1] for n in range(jobs)])
    client.rpush(m.tag + ":gate", 1)
    last = m.wait_mark(":last", jobs / 50 + 60, f"{jobs} no-op jobs")
    first = float(client.lpop(m.tag + ":first"))  # type: ignore[arg-type]
    return jobs / (last - first)


def measure_c1(systems: list[System], client: redis.Redis, rounds: int, jobs: int) -> dict[str, list[float]]:
    """Each round: a block of `jobs` no-op jobs through each system's worker at concurrency 1, alternating."""
    with workers(systems, client, 1) as found:
        for m in found:  # the warm-up block: the worker up, its code paths warm
            rate_block(m, client, jobs)
        rates: dict[str, list[float]] = {m.system.label: [] for m in found}
        for n in range(rounds):
            for m in found if n % 2 == 0 else found[::-1]:
                rates[m.system.label].append(rate_block(m, client, jobs))
    return rates


# ---------------------------------------------------------------- the report

def ratios(ours: list[float], theirs: list[float]) -> list[float]:
    return [a / b for a, b in zip(ours, theirs)]


def report(rows: list[tuple[str, str, list[float], str, list[float] | None, str]]) -> None:
    """One line per figure: (title, echomq's format, echomq's blocks, the other's label, its blocks, target key)."""
    table = [("figure", "echomq", "other", "ratio", "middle half", "target", "met")]
    for title, form, ours, other, theirs, target in rows:
        relation, bound = TARGETS[target]
        mine = form.format(statistics.median(ours))
        if theirs is None:
            table.append((title, mine, f"{other}: not measured", "n/a", "", f"{relation} {bound:.2f}", "-"))
            continue
        found = ratios(ours, theirs)
        ratio = statistics.median(found)
        spread = statistics.quantiles(found, n=4, method="inclusive") if len(found) > 1 else [found[0]] * 3
        met = ratio >= bound if relation == ">=" else ratio <= bound
        table.append((title, mine, f"{other} {form.format(statistics.median(theirs))}", f"{ratio:.2f}",
                      f"{spread[0]:.2f}-{spread[2]:.2f}", f"{relation} {bound:.2f}", "yes" if met else "NO"))
    widths = [max(len(row[n]) for row in table) for n in range(7)]
    for row in table:
        print(f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]:>{widths[3]}}  "
              f"{row[4]:>{widths[4]}}  {row[5]:<{widths[5]}}  {row[6]}")


def run(url: str, private: bool, workdir: Path, figures: list[str], size: dict[str, int], quick: bool) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    systems: list[System] = [GatedEchoMQ(url, workdir)]
    if importlib.util.find_spec("huey") is None:
        say("huey: skipped, huey not installed (pip install -e '.[bench]'): its ratios are n/a")
    else:
        systems.append(GatedHuey(url, workdir))
    huey = systems[-1].label if len(systems) > 1 else None
    rounds = size["rounds"]
    print(f"Redis {client.info('server')['redis_version']} "
          f"({'private, no persistence' if private else 'given by --redis-url'}); python "
          f"{sys.version.split()[0]}; {os.cpu_count()} CPUs; {rounds} rounds of interleaved blocks"
          f"{' (--quick: the numbers mean little)' if quick else ''}")
    print(f"blocks: enqueue {size['calls']:,} calls; latency {size['latency_jobs']} jobs one per "
          f"{GAP_S * 1000:.0f} ms; c1 {size['jobs']:,} jobs. ratio = the median of the rounds' ratios "
          "(middle half: their quartiles); the absolute figures are the blocks' medians\n")
    rows: list[tuple[str, str, list[float], str, list[float] | None, str]] = []
    if "enqueue" in figures:
        began = time.monotonic()
        rates = measure_enqueue(systems, client, url, rounds, size["calls"])
        say(f"enqueue: {time.monotonic() - began:.1f} s")
        rows.append(("single enqueue, jobs/s", "{:,.0f}", rates["echomq"], "huey", rates.get(huey or ""),
                     "enqueue / huey"))
        rows.append(("single enqueue, jobs/s", "{:,.0f}", rates["echomq"], "ping()", rates["ping"], "enqueue / ping"))
    if "latency" in figures:
        for concurrency in LATENCY_CONCURRENCIES:
            began = time.monotonic()
            p50s = measure_latency(systems, client, rounds, size["latency_jobs"], concurrency)
            say(f"latency, concurrency {concurrency}: {time.monotonic() - began:.1f} s")
            rows.append((f"pickup latency p50 c{concurrency}, ms", "{:,.2f}", p50s["echomq"], "huey",
                         p50s.get(huey or ""), f"latency c{concurrency}"))
    if "c1" in figures:
        began = time.monotonic()
        rates = measure_c1(systems, client, rounds, size["jobs"])
        say(f"c1: {time.monotonic() - began:.1f} s")
        rows.append(("no-op jobs/s, concurrency 1", "{:,.0f}", rates["echomq"], "huey", rates.get(huey or ""), "c1"))
    report(rows)
    client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="an idle Redis to use instead of a private redis-server")
    parser.add_argument("--rounds", type=int, help="rounds, each one block of every system (24; --quick 2)")
    parser.add_argument("--calls", type=int, help="enqueue calls per block (300)")
    parser.add_argument("--latency-jobs", type=int, help="latency jobs per block (20)")
    parser.add_argument("--jobs", type=int, help="no-op jobs per block of the concurrency 1 figure (500)")
    parser.add_argument("--figures", default=",".join(FIGURES), help="comma-separated, of " + ",".join(FIGURES))
    parser.add_argument("--quick", action="store_true", help="tiny blocks, two rounds: that it runs, not a figure")
    args = parser.parse_args()
    figures = [figure.strip() for figure in args.figures.split(",") if figure.strip()]
    if unknown := set(figures) - set(FIGURES):
        parser.error(f"unknown figures: {', '.join(sorted(unknown))}")
    size = sizes(args.quick)
    for key in ("rounds", "calls", "latency_jobs", "jobs"):
        if getattr(args, key) is not None:
            size[key] = getattr(args, key)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="echomq-light-load-"))
    server, url = None, args.redis_url
    try:
        if url is None:
            server, url = start_redis(workdir)
        sys.path.insert(0, str(workdir))  # the tasks modules
        run(url, server is not None, workdir, figures, size, args.quick)
    finally:
        if server is not None:
            stop_process(server)
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\ntook {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
