"""What several schedulers cost, and that each tick of each schedule still becomes exactly one job.

    python -u bench/beat_cost.py [--schedules 1000] [--every 1,2,5] [--beats 1,3,10] [--seconds 20] [--quick]

Starts a private redis-server on a free loopback port (no persistence) and
migrates a fresh SQLite file (echomq_beat reads the Schedule table too). Then,
for each count N of `--beats`, on an emptied Redis: starts N real
`manage.py echomq_beat` processes (settings bench/beat_settings.py:
`--schedules` interval schedules of the demo's greet job on one queue, EVERY
cycling through `--every`), waits until every one has loaded its schedules
and 3 s more (each then sends a first round for every schedule: startup, not
measured), lets them run `--seconds` (the window), then 3 s more so the
window's last ticks can fire, and stops each with SIGTERM, waited by pid. No
worker runs: the jobs stay in `wait`.

From Redis it then counts, for the ticks that fell inside the window:
  jobs       the window's ticks that have a job (ids "<schedule>@<tick ms>" in wait)
  missing    the window's ticks with no job
  >1 job     ticks whose id sits in wait more than once, or was announced
             "added" more than once on the queue's event stream (must be 0)
  decisions  the "fired" counters of every schedule's record (one per tick a
             scheduler decided to fire, whichever one) against all the jobs
             added in the run, and the "fired job" lines the schedulers printed
             (one per decision they made): all three must be equal.
  missed     the records' "missed" counters, the whole run: ticks decided
             too late to fire (a new schedule's first late tick is "new",
             not counted)
Lateness, per job of the window, in ms after its tick:
  added      when Redis ran the script that added it (the ms of its "added"
             entry on the event stream, read while the run goes on, as the
             stream is capped)
  stamped    its `timestamp` field: the `now` the scheduler sent, taken when its
             round began, before the round's pipeline of calls went out; it
             leaves out how long the round took to reach Redis and run
Cost, over the window: EVALSHA calls per second and Redis time in scripts
(INFO commandstats), Redis CPU (INFO cpu) and the schedulers' CPU (from
/proc), as % of one core. The 1-scheduler row is the baseline the others'
p99 lateness and calls per second are divided by. The exit status is 1 when a
tick got more than one job or the decisions do not match the jobs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "bench"
QUEUE = "demo"  # bench/beat_settings.py's queue
# After every scheduler printed its schedules it reads them again and sends a first round for all of them
# (each schedule's newest tick, which mostly some other scheduler or an earlier round had decided): startup,
# not the steady state measured, and with 10 schedulers on 2 cores it lands up to a second later.
SETTLE_S = 3.0
TAIL_S = 3.0  # after the window, so its last ticks can fire before the schedulers stop
READ_EVERY_S = 0.25  # how often the event stream is read during a run (it keeps about 10,000 entries)
LOADED = re.compile(r"^(\d+) schedule\(s\): ", re.MULTILINE)
SCHEDULE = re.compile(r"(\S+) \(every ([\d.,]+) s -> ")


def now_ms() -> int:
    return int(time.time() * 1000)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    """A private redis-server without persistence on a free loopback port, and its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed")
    for _ in range(5):  # another process may take the port between the probe and the bind
        port = free_port()
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                 "--appendonly", "no", "--dir", str(workdir), "--logfile", "redis.log"],
                                stdout=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                client.ping()
                return proc, url
            except redis.ConnectionError:
                time.sleep(0.05)
        stop_process(proc)
    sys.exit(f"redis-server did not start; see {workdir / 'redis.log'}")


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM, wait; a second SIGTERM (the schedulers' "stop now"), wait; then SIGKILL. The exit code."""
    for last in (False, True):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout if not last else 10)
        except subprocess.TimeoutExpired:
            continue
    proc.kill()
    return proc.wait()


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc), None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[int], pct: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))]


