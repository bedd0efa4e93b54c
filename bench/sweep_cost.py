"""What one sweep costs Redis, at several sizes of the active list.

    python bench/sweep_cost.py [--redis-url URL] [--sizes 1000,10000,100000] [--dead 10000,100000] [--walk]

Steady sweep: N active jobs, all locked; one forced sweep finds nothing to do.
With --walk, the lock index is left out, so the sweep walks `active` and tests
every lock key (what it does when another client put ids in `active`).
Recovery: N marked jobs whose locks are gone; one forced sweep recovers all.
Redis-side time (how long Redis was blocked) comes from INFO commandstats for
the total and from SLOWLOG for the longest single script call (measure.py);
wall time is the client's. The keys live under a prefix of their own, deleted
afterwards. The SLOWLOG settings are restored at the end.
"""

import argparse
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from measure import ScriptTime, drop, script_time, slowlog_on  # noqa: E402

from echomq_django.core import Sweeper, connect  # noqa: E402
from echomq_django.core.protocol.keys import QueueKeys  # noqa: E402

STAGE_BATCH = 5000


def stage(client, keys: QueueKeys, count: int, *, locked: bool, marked: bool) -> None:
    """Put `count` jobs in `active` as moveToActive leaves them, with or without live locks and marks.

    Each id is in the lock index, scored by when its lock lapses (Redis's clock):
    10 minutes ahead when locked, long past when the lock is gone.
    """
    seconds, micros = client.time()
    lapses_at = seconds * 1000 + micros // 1000 + 600_000 if locked else 0
    for start in range(1, count + 1, STAGE_BATCH):
        ids = [str(n) for n in range(start, min(start + STAGE_BATCH, count + 1))]
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            pipe.hset(keys.job(job_id), mapping={"name": "bench", "data": "{}", "opts": '{"attempts":3}',
                                                 "timestamp": 0, "atm": 0, "ats": 1, "stc": 0, "tok": "t"})
            if locked:
                pipe.set(keys.lock(job_id), "t", px=600_000)
        pipe.lpush(keys.active, *ids)
        pipe.zadd(keys.locks, dict.fromkeys(ids, lapses_at))
        if marked:
            pipe.sadd(keys.stalled, *ids)
        pipe.execute()


def measured_sweep(client, keys: QueueKeys) -> tuple[ScriptTime, object]:
    """One forced sweep: its Redis time, and its report."""
    sweeper = Sweeper(client, [keys.queue], prefix=keys.prefix)
    return script_time(client, lambda: sweeper.sweep(sweeper.targets[0], force=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--dead", default="10000,100000")
    parser.add_argument("--walk", action="store_true", help="leave the lock index out: walk every lock")
    args = parser.parse_args()
    client = connect(args.redis_url)
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    print(f"Redis {client.info('server')['redis_version']}, budget per call "
          f"{Sweeper(client, ['x']).budget} ids")
    print(f"{'case':<34} {'calls':>6} {'redis total ms':>15} {'longest call ms':>16} {'wall ms':>9}  outcome")
    with slowlog_on(client):
        for kind, sizes in (("steady, all locked", args.sizes), ("recover marked dead", args.dead)):
            for size in (int(s) for s in sizes.split(",") if s):
                keys = QueueKeys(f"{kind.split()[0].rstrip(',')}-{size}", prefix)
                dead = kind.startswith("recover")
                stage(client, keys, size, locked=not dead, marked=dead)
                if args.walk:
                    client.delete(keys.locks)
                timing, report = measured_sweep(client, keys)
                outcome = f"recovered {report.recovered}" if dead else f"marked {report.marked}"
                print(f"{kind + f', {size:,} active':<34} {timing.calls:>6} {timing.total_ms:>15.1f} "
                      f"{timing.longest_ms:>16.2f} {timing.wall_ms:>9.1f}  {outcome}")
                drop(client, keys.base.replace("{", "\\{").replace("}", "\\}") + "*")


if __name__ == "__main__":
    main()
