"""What one sweep costs Redis, at several sizes of the active list.

    python bench/sweep_cost.py [--redis-url URL] [--sizes 1000,10000,100000] [--dead 10000,100000]

Steady sweep: N active jobs, all locked; one forced sweep finds nothing to do.
Recovery: N marked jobs whose locks are gone; one forced sweep recovers all.
Redis-side time (how long Redis was blocked) comes from INFO commandstats for
the total and from SLOWLOG for the longest single script call; wall time is the
client's. The keys live under a prefix of their own,
deleted afterwards. The SLOWLOG settings are restored at the end.
"""

import argparse
import time
import uuid

from echomq_django.core import Sweeper, connect
from echomq_django.core.keys import QueueKeys

STAGE_BATCH = 5000
# Calls faster than this are not logged; the table then shows this as an upper bound.
SLOWLOG_THRESHOLD_US = 100


def stage(client, keys: QueueKeys, count: int, *, locked: bool, marked: bool) -> None:
    """Put `count` jobs in `active`, with or without live locks and marks."""
    for start in range(1, count + 1, STAGE_BATCH):
        ids = [str(n) for n in range(start, min(start + STAGE_BATCH, count + 1))]
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hset(keys.job(job_id), mapping={"name": "bench", "data": "{}", "opts": '{"attempts":3}',
                                                 "timestamp": 0, "atm": 0, "ats": 1, "stc": 0, "tok": "t"})
            if locked:
                pipe.set(keys.lock(job_id), "t", px=600_000)
        pipe.lpush(keys.active, *ids)
        if marked:
            pipe.sadd(keys.stalled, *ids)
        pipe.execute()


def evalsha_stats(client) -> tuple[int, int]:
    """(calls, microseconds) of EVALSHA so far; a script's time includes the commands it runs."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return stats.get("calls", 0), stats.get("usec", 0)


def measured_sweep(client, keys: QueueKeys) -> dict:
    """One forced sweep: Redis time from INFO commandstats, the longest call from SLOWLOG."""
    sweeper = Sweeper(client, [keys.queue], prefix=keys.prefix)
    client.slowlog_reset()
    calls_before, usec_before = evalsha_stats(client)
    started = time.perf_counter()
    report = sweeper.sweep(sweeper.targets[0], force=True)
    wall_ms = (time.perf_counter() - started) * 1000
    calls_after, usec_after = evalsha_stats(client)
    # Redis 7 also logs the commands a script runs; only top-level EVALSHA counts here.
    logged = [entry["duration"] for entry in client.slowlog_get(10_000)
              if str(entry["command"]).startswith(("EVALSHA", "b'EVALSHA"))
              and entry["client_address"] not in ("?:0", b"?:0")]
    return {"report": report, "wall_ms": wall_ms, "calls": calls_after - calls_before,
            "redis_total_ms": (usec_after - usec_before) / 1000,
            "redis_longest_ms": max(logged, default=SLOWLOG_THRESHOLD_US) / 1000}


def drop(client, keys: QueueKeys) -> None:
    batch = []
    for key in client.scan_iter(match=keys.base.replace("{", "\\{").replace("}", "\\}") + "*", count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            client.unlink(*batch)
            batch = []
    if batch:
        client.unlink(*batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--dead", default="10000,100000")
    args = parser.parse_args()
    client = connect(args.redis_url)
    saved = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", SLOWLOG_THRESHOLD_US)
    client.config_set("slowlog-max-len", 10_000)
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    print(f"Redis {client.info('server')['redis_version']}, budget per call "
          f"{Sweeper(client, ['x']).budget} ids")
    print(f"{'case':<34} {'calls':>6} {'redis total ms':>15} {'longest call ms':>16} {'wall ms':>9}  outcome")
    try:
        for kind, sizes in (("steady, all locked", args.sizes), ("recover marked dead", args.dead)):
            for size in (int(s) for s in sizes.split(",") if s):
                keys = QueueKeys(f"{kind.split()[0]}-{size}", prefix)
                dead = kind.startswith("recover")
                stage(client, keys, size, locked=not dead, marked=dead)
                m = measured_sweep(client, keys)
                r = m["report"]
                outcome = f"recovered {r.recovered}" if dead else f"marked {r.marked}"
                print(f"{kind + f', {size:,} active':<34} {m['calls']:>6} {m['redis_total_ms']:>15.1f} "
                      f"{m['redis_longest_ms']:>16.2f} {m['wall_ms']:>9.1f}  {outcome}")
                drop(client, keys)
    finally:
        client.config_set("slowlog-log-slower-than", saved["slowlog-log-slower-than"])
        client.config_set("slowlog-max-len", saved["slowlog-max-len"])


if __name__ == "__main__":
    main()
