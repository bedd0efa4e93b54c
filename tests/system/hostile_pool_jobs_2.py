"""Handlers for tests/system/test_hostile_pool_2.py, at module level so the processes pool's children can import them.

They record as tests/hostile_pool_jobs.py's do ("<what>:<job id>:<attempts made>:<pid>" in the list data["key"]
of the Redis at data["url"]), with its `record`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from typing import Any

from echomq_django.core import Job
from tests.hostile_pool_jobs import _client, _wait_for_go, gated, noop, record, sleeper


def threaded_logs(job: Job) -> int:
    """Log data["lines"] lines from each of data["threads"] threads of the job (a job fanning out its work)."""
    failures: list[str] = []

    def work(n: int) -> None:
        try:
            for line in range(job.data["lines"]):
                job.log(f"thread {n} line {line}")
        except BaseException as error:  # what a thread's report raised: the job fails with it below
            failures.append(f"{type(error).__name__}: {error}")

    record(job, "start")
    threads = [threading.Thread(target=work, args=(n,)) for n in range(job.data["threads"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    if failures or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"reports failed: {failures[:3]} (threads still blocked: "
                           f"{sum(thread.is_alive() for thread in threads)})")
    record(job, "end")
    return job.data["threads"] * job.data["lines"]


def late_logger(job: Job) -> str:
    """Return at once, leaving a thread that logs one line once the test says go (a flusher, a callback)."""
    def later() -> None:
        _wait_for_go(job)
        try:
            answer: Any = job.log("a late line of a finished job")
        except BaseException as error:
            answer = type(error).__name__
        record(job, f"late-{answer}")

    threading.Thread(target=later, name="hostile-late-logger", daemon=True).start()
    record(job, "start")
    return "returned"


def surrogate_log(job: Job) -> str:
    """Log a file name as os.listdir decodes a non-UTF-8 one (a lone surrogate), then wait for the test's go."""
    record(job, "start")
    try:
        job.log("processing caf\udce9.txt")
    except Exception as error:  # the job's own failure: it does not go on
        record(job, f"log-raised-{type(error).__name__}")
        raise
    record(job, "after-log")
    _wait_for_go(job)
    record(job, "end")
    return "done"


def stops_a_helper(job: Job) -> str:
    """Start a helper process, then stop it as a job does when it is done with it: SIGTERM, and wait.

    Records "helper-stopped" or "helper-ignored-SIGTERM" (then kills it).
    """
    record(job, "start")
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    _client(job.data["url"]).rpush(job.data["key"], f"helper:{job.id}:{helper.pid}")
    helper.terminate()
    try:
        code = helper.wait(5)
    except subprocess.TimeoutExpired:
        helper.kill()
        helper.wait()
        record(job, "helper-ignored-SIGTERM")
        return "helper ignored SIGTERM"
    record(job, "helper-stopped")
    return f"helper exited {code} ({signal.Signals(-code).name if code < 0 else code})"


def by_name(job: Job) -> Any:
    return {"threaded_logs": threaded_logs, "late_logger": late_logger, "surrogate_log": surrogate_log,
            "stops_a_helper": stops_a_helper, "noop": noop, "sleeper": sleeper, "gated": gated}[job.name](job)
