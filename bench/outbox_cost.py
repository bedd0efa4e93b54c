"""What the transactional outbox costs: an enqueue inside a transaction with it and without, and commit to start.

    python bench/outbox_cost.py [--database-url URL] [--transactions 200] [--runs 3]

On a private redis-server and a database of its own (default: a new SQLite
file; give a PostgreSQL URL of a scratch database to measure that, its
tables are created and dropped), prints:

- µs per job of `@job` enqueues inside `transaction.atomic()`, the commit
  included, one job and 100 jobs per transaction, without the outbox (the add
  goes to Redis inside the transaction) and with it (a row in the
  transaction, then one round trip and a delete after the commit); best of
  `--runs`, the modes alternating;
- the time from the commit to the job's start in a worker (median and p99 of
  50 jobs) in both modes;
- the same with Redis stopped at the commit and started 2 s later: the commit
  returns at once (the outbox) and the job starts once the relay (every 1 s)
  sends it: the default relay's (rows 5 s old), then `--after 1`'s.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from beat_cost import start_redis, stop_process  # noqa: E402  (bench/ is the script's own folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", help="default: a new SQLite file")
    parser.add_argument("--transactions", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="echomq-outbox-bench-"))
    server, url = start_redis(workdir)
    os.environ.update({"DJANGO_SETTINGS_MODULE": "demo_project.settings", "ECHOMQ_REDIS_URL": url,
                       "ECHOMQ_PREFIX": f"bench{uuid.uuid4().hex[:8]}",
                       "DATABASE_URL": args.database_url or f"sqlite:///{workdir / 'bench.sqlite3'}"})
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.test.utils import override_settings

    from demo_project.demo_app.jobs import greet
    from echomq_django.core import Worker, WorkerOptions
    from echomq_django.outbox import RELAY_AFTER_S, Relay
    from echomq_django.queues import get_queue

    call_command("migrate", "echomq", verbosity=0)

    base, overridden = dict(settings.ECHOMQ), []

    def configure(**changes: object) -> None:
        """ECHOMQ with `changes` (through override_settings, so the cached settings and clients follow)."""
        if overridden:
            overridden.pop().disable()
        overridden.append(override_settings(ECHOMQ={**base, **changes}))
        overridden[-1].enable()

    def outbox(on: bool) -> None:
        configure(OUTBOX=on)

    from django.contrib.auth.models import Group

    call_command("migrate", "auth", verbosity=0)

    def enqueue(jobs: int, own_write: bool) -> None:
        with transaction.atomic():
            if own_write:  # the request's own change, which a job is usually about
                Group.objects.create(name=uuid.uuid4().hex)
            for _ in range(jobs):
                greet.enqueue("x")

    print(f"database: {connection.vendor}; Redis {url} (private); {args.transactions} transactions per run, "
          f"best of {args.runs}")
    print(f"{'µs per job, commit included':<44}{'without':>10}{'outbox':>10}{'ratio':>8}")
    for own_write in (False, True):
        for jobs in (1, 100):
            transactions = max(1, args.transactions // jobs * (10 if jobs > 1 else 1))
            best = {False: float("inf"), True: float("inf")}
            for _ in range(args.runs):
                for on in (False, True):
                    outbox(on)
                    started = time.perf_counter()
                    for _ in range(transactions):
                        enqueue(jobs, own_write)
                    best[on] = min(best[on], (time.perf_counter() - started) / (transactions * jobs) * 1e6)
            what = f"{jobs} job(s) per transaction" + (", and a row of its own" if own_write else "")
            print(f"{what:<44}{best[False]:>10.0f}{best[True]:>10.0f}{best[True] / best[False]:>8.2f}")
    Group.objects.all().delete()
    get_queue("demo").client.flushdb()

    starts: dict[str, float] = {}

    def handler(job):
        starts[job.data["args"][0]] = time.time()

    queue = get_queue("demo", long_running=True)
    worker = Worker("demo", handler, queue.client, WorkerOptions(prefix=queue.keys.prefix), scripts=queue.scripts)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()

    def commit_to_start(tag: str) -> tuple[float, bool]:
        """ms from the commit's start to the job's start, and whether the job started before the commit ended."""
        committed = [0.0]
        with transaction.atomic():
            transaction.on_commit(lambda: committed.__setitem__(0, time.time()))  # runs first after the commit
            greet.enqueue(tag)
            time.sleep(0.002)  # the rest of the request's work in the transaction
            committing = time.time()
        deadline = time.monotonic() + 60
        while tag not in starts and time.monotonic() < deadline:
            time.sleep(0.0005)
        return (starts[tag] - committing) * 1000, starts[tag] < committed[0]

    print(f"\n{'from the commit to the start, ms':<34}{'p50':>10}{'p99':>10}  started before the commit ended")
    for on in (False, True):
        outbox(on)
        taken, early = [], 0
        for n in range(50):
            ms, before = commit_to_start(f"{on}-{n}")
            taken.append(ms)
            early += before
            time.sleep(0.02)
        taken.sort()
        print(f"{'with the outbox' if on else 'without':<34}{statistics.median(taken):>10.2f}{taken[48]:>10.2f}"
              f"  {early} of 50")

    # An outage at the commit: the commit returns, the row waits, the relay sends it once Redis is back: with the
    # relay's default (echomq_sweep's, rows RELAY_AFTER_S old), then with `echomq_relay --after 1`.
    configure(OUTBOX=True, ENQUEUE_TIMEOUT=0.5)
    port = url.rsplit(":", 1)[1].split("/")[0]
    for after_s in (RELAY_AFTER_S, 1.0):
        relay = Relay(interval_s=1.0, after_s=after_s)
        threading.Thread(target=relay.run, daemon=True).start()
        stop_process(server)
        tag = f"outage-{after_s:g}"
        began = time.perf_counter()
        with transaction.atomic():
            greet.enqueue(tag)
        commit_ms = (time.perf_counter() - began) * 1000
        time.sleep(2.0)
        server = subprocess.Popen(["redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", str(workdir), "--logfile", "redis.log"],
                                  stdout=subprocess.DEVNULL)
        back = time.time()
        deadline = time.monotonic() + 60
        while tag not in starts and time.monotonic() < deadline:
            time.sleep(0.01)
        print(f"\nRedis stopped at the commit for 2 s, a relay of rows {after_s:g} s old: the commit took "
              f"{commit_ms:.0f} ms (the failed send, bounded by ENQUEUE_TIMEOUT 0.5 s); the job started "
              f"{(starts.get(tag, float('nan')) - back) * 1000:.0f} ms after Redis was back")
        relay.stop()
    worker.stop()
    stop_process(server)
    if connection.vendor != "sqlite":
        call_command("migrate", "echomq", "zero", verbosity=0)


if __name__ == "__main__":
    main()
