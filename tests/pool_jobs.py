"""Job handlers for tests/system/test_pool.py, at module level so the processes pool's children can import them.

A handler that records what it does is given, in its job's data, the Redis
URL (`url`) and the key (`key`) of a list the test owns (each child process
keeps one client per URL), or a file (`file`) to append lines to, for a test
in which Redis goes away. The entries are "<job id>:<pid>" for a start and
"<job id>:<pid>:done" for a finish, so a test can count the runs of each job
and tell which process ran them. With `tag` in the data, each handler call
adds a tag of its own to both entries: an RPUSH that redis-py sent again after
losing its reply (a Redis restart) then shows as two equal entries, while two
runs of one job never do.
"""

import functools
import os
import resource
import time
import uuid
from typing import Any

from echomq_django.core import Job, SoftTimeLimitExceeded, connect

_clients: dict[str, Any] = {}
_hoard: list[bytearray] = []  # what `grow` keeps, for the life of the child process


def _client(url: str) -> Any:
    if url not in _clients:
        _clients[url] = connect(url)
    return _clients[url]


def _record(job: Job, suffix: str = "") -> None:
    data = job.data or {}
    entry = f"{job.id}:{os.getpid()}{suffix}"
    if "key" in data:
        _client(data["url"]).rpush(data["key"], entry)
    if "file" in data:  # one short O_APPEND write: whole lines, whatever the other children write
        with open(data["file"], "a") as records:
            records.write(entry + "\n")


def _sleep(job: Job, seconds: float, *, check: bool) -> None:
    """Sleep; with `check`, in short steps calling job.check() (how a thread can be stopped)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if check:
            job.check()
        time.sleep(min(left, 0.02))


def noop(job: Job) -> dict:
    """Record the run, return the pid."""
    _record(job)
    return {"pid": os.getpid()}


def sleep(job: Job) -> dict:
    """Report the pid as progress, then sleep data["seconds"] (data["check"]: checking as it goes).

    With data["first_only"], only the first attempt sleeps.
    """
    data = job.data
    _record(job)
    job.update_progress({"pid": os.getpid()})
    if not (data.get("first_only") and job.attempts_made > 0):
        try:
            _sleep(job, data["seconds"], check=data.get("check", False))
        except Exception as error:  # what stopped it (a check's LockLostError, JobCancelled...)
            _record(job, f":{type(error).__name__}")
            raise
    _record(job, ":done")
    return {"pid": os.getpid()}


def soft(job: Job) -> str:
    """Sleep until the soft time limit interrupts, then clean up: log it and return normally."""
    _record(job)
    try:
        _sleep(job, job.data["seconds"], check=job.data.get("check", False))
    except SoftTimeLimitExceeded as error:
        job.log(f"cleaning up after: {error}")
        return "cleaned up"
    return "never interrupted"


def resident_kb() -> int:
    """This process's resident size now, in KB (VmRSS, Linux)."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def grow(job: Job) -> dict:
    """Keep data["mb"] more MB (touched, so resident) for the child's life; report its size.

    `rss_kb` is the process's own resident size; `max_rss_kb` is ru_maxrss, which
    on Linux also counts the process it was forked from (see test_pool.py).
    """
    _hoard.append(bytearray(b"\x01") * (job.data["mb"] * 1024 * 1024))
    _record(job)
    return {"pid": os.getpid(), "rss_kb": resident_kb(),
            "max_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def storm(job: Job) -> dict:
    """A short job that records its pid (in the set data["pids"]), its start and its finish.

    With data["tag"], the start and the finish carry this call's own tag.
    """
    tag = f":{uuid.uuid4().hex[:12]}" if job.data.get("tag") else ""
    if "pids" in job.data:
        _client(job.data["url"]).sadd(job.data["pids"], os.getpid())
    _record(job, tag)
    time.sleep(job.data.get("ms", 0) / 1000)
    _record(job, f"{tag}:done")
    return {"pid": os.getpid()}


def die(job: Job) -> dict:
    """On its first attempt, end the child process at once with exit code data["code"]."""
    _record(job)
    if job.attempts_made == 0:
        os._exit(job.data["code"])
    return {"pid": os.getpid()}


def report_when_told(job: Job) -> str:
    """Wait for the file data["go"], then report (data["report"]: "progress" or "log"), recording either side."""
    _record(job)
    while not os.path.exists(job.data["go"]):
        time.sleep(0.01)
    _record(job, ":reporting")
    if job.data["report"] == "progress":
        job.update_progress(1)
    else:
        job.log("a line")
    _record(job, ":reported")
    return "reported"


def durable(job: Job) -> Any:
    """Two durable steps, each recording its run in the test's list; then a sleep and a signal wait; the first
    attempt fails after the steps, so the second replays them."""
    from echomq_django.core import durable as steps

    data = job.data
    record = functools.partial(_client(data["url"]).rpush, data["key"])
    first = steps.run_step(job, "first", lambda: record(f"{job.id}:first") and os.getpid(), (), {})
    second = steps.run_step(job, "second", lambda: record(f"{job.id}:second") and [first], (), {})
    if job.attempts_made == 0:
        raise RuntimeError("after the steps")
    steps.sleep_until(job, "nap", steps.now_ms() + 100)
    payload = steps.wait_signal(job, "go", None)
    return {"first": first, "second": second, "payload": payload}


HANDLERS = {"noop": noop, "durable": durable, "sleep": sleep, "soft": soft, "grow": grow, "storm": storm, "die": die,
            "report_when_told": report_when_told}


def by_name(job: Job) -> Any:
    """The handler a worker is given: runs the function of this module named like the job."""
    return HANDLERS[job.name](job)


def fail_to_start(url: str, key: str) -> None:
    """A child_init that records the child's pid and raises (use with functools.partial)."""
    _client(url).rpush(key, str(os.getpid()))
    raise RuntimeError("child_init failed on purpose")


def start_once(url: str, key: str) -> None:
    """A child_init that lets only the first child of a test start (use with functools.partial)."""
    if _client(url).incr(key) > 1:
        raise RuntimeError("only one child may start")
