"""What a workflow costs Redis, and how soon a chord's callback starts, beside Celery's chord.

    python bench/workflow_cost.py [--redis-url URL] [--members 10000] [--rounds 5] [--quick]

1. Redis time per member end: fetch and finish driven directly, 32 jobs per
   call as a busy worker sends them, for plain jobs (the baseline) and for the
   members of a chord (each end also writes its result under the callback and
   counts it down). EVALSHA usec of INFO commandstats around each finish call.
2. The longest script call over the whole life of a chord of `--members`
   members (its add, every member's fetch and end, the callback), beside the
   longest over as many plain jobs (add_bulk, fetches, ends): SLOWLOG.
3. From the last member's end to the callback's start: a real Worker
   (threads, concurrency 8) runs a chord of 1,000 no-op members; the
   callback's processedOn minus the latest member finishedOn, median of
   `--rounds`. Celery's chord (Redis broker and result backend, a threads
   worker of 8, `celery` installed) on the same Redis: the callback's own
   clock at its start minus the latest member's clock at its return.

The keys go under a prefix of their own, deleted at the end. Run it on a
Redis nobody else uses (the SLOWLOG and commandstats are Redis-wide).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import drop, script_time, slowlog_on  # noqa: E402
from echomq_django.core import (  # noqa: E402
    Chord,
    Group,
    JobOptions,
    Member,
    NewJob,
    Plan,
    Queue,
    Retention,
    Worker,
    WorkerOptions,
    connect,
)
from echomq_django.core.producing.queue import now_ms  # noqa: E402
from echomq_django.core.protocol.scripts import Finish  # noqa: E402

WINDOW = 32


def evalsha_usec(client) -> int:
    return client.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0)


def end_costs(queue: Queue, jobs: int) -> list[float]:
    """us of Redis per job of each finish call of WINDOW jobs, taking and ending every ready job."""
    costs = []
    while True:
        [reply] = queue.scripts.run_batch([queue.scripts.fetch_call(
            queue.keys, uuid.uuid4().hex, 30_000, now_ms(), WINDOW, "bench")], raise_on_error=True)
        _due, _held, taken = queue.scripts.fetched(reply)
        if not taken:
            return costs
        token = taken[0][1][taken[0][1].index("tok") + 1]
        call = queue.scripts.finish_call(queue.keys, [Finish(job_id, token, True, "1") for job_id, _ in taken],
                                         now_ms(), default_attempts=1, keep_completed=(-1, 0), keep_failed=(-1, 0))
        before = evalsha_usec(queue.client)
        queue.scripts.run_batch([call], raise_on_error=True)
        if len(taken) == WINDOW:
            costs.append((evalsha_usec(queue.client) - before) / len(taken))


def member(queue: Queue, n: int) -> Member:
    return Member(queue, "noop", {"n": n}, JobOptions(attempts=1))


def per_end(client, jobs: int, rounds: int) -> None:
    plain, chord = [], []
    for _ in range(rounds):
        queue = Queue("q", client, prefix=f"bench{uuid.uuid4().hex[:8]}")
        queue.add_bulk([NewJob("noop", {"n": n}, JobOptions(attempts=1)) for n in range(jobs)])
        plain.append(statistics.median(end_costs(queue, jobs)))
        Plan.of(Chord(Group(member(queue, n) for n in range(jobs)), member(queue, -1))).add()
        chord.append(statistics.median(end_costs(queue, jobs)))
        drop(client, f"{queue.keys.prefix}:*")
    p, c = statistics.median(plain), statistics.median(chord)
    print(f"Redis time per member end (finish calls of {WINDOW}, {jobs} jobs, median of {rounds}): "
          f"plain job {p:.1f} us, chord member {c:.1f} us ({c / p:.2f}x, +{c - p:.1f} us)")


def longest_calls(client, members: int) -> None:
    def life(kind: str) -> None:
        queue = Queue("q", client, prefix=f"bench{uuid.uuid4().hex[:8]}")
        try:
            def run() -> None:
                if kind == "chord":
                    Plan.of(Chord(Group(member(queue, n) for n in range(members)), member(queue, -1))).add()
                else:
                    queue.add_bulk([NewJob("noop", {"n": n}, JobOptions(attempts=1)) for n in range(members + 1)])
                Worker("q", lambda job: 1, client, WorkerOptions(prefix=queue.keys.prefix, concurrency=8,
                                                                 keep_completed=Retention(count=1000),
                                                                 block_timeout_s=0.1)).run(burst=True)

            with slowlog_on(client):
                spent, _ = script_time(client, run)
            print(f"  {kind:<6} {members + 1} jobs: {spent.calls} script calls, {spent.total_ms:.0f} ms of Redis, "
                  f"longest call {spent.longest_ms:.2f} ms")
        finally:
            drop(client, f"{queue.keys.prefix}:*")

    print("Longest script call over a whole life (add, fetch, end; a worker of 8 threads, keep 1,000 completed):")
    life("plain")
    life("chord")


def callback_latency(client, rounds: int, members: int = 1000) -> list[float]:
    latencies = []
    for _ in range(rounds):
        queue = Queue("q", client, prefix=f"bench{uuid.uuid4().hex[:8]}")
        try:
            plan = Plan.of(Chord(Group(member(queue, n) for n in range(members)), member(queue, -1)))
            plan.add()
            options = WorkerOptions(prefix=queue.keys.prefix, concurrency=8, keep_completed=Retention(),
                                    block_timeout_s=0.1)
            Worker("q", lambda job: 1, client, options).run(burst=True)
            pipe = client.pipeline(transaction=False)
            for step in plan.steps:
                pipe.hmget(queue.keys.job(step.id), "finishedOn", "processedOn")
            times = pipe.execute()
            last_end = max(int(finished) for finished, _ in times[:-1])
            latencies.append(int(times[-1][1]) - last_end)
        finally:
            drop(client, f"{queue.keys.prefix}:*")
    return latencies


CELERY_APP = textwrap.dedent("""
    import os, time
    import redis
    from celery import Celery

    URL = os.environ["BENCH_URL"]
    app = Celery("wfbench", broker=URL, backend=URL)
    marks = redis.Redis.from_url(URL)

    @app.task
    def noop(n):
        marks.rpush(os.environ["BENCH_KEY"] + ":ends", repr(time.time()))
        return n

    @app.task
    def callback(results):
        marks.set(os.environ["BENCH_KEY"] + ":start", repr(time.time()))
        return len(results)
