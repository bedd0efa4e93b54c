"""Handlers for tests/system/test_hostile_pool.py, at module level so the processes pool's children can import them.

A handler that records what it does gets, in its job's data, the Redis URL
(`url`) and the key (`key`) of a list the test owns; each entry is
"<what>:<job id>:<attempts made>:<pid>", so a test counts the runs of each job
and tells which process ran them.

Run as a program, this module is a worker of its own (the core Worker, no
Django), for tests that kill, stop or signal it:

    python -m tests.hostile_pool_jobs URL PREFIX QUEUE HANDLER [--pool P] [--concurrency N] [--lock-ms MS]
                                      [--time-limit-ms MS] [--child-init NAME]

It prints "ready" as it starts its children, and stops on SIGTERM or SIGINT
(the first lets running jobs finish, the second returns at once).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import ctypes
import os
import signal
import sys
import threading
import time
from typing import Any

from echomq_django.core import (
    Job,
    Retention,
    SoftTimeLimitExceeded,
    TimeLimitExceeded,
    Worker,
    WorkerOptions,
    connect,
    run_until_signalled,
)

_clients: dict[str, Any] = {}


def _client(url: str) -> Any:
    if url not in _clients:
        _clients[url] = connect(url)
    return _clients[url]


def record(job: Job, what: str) -> None:
    data = job.data or {}
    if "key" in data:
        _client(data["url"]).rpush(data["key"], f"{what}:{job.id}:{job.attempts_made}:{os.getpid()}")


def _wait_for_go(job: Job) -> None:
    """Block until the test pushes to data["go"] (BLPOP, so no polling; at most data["seconds"])."""
    data = job.data
    _client(data["url"]).blpop([data["go"]], timeout=data.get("seconds", 30))


# -- plain jobs ---------------------------------------------------------------

def sleeper(job: Job) -> dict:
    """Record the start, sleep data["seconds"] in short steps (data["check"]: calling job.check()), record the end.

    With data["first_only"], only the first attempt sleeps.
    """
    record(job, "start")
    seconds = 0 if job.data.get("first_only") and job.attempts_made > 0 else job.data["seconds"]
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if job.data.get("check"):
            job.check()
        time.sleep(min(left, 0.02))
    record(job, "end")
    return {"pid": os.getpid()}


def noop(job: Job) -> dict:
    record(job, "start")
    return {"pid": os.getpid()}


def gated(job: Job) -> dict:
    """Record the start, wait for the test's go (data["go"]), record the end."""
    record(job, "start")
    _wait_for_go(job)
    record(job, "end")
    return {"pid": os.getpid()}


# -- a soft limit and threads in the child ------------------------------------

def _background() -> None:
    while True:  # a library's background thread (Sentry's transport, an OpenTelemetry exporter...)
        time.sleep(3600)


def chatty_soft(job: Job) -> int:
    """In a child that has a background thread, log until the soft time limit, clean up and return.

    Many libraries start such a thread at import or setup; the thread only has
    to exist. The job catches SoftTimeLimitExceeded, as docs/execution.md shows.
    """
    if not any(thread.name == "hostile-background" for thread in threading.enumerate()):
        threading.Thread(target=_background, name="hostile-background", daemon=True).start()
    record(job, "start")
    lines = 0
    try:
        while True:
            job.log(f"line {lines}")
            lines += 1
    except SoftTimeLimitExceeded:
        pass
    record(job, "end")
    return lines


async def _async_work(job: Job) -> str:
    record(job, "start")
    try:
        for _ in range(int(job.data["seconds"] * 50)):
            await asyncio.sleep(0.02)
    except SoftTimeLimitExceeded:
        record(job, "soft")
        return "cleaned up"
    record(job, "end")
    return "ran to the end"


def async_soft(job: Job) -> str:
    """An async job, run as Django's Task.call runs an async task (asgiref's async_to_sync)."""
    from asgiref.sync import async_to_sync

    return async_to_sync(_async_work)(job)


# -- deaths and odd exits in the child -----------------------------------------

def segfault(job: Job) -> None:
    record(job, "start")
    ctypes.string_at(0)


def exits(job: Job) -> None:
    """Raise data["raise"]: SystemExit, KeyboardInterrupt or BaseException, or os._exit."""
    record(job, "start")
    kind = job.data["raise"]
    if kind == "os._exit":
        os._exit(7)
    raise {"SystemExit": SystemExit(3), "KeyboardInterrupt": KeyboardInterrupt(),
           "BaseException": BaseException("base")}[kind]


def ignores_usr1(job: Job) -> str:
    """Ignore SIGUSR1 (the soft limit's signal) and sleep: only the hard limit can stop it."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    record(job, "start")
    time.sleep(job.data["seconds"])
    record(job, "end")
    return "slept"


def big_return(job: Job) -> list:
    record(job, "start")
    return ["x" * 1000] * job.data["n"]


def not_json(job: Job) -> object:
    return {1, 2}


def many_logs(job: Job) -> int:
    for line in range(job.data["lines"]):
        job.log(f"line {line}")
    return job.data["lines"]


# -- the threads pool: a job that never checks --------------------------------

def never_checks(job: Job) -> str:
    """Record, wait for the test's go (never calling job.check), then try to report progress and log.

    The first report raises TimeLimitExceeded when the worker gave up on the
    attempt (a check); the job swallows it and tries again, as careless code
    would (and is stopped there, the error being raised at every check), and
    records what the two writes answered.
    """
    record(job, "start")
    _wait_for_go(job)
    try:
        job.update_progress({"late": True})
        record(job, "not-interrupted")
    except TimeLimitExceeded:
        record(job, "interrupted")
    written = [job.update_progress({"late": True}), job.log("late line")]
    record(job, f"late-writes-{written[0]}-{written[1]}")
    return "late result"


def counted(job: Job) -> str:
    """Count itself in data["running"] while it runs, recording the count it joined ("start-N"); with
    data["go"], wait for the test's go first (never calling job.check)."""
    client = _client(job.data["url"])
    record(job, f"start-{client.incr(job.data['running'])}")
    try:
        if "go" in job.data:
            _wait_for_go(job)
    finally:
        client.decr(job.data["running"])
    record(job, "end")
    return "done"


