"""What one enqueue costs and where the time goes: `@job`'s enqueue beside a direct `Queue.add`, in the same run.

    python bench/enqueue_cost.py [--calls 1000] [--runs 5] [--redis-url URL]

Times `--calls` calls of `greet.enqueue(...)` (a demo @job function: settings,
the runtime objects, then the add) and as many direct `Queue.add` calls on one
Queue built once, best of `--runs` each (the runs alternate), and prints both
and their ratio, in wall time and in this process's CPU time (steadier on a
busy machine). Then the breakdown of one `Queue.add`, each piece timed alone
the same way: the client's work before sending (checking and encoding the job,
building the script call), one round trip of the same call to a script that
only returns (the transport: packing, the socket, reading the reply), and
the addJob script's own time in Redis (INFO commandstats, over the adds
above), beside redis-py's ping() (one round trip through redis-py, the floor
of any Python client). The keys go under a prefix of their own, deleted at
the end.
"""

import argparse
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def best_times(functions: list[Callable[[], object]], calls: int, runs: int) -> list[tuple[float, float]]:
    """For each function, the best of `runs` (wall ms, this process's CPU ms) of `calls` calls of it.

    The runs alternate between the functions, so a busy moment of the machine
    costs them alike; the CPU time leaves out waiting (for Redis, for a core).
    """
    times: list[list[tuple[float, float]]] = [[] for _ in functions]
    for _ in range(runs):
        for function, taken in zip(functions, times):
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                function()
            taken.append(((time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000))
    return [(min(wall for wall, _ in taken), min(cpu for _, cpu in taken)) for taken in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    os.environ.update({"DJANGO_SETTINGS_MODULE": "demo_project.settings", "ECHOMQ_REDIS_URL": args.redis_url,
                       "ECHOMQ_PREFIX": prefix})
    import django

    django.setup()
    from demo_project.demo_app.jobs import greet
    from echomq_django.core import NewJob
    from echomq_django.core.producing.queue import now_ms
    from echomq_django.core.protocol.own_connections import OwnConnections
    from echomq_django.queues import get_queue

    queue = get_queue(greet.queue)  # built once: the direct adds pay for nothing else
    data = {"args": ["Ada"], "kwargs": {}}
    scripts, client = queue.scripts, queue.client
    returns = client.script_load("return 1")

    def prepare() -> tuple:
        return scripts.add_jobs_call(queue.keys, now_ms(), [queue.encode(NewJob(greet.name, data))])

    # The way the queue's calls go (its own connections unless ECHOMQ_OWN_CONNECTIONS=0).
    own = OwnConnections(client) if scripts.own_connections else None

    def transport() -> None:  # the same keys and arguments, to a script that does nothing
        _name, keys, argv = prepare_once
        if own is not None:
            own.send([("EVALSHA", returns, len(keys), *keys, *argv)])
        else:
            client.evalsha(returns, len(keys), *keys, *argv)

    prepare_once = prepare()
    try:
        greet.enqueue("Ada")  # the first call loads the scripts into Redis; neither side pays for that
        client.config_resetstat()
        (enqueue_ms, enqueue_cpu), (add_ms, add_cpu) = best_times(
            [lambda: greet.enqueue("Ada"), lambda: queue.add(greet.name, data)], args.calls, args.runs)
        stats = client.info("commandstats")["cmdstat_evalsha"]
        script_us = stats["usec"] / stats["calls"]
        timed = best_times([prepare, transport, client.ping], args.calls, args.runs)
        (prepare_ms, prepare_cpu), (transport_ms, transport_cpu), (ping_ms, ping_cpu) = timed
        per_call = 1000 / args.calls  # ms of `calls` calls -> µs of one
        print(f"{args.calls:,} calls, best of {args.runs}, Redis {client.info()['redis_version']}, "
              f"{'own connections' if own else 'the pool (ECHOMQ_OWN_CONNECTIONS=0)'}")
        print(f"{'':<14}{'wall ms':>10}{'CPU ms':>10}")
        print(f"{'@job .enqueue':<14}{enqueue_ms:>10.1f}{enqueue_cpu:>10.1f}")
        print(f"{'Queue.add':<14}{add_ms:>10.1f}{add_cpu:>10.1f}")
        print(f"{'ratio':<14}{enqueue_ms / add_ms:>10.2f}{enqueue_cpu / add_cpu:>10.2f}")
        print("\none Queue.add, µs per call")
        print(f"{'':<52}{'wall':>8}{'CPU':>8}")
        for label, wall, cpu in (
                ("the client's work before sending (job, script call)", prepare_ms, prepare_cpu),
                ("one round trip of that call to `return 1`", transport_ms, transport_cpu),
                ("Queue.add, all of it", add_ms, add_cpu),
                ("redis-py ping() (the floor)", ping_ms, ping_cpu)):
            print(f"{label:<52}{wall * per_call:>8.1f}{cpu * per_call:>8.1f}")
        print(f"{'the scripts in Redis, mean of the adds (commandstats)':<52}{script_us:>8.1f}")
    finally:
        queue.obliterate()


if __name__ == "__main__":
    main()
