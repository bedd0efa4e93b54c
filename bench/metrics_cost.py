"""What the per-minute metrics cost the scripts that count them: Redis time per job, metrics off and on.

    python bench/metrics_cost.py [--rounds 9] [--jobs 512] [--worker-jobs 10000] [--worker-runs 5]
                                 [--before REV] [--redis-url URL] [--quick]

Fetch (moveToActive) and finish (moveToFinished) are driven directly, as a
worker's loop sends them, with 1 and with 32 jobs per call, with metrics off
(metrics minutes 0, the baseline: the scripts still add up in Lua what they
saw, but write nothing) and on (1440, the default). Finishes keep every
completed job, so no retention work hides the metrics' share. Each round adds
`--jobs` jobs, then takes and finishes them 32 at a time; the rounds rotate
which setting goes first, so a busy moment of the machine costs each alike.
Redis time is read from Redis:
the EVALSHA `usec` of INFO commandstats (which includes the commands a script
runs) before and after each window of 32 jobs (one pipelined round trip). A
window during which any other client ran a script (the EVALSHA call count grew
by more than this window's calls) is left out, so another client's scripts on
the same Redis do not count; its other commands never do. Printed: the median
over rounds of each round's median window, in us of Redis time per job; the
ratio on/off; what metrics add per script call; the range of the ratio over
the rounds (each round's on beside its own off). With `--before REV` (e.g. faa546b^, the commit before metrics), the two
scripts as they were at that git revision run as a third setting, "before":
the check that metrics off costs what the scripts cost before metrics existed.

Then jobs/s of a real Worker (concurrency 8, no-op handler, burst, its default
retention, in a process of its own) draining `--worker-jobs` jobs, off and on alternately, median of
`--worker-runs` each; and the memory of a day of metrics: MEMORY USAGE of one
minute hash with every field set by real fetches, finishes and a sweep, times
1440 minutes, plus the all-time totals hash. The keys go under a prefix of
their own, deleted at the end.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from measure import drop, parse_rate  # noqa: E402

from echomq_django.core import NewJob, Queue, Sweeper, connect, now_ms  # noqa: E402
from echomq_django.core.protocol.scripts import Finish  # noqa: E402

OFF, ON = 0, 1440  # metrics minutes: 0 turns metrics off (the baseline), 1440 is the default
WINDOW = 32  # jobs per measured round trip
BATCHES = (1, 32)  # jobs per script call
RETRIES = 5  # runs again of a round whose windows other clients' scripts all spoiled
LOCK_MS = 30_000
DAY_MINUTES = 1440
FIELDS = ("completed", "failed", "retried", "recovered", "wait_count", "wait_sum", "wait_max",
          "run_count", "run_sum", "run_max", "waiting")


def script_stats(client) -> tuple[int, int, int]:
    """(EVALSHA calls, EVALSHA usec, EVAL calls) so far, Redis-wide."""
    stats = client.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {})
    return evalsha.get("calls", 0), evalsha.get("usec", 0), stats.get("cmdstat_eval", {}).get("calls", 0)


class Before:
    """moveToActive and moveToFinished as they were at git revision `rev`, loaded into Redis.

    Run with the calls the current wrappers build, less what those scripts
    did not take: the metrics argument (moveToFinished's ninth), and
    moveToActive's metrics and flow control (its last ARGV and KEYS).
    """

    # The current script name -> its file at that revision.
    NAMES = {"moveToActive-10": "moveToActive-9", "moveToFinished-10": "moveToFinished-10"}

    def __init__(self, client, rev: str) -> None:
        self.client = client
        self.sha = {name: client.script_load(self._assemble(rev, f"lua/{old}.lua", set()))
                    for name, old in self.NAMES.items()}

    @staticmethod
    def _show(rev: str, path: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=BENCH.parent, capture_output=True, text=True,
                              check=True).stdout

    def _assemble(self, rev: str, path: str, spliced: set[str]) -> str:
        """The script with its includes spliced in, as echomq_django/core/protocol/lua.py does."""
        def include(match: re.Match[str]) -> str:
            part = match.group(1)
            if part in spliced:
                return f"-- {part}: spliced in above"
            spliced.add(part)
            return self._assemble(rev, f"lua/includes/{part}.lua", spliced)

        return re.sub(r'^-- @include "([A-Za-z]+)"$', include, self._show(rev, path), flags=re.MULTILINE)

    def run_batch(self, calls: list) -> list:
        pipe = self.client.pipeline(transaction=False)
        for name, keys, args in calls:
            if name == "moveToActive-10":  # nor the flow control's keys and arguments, nor its reply's wait
                keys, args = keys[:9], args[:6]
            else:
                args = [*args[:8], *args[9:]]
            pipe.evalsha(self.sha[name], len(keys), *keys, *args)
        replies = pipe.execute()
        return [[reply[0], 0, *reply[1:]] if name == "moveToActive-10" else reply
                for (name, _keys, _args), reply in zip(calls, replies)]


def timed_window(client, run: Callable[[list], list], calls: list) -> tuple[int | None, list]:
    """`run(calls)`, one pipelined round trip: (Redis usec the calls took, their replies).

    The usec is None when any other script ran on this Redis meanwhile (the
    call counts say so): then the delta is not this window's alone.
    """
    calls_before, usec_before, eval_before = script_stats(client)
    replies = run(calls)
    calls_after, usec_after, eval_after = script_stats(client)
    if calls_after - calls_before != len(calls) or eval_after != eval_before:
        return None, replies
    return usec_after - usec_before, replies


def one_round(queue: Queue, batch: int, mode: str, jobs: int, before: Before | None = None,
              ) -> tuple[list[float], list[float]]:
    """Add `jobs` jobs, then fetch and finish them WINDOW at a time in calls of `batch` jobs.

    `mode`: "off", "on", or "before" (the scripts of `before`). Returns the
    clean windows' Redis us per job: (fetches, finishes).
    """
    queue.add_bulk([NewJob("bench") for _ in range(jobs)])
    fetches: list[float] = []
    finishes: list[float] = []
    scripts, keys = queue.scripts, queue.keys
    minutes = ON if mode == "on" else OFF
    if mode == "before":
        assert before is not None
        run: Callable[[list], list] = before.run_batch
    else:
        def run(calls: list) -> list:
            return scripts.run_batch(calls, raise_on_error=True)
    for _ in range(jobs // WINDOW):
        tokens = [uuid.uuid4().hex for _ in range(WINDOW // batch)]
        now = now_ms()
        usec, replies = timed_window(queue.client, run, [
            scripts.fetch_call(keys, token, LOCK_MS, now, batch, "bench", metrics_minutes=minutes)
            for token in tokens])
        taken = [Finish(job_id, token, True, "null")
                 for token, reply in zip(tokens, replies) for job_id, _ in scripts.fetched(reply)[2]]
        if len(taken) != WINDOW:
            raise RuntimeError(f"fetched {len(taken)} jobs, not {WINDOW}")
        if usec is not None:
            fetches.append(usec / WINDOW)
        now = now_ms()
        usec, replies = timed_window(queue.client, run, [
            scripts.finish_call(keys, taken[at:at + batch], now, default_attempts=3, keep_completed=(-1, 0),
                                keep_failed=(-1, 0), metrics_minutes=minutes)
            for at in range(0, WINDOW, batch)])
        if [code for reply in replies for code in reply] != [1] * WINDOW:
            raise RuntimeError(f"finish codes {replies}")
        if usec is not None:
            finishes.append(usec / WINDOW)
    return fetches, finishes


def script_costs(client, prefix: str, rounds: int, jobs: int, before: Before | None,
                 ) -> list[tuple[str, int, dict[str, list[float]]]]:
    """For each case: (label, calls per window, {mode: each round's median us/job}).

    A round with no clean window of a case in some mode counts for no mode of it.
    """
    modes = ["off", "on"] + (["before"] if before else [])
    queues = {batch: Queue(f"calls-{batch}", client, prefix=prefix) for batch in BATCHES}
    per_round: dict[tuple[str, int, str], list[float | None]] = {}
    clean = dict.fromkeys(("fetch", "finish"), 0)
    for queue in queues.values():  # load the scripts; no mode pays for that
        for mode in modes:
            one_round(queue, WINDOW, mode, WINDOW, before)
    for number in range(rounds):
        order = modes[number % len(modes):] + modes[:number % len(modes)]  # who goes first rotates
        for batch, queue in queues.items():
            for mode in order:
                fetches, finishes = one_round(queue, batch, mode, jobs, before)
                for _ in range(RETRIES):  # other clients' scripts spoiled every window: once more
                    if fetches and finishes:
                        break
                    more = one_round(queue, batch, mode, jobs, before)
                    fetches, finishes = fetches + more[0], finishes + more[1]
                for kind, windows in (("fetch", fetches), ("finish", finishes)):
                    clean[kind] += len(windows)
                    per_round.setdefault((kind, batch, mode), []).append(
                        statistics.median(windows) if windows else None)
    windows = rounds * len(BATCHES) * len(modes) * (jobs // WINDOW)
    print(f"{rounds} rounds x {jobs} jobs per case and setting; clean windows of {WINDOW} jobs: "
          f"fetch {clean['fetch']}, finish {clean['finish']}, of {windows} planned (a window during which "
          f"another client ran a script is left out; a round left with none runs again, up to {RETRIES} times)")
    costs = []
    for kind in ("finish", "fetch"):
        for batch in BATCHES:
            rows = [values for values in zip(*(per_round[kind, batch, mode] for mode in modes))
                    if None not in values]
            costs.append((f"{kind}, {batch} job{'s' if batch > 1 else ''} per call", WINDOW // batch,
                          {mode: [row[i] for row in rows] for i, mode in enumerate(modes)}))
    return costs


_WORKER = """
import sys, time
from echomq_django.core import Worker, WorkerOptions, connect
url, prefix, jobs, concurrency, minutes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
worker = Worker("work", lambda job: None, connect(url),
                WorkerOptions(prefix=prefix, concurrency=concurrency, metrics_minutes=minutes))
started = time.perf_counter()
done = worker.run(burst=True)
elapsed = time.perf_counter() - started
if done != jobs:
    sys.exit(f"the worker finished {done} jobs of {jobs}")
print(f"RATE {jobs / elapsed}")
"""


def worker_rate(client, url: str, prefix: str, jobs: int, minutes: int, concurrency: int = 8) -> float:
    """jobs/s of one Worker process draining `jobs` enqueued no-op jobs."""
    queue = Queue("work", client, prefix=prefix)
    try:
        for at in range(0, jobs, 10_000):
            queue.add_bulk([NewJob("noop") for _ in range(min(10_000, jobs - at))])
        proc = subprocess.run([sys.executable, "-c", _WORKER, url, prefix, str(jobs), str(concurrency),
                               str(minutes)], capture_output=True, text=True, timeout=jobs / 100 + 60,
                              cwd=BENCH.parent)
        return parse_rate(proc)
    finally:
        queue.obliterate()


def populated_minute(client, prefix: str) -> tuple[int, int, dict[str, str]]:
    """(MEMORY USAGE of one minute hash, of the totals hash, the minute's fields), every field written by the scripts.

    Real fetches start four jobs; finishes complete one, retry one and fail one
    for good; a sweep recovers the fourth (its lock gone) and samples `waiting`.
    All in one minute: when the minute turns meanwhile, it starts again.
    """
    for attempt in range(3):
        queue = Queue(f"memory-{attempt}", client, prefix=prefix)
        keys, scripts = queue.keys, queue.scripts
        minute = now_ms() // 60_000
        queue.add_bulk([NewJob("bench") for _ in range(4)])
        token = uuid.uuid4().hex
        [reply] = scripts.run_batch([scripts.fetch_call(keys, token, LOCK_MS, now_ms(), 4, "bench",
                                                        metrics_minutes=ON)], raise_on_error=True)
        ids = [job_id for job_id, _ in scripts.fetched(reply)[2]]
        ends = [Finish(ids[0], token, True, "null"), Finish(ids[1], token, False, "boom"),
                Finish(ids[2], token, False, "boom", final=True)]
        scripts.run_batch([scripts.finish_call(keys, ends, now_ms(), default_attempts=3, metrics_minutes=ON)],
                          raise_on_error=True)
        client.delete(keys.lock(ids[3]))  # its worker died, its lock lapsed
        client.zadd(keys.locks, {ids[3]: 0}, xx=True)
        sweeper = Sweeper(client, [queue.name], prefix=prefix, scripts=scripts, metrics_minutes=ON)
        for _ in range(3):  # mark, then recover
            if sweeper.sweep(sweeper.targets[0], force=True).recovered:
                break
        fields = client.hgetall(keys.metrics_minute(minute))
        if now_ms() // 60_000 == minute and set(FIELDS) <= set(fields):
            return (client.memory_usage(keys.metrics_minute(minute), samples=0),
                    client.memory_usage(keys.metrics_total, samples=0), fields)
    raise RuntimeError(f"no minute hash with every field: {fields}")


def widest_minute(client, prefix: str, fields: dict[str, str]) -> int:
    """MEMORY USAGE of a minute hash with the same fields, each holding a 13-digit number (a bound for any minute)."""
    key = f"{prefix}:{{memory-widest}}:metrics:{now_ms() // 60_000}"
    client.hset(key, mapping=dict.fromkeys(fields, 10**12))
    try:
        return client.memory_usage(key, samples=0)
    finally:
        client.delete(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of each case, off and on (median)")
    parser.add_argument("--jobs", type=int, default=512, help=f"jobs per round, a multiple of {WINDOW}")
    parser.add_argument("--worker-jobs", type=int, default=10_000)
    parser.add_argument("--worker-runs", type=int, default=5)
    parser.add_argument("--before", metavar="REV", help="also time the two scripts as of this git revision")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script runs")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.jobs, args.worker_jobs, args.worker_runs = 2, 64, 500, 1
    if args.jobs < WINDOW or args.jobs % WINDOW:
        parser.error(f"--jobs must be a multiple of {WINDOW}")
    client = connect(args.redis_url)
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    print(f"Redis {client.info('server')['redis_version']} at {args.redis_url}; python {sys.version.split()[0]}; "
          f"metrics off = metrics minutes {OFF}, on = {ON}"
          + (f"; before = the scripts of {args.before}" if args.before else ""))
    try:
        before = Before(client, args.before) if args.before else None
        costs = script_costs(client, prefix, args.rounds, args.jobs, before)
        print(f"{'case':<26}{'calls/window':>13}{'off us/job':>12}{'on us/job':>11}{'ratio on/off':>14}"
              f"{'on-off us/call':>16}{'ratio per round':>17}"
              + (f"{'before us/job':>15}{'off/before':>12}{'on/before':>11}" if before else ""))
        for label, calls, values in costs:
            if not values["off"]:
                print(f"{label:<26}{calls:>13}  no clean round (another client's scripts ran all along)")
                continue
            off, on = values["off"], values["on"]
            off_us, on_us = statistics.median(off), statistics.median(on)
            per_call = (on_us - off_us) * WINDOW / calls
            paired = sorted(b / a for a, b in zip(off, on))
            line = (f"{label:<26}{calls:>13}{off_us:>12.2f}{on_us:>11.2f}{on_us / off_us:>14.2f}{per_call:>16.1f}"
                    f"{f'{paired[0]:.2f}..{paired[-1]:.2f}':>17}")
            if before:
                before_us = statistics.median(values["before"])
                line += f"{before_us:>15.2f}{off_us / before_us:>12.2f}{on_us / before_us:>11.2f}"
            print(line)

        rates: dict[int, list[float]] = {OFF: [], ON: []}
        for number in range(args.worker_runs):
            for minutes in ((OFF, ON) if number % 2 == 0 else (ON, OFF)):
                rates[minutes].append(worker_rate(client, args.redis_url, prefix, args.worker_jobs, minutes))
        off_rate, on_rate = statistics.median(rates[OFF]), statistics.median(rates[ON])
        print(f"worker, concurrency 8, {args.worker_jobs:,} no-op jobs, median of {args.worker_runs}: "
              f"off {off_rate:,.0f} jobs/s, on {on_rate:,.0f} jobs/s, ratio on/off {on_rate / off_rate:.2f}")

        minute_bytes, total_bytes, fields = populated_minute(client, prefix)
        print(f"bytes per minute hash: {minute_bytes} (MEMORY USAGE; {len(fields)} fields: "
              f"{' '.join(f'{k}={v}' for k, v in sorted(fields.items()))})")
        widest = widest_minute(client, prefix, fields)
        print(f"bytes per minute hash, every value a 13-digit number: {widest} (an upper bound)")
        print(f"bytes of the totals hash: {total_bytes}")
        day, most = (bytes_ * DAY_MINUTES + total_bytes for bytes_ in (minute_bytes, widest))
        print(f"per queue per day: {day:,} bytes ({day / 1024:,.0f} KiB) = {DAY_MINUTES} minutes x "
              f"{minute_bytes} + {total_bytes}, at most {most:,} bytes ({most / 1024:,.0f} KiB); for a queue "
              "busy every minute (an idle minute writes no hash)")
    finally:
        drop(client, f"{prefix}:*")


if __name__ == "__main__":
    main()