def leaves_a_thread(job: Job) -> str:
    """Start a non-daemon thread that outlives the job (a library's flusher, a fire-and-forget upload) and return."""
    threading.Thread(target=_wait_for_go, args=(job,), name="hostile-leftover").start()
    record(job, "start")
    return "returned at once"


def careless_loop(job: Job) -> int:
    """Wait for the test's go (past the hard limit), then work through items, each starting with a check.

    The loop catches Exception per item, as much real code does, so a check
    that raises skips only its item; the items done are recorded.
    """
    record(job, "start")
    _wait_for_go(job)
    done = 0
    for item in range(job.data["items"]):
        try:
            job.check()
        except Exception:
            continue
        record(job, f"item{item}")
        done += 1
    return done


# -- child set-up (child_init), told what to do by the environment it inherits -----

def slow_child_init() -> None:
    """A child set-up that takes a while (a project's imports, django.setup()): it reports, then waits for go."""
    client = connect(os.environ["HOSTILE_URL"])
    key = os.environ["HOSTILE_INIT_KEY"]
    client.rpush(key, f"init:{os.getpid()}")
    client.blpop([key + ":go"], timeout=30)


def breakable_child_init() -> None:
    """A child set-up that fails once the test set HOSTILE_INIT_KEY ("broken"), as a deploy's bad import would."""
    if connect(os.environ["HOSTILE_URL"]).get(os.environ["HOSTILE_INIT_KEY"]) == "broken":
        raise ImportError("the project cannot be imported (a bad deploy)")


def exit_reporting_child_init() -> None:
    """Record "atexit:<pid>" when the child leaves the way Python leaves (atexit: a Sentry flush, coverage)."""
    url, key = os.environ["HOSTILE_URL"], os.environ["HOSTILE_INIT_KEY"]
    atexit.register(lambda: connect(url).rpush(key, f"atexit:{os.getpid()}"))


def _gate_child_bootstrap() -> None:
    """In a spawned child (HOSTILE_IMPORT_GATE set), report and wait for go while this module is imported.

    The module is imported during the child's bootstrap when it is the
    worker's main module (python -m tests.hostile_pool_jobs): a slow import
    there (a heavy main module, a loaded machine) stretches the time before the
    child's own code runs. Once per process.
    """
    gate, worker = os.environ.get("HOSTILE_IMPORT_GATE"), os.environ.get("HOSTILE_WORKER_PID")
    if not gate or not worker or os.getpid() == int(worker) or os.environ.get("HOSTILE_GATED"):
        return  # not a child of the worker (main() names the worker), or gated already
    os.environ["HOSTILE_GATED"] = "1"
    client = connect(os.environ["HOSTILE_URL"])
    client.rpush(gate, f"importing:{os.getpid()}")
    client.blpop([gate + ":go"], timeout=30)


_gate_child_bootstrap()


def by_name(job: Job) -> Any:
    """One worker for many kinds of job: the handler is named by the job."""
    return {"segfault": segfault, "os._exit": exits, "SystemExit": exits, "KeyboardInterrupt": exits,
            "BaseException": exits, "not-JSON": not_json, "1ms": sleeper, "ignores-SIGUSR1": ignores_usr1,
            "big": big_return, "logs": many_logs, "noop": noop}[job.name](job)


HANDLERS = {name: globals()[name] for name in (
    "sleeper", "noop", "gated", "chatty_soft", "async_soft", "segfault", "exits", "ignores_usr1",
    "big_return", "not_json", "many_logs", "never_checks", "careless_loop",
    "leaves_a_thread", "counted")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("queue")
    parser.add_argument("handler", choices=sorted(HANDLERS))
    parser.add_argument("--pool", default="processes")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--lock-ms", type=int, default=2000)
    parser.add_argument("--time-limit-ms", type=int, default=0)
    parser.add_argument("--child-init", default="")
    args = parser.parse_args()
    os.environ["HOSTILE_WORKER_PID"] = str(os.getpid())  # its children inherit it (_gate_child_bootstrap)
    from tests import hostile_pool_jobs as jobs  # pickled by this name, not as __main__'s

    child_init = getattr(jobs, args.child_init) if args.child_init else None
    worker = Worker(args.queue, jobs.HANDLERS[args.handler], connect(args.url),
                    WorkerOptions(prefix=args.prefix, pool=args.pool, concurrency=args.concurrency,
                                  lock_duration_ms=args.lock_ms, block_timeout_s=0.2, keep_completed=Retention(),
                                  time_limit_ms=args.time_limit_ms, child_init=child_init))
    print("ready", flush=True)
    run_until_signalled(worker)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