""")


def celery_latency(url: str, rounds: int, members: int = 1000) -> list[float] | None:
    if importlib.util.find_spec("celery") is None:
        print("celery: skipped, not installed (pip install celery)")
        return None
    client = connect(url)
    key = f"wfbench{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as workdir:
        Path(workdir, "wfbench.py").write_text(CELERY_APP)
        env = {**os.environ, "BENCH_URL": url, "BENCH_KEY": key, "PYTHONPATH": workdir}
        worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "wfbench", "worker", "-P", "threads",
                                   "-c", "8", "--loglevel", "WARNING"], cwd=workdir, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        sys.path.insert(0, workdir)
        os.environ.update(BENCH_URL=url, BENCH_KEY=key)
        import celery  # noqa: F401
        import wfbench  # type: ignore[import-not-found]

        latencies = []
        try:
            for _ in range(rounds):
                client.delete(f"{key}:ends", f"{key}:start")
                result = celery.chord(wfbench.noop.s(n) for n in range(members))(wfbench.callback.s())
                assert result.get(timeout=300) == members
                ends = [float(value) for value in client.lrange(f"{key}:ends", 0, -1)]
                latencies.append((float(client.get(f"{key}:start")) - max(ends)) * 1000)
                group_id = result.parent.id
                # Celery's results and its chord's counters (the Redis backend's "<group>.j" and "<group>.t")
                client.delete(*[f"celery-task-meta-{task.id}" for task in result.parent.results],
                              f"celery-task-meta-{result.id}", f"{group_id}.j", f"{group_id}.t")
        finally:
            os.killpg(worker.pid, 15)
            worker.wait(30)
            drop(client, f"{key}:*")
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--members", type=int, default=10_000, help="members of the chord whose calls are timed")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script runs")
    args = parser.parse_args()
    if args.quick:
        args.members, args.rounds = 500, 1
    client = connect(args.redis_url)
    print(f"Redis {client.info('server')['redis_version']} at {args.redis_url}; python {sys.version.split()[0]}")
    per_end(client, 1024 if not args.quick else 256, args.rounds)
    longest_calls(client, args.members)
    ours = callback_latency(client, args.rounds)
    print(f"Last member's end to the callback's start, chord of 1,000 (median of {args.rounds}): "
          f"echomq {statistics.median(ours):.1f} ms (range {min(ours):.0f}-{max(ours):.0f})")
    theirs = celery_latency(args.redis_url, args.rounds)
    if theirs:
        print(f"  celery (threads, Redis result backend) {statistics.median(theirs):.1f} ms "
              f"(range {min(theirs):.0f}-{max(theirs):.0f})")


if __name__ == "__main__":
    main()