@dataclass
class Run:
    beats: int
    window_ms: int = 0
    expected: int = 0  # ticks inside the window
    jobs_in_window: int = 0
    missing: list[tuple[str, int]] = field(default_factory=list)
    jobs_total: int = 0  # distinct jobs, the whole run
    several_in_wait: int = 0  # ids in wait more than once
    added_twice: int = 0  # ids announced "added" more than once
    fired_decisions: int = 0  # sum of the records' "fired" counters
    printed_fired: list[int] = field(default_factory=list)  # "fired job" lines, per scheduler
    missed_decisions: int = 0
    added_late: list[int] = field(default_factory=list)
    stamped_late: list[int] = field(default_factory=list)
    events_read: int = 0
    calls: int = 0
    script_ms: float = 0.0
    redis_cpu_s: float = 0.0
    beats_cpu_s: float | None = None
    exit_codes: list[int] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        return self.several_in_wait + self.added_twice

    @property
    def decisions_match(self) -> bool:
        return self.fired_decisions == self.jobs_total == sum(self.printed_fired)

    def per_second(self, value: float) -> float:
        return value / (self.window_ms / 1000)


class EventReader:
    """Reads the queue's capped event stream as it grows: the Redis ms of each "added" job id."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.client, self.key = client, key
        self.last = "0-0"
        self.added: dict[str, int] = {}  # job id -> ms Redis added it (the first time)
        self.twice: Counter[str] = Counter()
        self.read = 0

    def poll(self) -> None:
        while True:
            entries = self.client.xrange(self.key, f"({self.last}" if self.last != "0-0" else "-", count=10_000)
            for entry_id, fields in entries:
                self.read += 1
                if fields.get("event") == "added":
                    job_id = fields["jobId"]
                    if job_id in self.added:
                        self.twice[job_id] += 1
                    else:
                        self.added[job_id] = int(entry_id.split("-")[0])
            if entries:
                self.last = entries[-1][0]
            if len(entries) < 10_000:
                return

    def unread(self) -> int:
        """Entries trimmed from the stream before they were read (Redis 7 counts every entry ever added)."""
        added = self.client.xinfo_stream(self.key).get("entries-added") if self.client.exists(self.key) else 0
        return max(0, int(added or 0) - self.read)


def evalsha(client: redis.Redis) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return stats.get("calls", 0), stats.get("usec", 0)


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def run(beats: int, env: dict[str, str], url: str, workdir: Path, seconds: float) -> Run:
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushall()
    client.config_resetstat()
    base = f"{PREFIX}:{{{QUEUE}}}:"
    result = Run(beats)
    outputs = [workdir / f"beats{beats}-{n}.out" for n in range(beats)]
    errors = [workdir / f"beats{beats}-{n}.err" for n in range(beats)]
    procs = []
    for out, err in zip(outputs, errors):
        with open(out, "w") as stdout, open(err, "w") as stderr:
            procs.append(subprocess.Popen([sys.executable, "-u", "manage.py", "echomq_beat"], cwd=ROOT, env=env,
                                          stdout=stdout, stderr=stderr))
    reader = EventReader(client, base + "events")
    periods: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 60 + 10 * beats
        waiting = set(range(beats))
        while waiting:
            for n in sorted(waiting):
                if procs[n].poll() is not None:
                    raise RuntimeError(f"scheduler {n} exited {procs[n].returncode}: {errors[n].read_text()[-3000:]}")
                text = outputs[n].read_text()
                if (loaded := LOADED.search(text)) and "\n" in text[loaded.start():]:
                    line = text[loaded.start():].split("\n", 1)[0]
                    found = {name: round(float(every.replace(",", "")) * 1000)
                             for name, every in SCHEDULE.findall(line)}
                    if len(found) != int(loaded.group(1)) or (periods and found != periods):
                        raise RuntimeError(f"scheduler {n} loaded other schedules: {line[:300]}")
                    periods = found
                    waiting.discard(n)
            if time.monotonic() > deadline:
                raise RuntimeError(f"schedulers {sorted(waiting)} did not load their schedules in time")
            reader.poll()
            time.sleep(0.05)
        settled = time.monotonic() + SETTLE_S
        while time.monotonic() < settled:
            reader.poll()
            time.sleep(READ_EVERY_S)
        start = now_ms()
        calls_before, usec_before = evalsha(client)
        cpu_before = redis_cpu(client)
        beats_before = [cpu_seconds(proc.pid) for proc in procs]
        end = start + round(seconds * 1000)
        while now_ms() < end:
            reader.poll()
            time.sleep(min(READ_EVERY_S, max(0.0, (end - now_ms()) / 1000)))
        calls_after, usec_after = evalsha(client)
        result.redis_cpu_s = redis_cpu(client) - cpu_before
        beats_after = [cpu_seconds(proc.pid) for proc in procs]
        result.window_ms = now_ms() - start
        end = start + result.window_ms
        if None not in beats_before and None not in beats_after:
            result.beats_cpu_s = sum(after - before for before, after in zip(beats_before, beats_after))
        result.calls, result.script_ms = calls_after - calls_before, (usec_after - usec_before) / 1000
        tail_end = time.monotonic() + TAIL_S
        while time.monotonic() < tail_end:
            reader.poll()
            time.sleep(READ_EVERY_S)
    finally:
        result.exit_codes = [stop_process(proc) for proc in procs]
    reader.poll()
    for n, code in enumerate(result.exit_codes):
        if code != 0:
            print(f"  scheduler {n} of {beats} exited {code}: {errors[n].read_text()[-2000:]}", file=sys.stderr)

    ids = client.lrange(base + "wait", 0, -1)
    distinct = list(dict.fromkeys(ids))
    result.jobs_total = len(distinct)
    result.several_in_wait = sum(1 for count in Counter(ids).values() if count > 1)
    result.added_twice = len(reader.twice)
    result.events_read = len(reader.added)
    if unread := reader.unread():
        print(f"  ({beats} scheduler(s): {unread} events were trimmed from the stream before they were read)",
              file=sys.stderr)
    pipe = client.pipeline(transaction=False)
    for job_id in distinct:
        pipe.hget(base + job_id, "timestamp")
    stamps = dict(zip(distinct, pipe.execute()))
    pipe = client.pipeline(transaction=False)
    for name in periods:
        pipe.hmget(base + "schedule:" + name, "fired", "missed")
    for fired, missed in pipe.execute():
        result.fired_decisions += int(fired or 0)
        result.missed_decisions += int(missed or 0)
    result.printed_fired = [out.read_text().count(" fired job ") for out in outputs]

    jobs = set(distinct)
    result.expected = 0
    for name, period in periods.items():
        for tick in range((start // period + 1) * period, end + 1, period):
            result.expected += 1
            job_id = f"{name}@{tick}"
            if job_id not in jobs:
                result.missing.append((name, tick))
                continue
            result.jobs_in_window += 1
            if job_id in reader.added:
                result.added_late.append(reader.added[job_id] - tick)
            if stamps.get(job_id) is not None:
                result.stamped_late.append(int(stamps[job_id]) - tick)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--every", default="1,2,5", help="seconds between ticks, cycled over the schedules")
    parser.add_argument("--beats", default="1,3,10", help="scheduler process counts; the first is the baseline")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each run's window")
    parser.add_argument("--quick", action="store_true", help="30 schedules, 1 and 2 schedulers, 4 s each")
    args = parser.parse_args()
    if args.quick:
        args.schedules, args.beats, args.seconds = 30, "1,2", 4.0
    counts = [int(count) for count in args.beats.split(",")]
    every = [float(seconds) for seconds in args.every.split(",")]
    per_second = sum(1 / every[n % len(every)] for n in range(args.schedules))

    workdir = Path(tempfile.mkdtemp(prefix="echomq-beat-bench-"))
    server, url = start_redis(workdir)
    try:
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "bench.beat_settings", "ECHOMQ_REDIS_URL": url,
               "ECHOMQ_PREFIX": PREFIX, "DATABASE_URL": f"sqlite:///{workdir / 'beat.sqlite3'}",
               "BENCH_BEAT_SCHEDULES": str(args.schedules), "BENCH_BEAT_EVERY": args.every}
        migrate = subprocess.run([sys.executable, "-u", "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=300)
        if migrate.returncode != 0:
            sys.exit(f"migrate failed: {migrate.stderr[-3000:]}")
        version = redis.Redis.from_url(url).info("server")["redis_version"]
        print(f"Redis {version} (private, no persistence); python {sys.version.split()[0]}; {os.cpu_count()} CPUs; "
              f"{args.schedules:,} schedules every {args.every} s ({per_second:,.0f} ticks/s); "
              f"{args.seconds:g} s window per run")
        results = []
        for count in counts:
            results.append(run(count, env, url, workdir, args.seconds))
            done = results[-1]
            print(f"  {count} scheduler(s): {done.jobs_in_window:,} jobs in the window, "
                  f"{len(done.missing)} missing, {done.duplicates} ticks with more than one job")
    finally:
        stop_process(server)
        shutil.rmtree(workdir, ignore_errors=True)

    base = results[0]
    label = [f"{r.beats} scheduler{'s' if r.beats > 1 else ''}" + (" (baseline)" if r is base else "")
             for r in results]
    width = max(map(len, label)) + 2
    print("\nticks of the window (each must have exactly one job)")
    print(f"{'':<{width}}{'window s':>9}{'ticks':>8}{'jobs':>8}{'missing':>9}{'>1 job':>8}"
          f"{'fired decisions':>17}{'jobs (all)':>12}{'printed':>9}{'missed':>8}")
    for name, r in zip(label, results):
        print(f"{name:<{width}}{r.window_ms / 1000:>9.1f}{r.expected:>8,}{r.jobs_in_window:>8,}{len(r.missing):>9,}"
              f"{r.duplicates:>8}{r.fired_decisions:>17,}{r.jobs_total:>12,}{sum(r.printed_fired):>9,}"
              f"{r.missed_decisions:>8}")
    print("\nlateness of the window's jobs, ms after the tick (added: Redis ran the script; stamped: the job's"
          " timestamp)")
    print(f"{'':<{width}}{'added p50':>10}{'p99':>8}{'max':>8}{'stamped p50':>13}{'p99':>8}{'max':>8}"
          f"{'p99 / baseline':>16}")
    for name, r in zip(label, results):
        p99 = percentile(r.added_late, 99)
        print(f"{name:<{width}}{percentile(r.added_late, 50):>10.0f}{p99:>8.0f}{max(r.added_late, default=0):>8}"
              f"{percentile(r.stamped_late, 50):>13.0f}{percentile(r.stamped_late, 99):>8.0f}"
              f"{max(r.stamped_late, default=0):>8}{p99 / max(percentile(base.added_late, 99), 1):>16.2f}")
    print("\ncost over the window (CPU as % of one core)")
    print(f"{'':<{width}}{'script calls/s':>15}{'per tick':>10}{'script ms/s':>13}{'Redis CPU':>11}"
          f"{'schedulers CPU':>16}{'calls / baseline':>18}{'decided by each':>17}")
    for name, r in zip(label, results):
        calls = r.per_second(r.calls)
        beats_cpu = f"{100 * r.per_second(r.beats_cpu_s):.0f}%" if r.beats_cpu_s is not None else "n/a"
        shares = f"{min(r.printed_fired)}-{max(r.printed_fired)}" if r.beats > 1 else str(r.printed_fired[0])
        print(f"{name:<{width}}{calls:>15,.0f}{r.calls / max(r.expected, 1):>10.2f}{r.per_second(r.script_ms):>13.1f}"
              f"{100 * r.per_second(r.redis_cpu_s):>10.0f}%{beats_cpu:>16}"
              f"{calls / max(base.per_second(base.calls), 1):>18.2f}{shares:>17}")
    for r in results:
        if r.missing:
            shown = ", ".join(f"{name}@{tick}" for name, tick in r.missing[:5])
            print(f"{r.beats} scheduler(s): {len(r.missing)} missing ticks, e.g. {shown}")
        if r.events_read < r.jobs_total:
            print(f"{r.beats} scheduler(s): {r.jobs_total - r.events_read} jobs without an 'added' event read "
                  "(no added lateness for them)")
    bad = [r.beats for r in results if r.duplicates or not r.decisions_match]
    if bad:
        print(f"FAILED: a tick with more than one job, or decisions that do not match the jobs, with {bad} "
              "scheduler(s)")
        sys.exit(1)
    print("every tick of the window decided once: no tick with more than one job, decisions = jobs")


if __name__ == "__main__":
    main()
