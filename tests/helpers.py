"""Small helpers shared by the tests."""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from echomq_django.core import Queue, Worker
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.scripts import Finish


def wait_until(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.02) -> bool:
    """Poll `predicate` until it is truthy or `timeout_s` passes; returns whether it became true."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
    return True


def abandoned_await_ends(awaitable: Callable[[], object]) -> None:
    """Give up `awaitable()` (a handle's async wait that cannot end by itself) with asyncio.wait_for, and check
    that asyncio.run returns: the wait's thread must stop too, or the run waits for it at its end."""
    import asyncio

    outcome = []

    async def main():
        try:
            await asyncio.wait_for(awaitable(), 0.3)
        except TimeoutError:
            outcome.append("timed out")

    runner = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    runner.start()
    assert wait_until(lambda: outcome == ["timed out"], 10)
    assert wait_until(lambda: not runner.is_alive(), 10), "asyncio.run hangs on the abandoned wait's thread"


def redis_now_ms(queue: Queue) -> int:
    """Redis's clock, ms: the clock lock keys, pauses and dedupe windows run on."""
    seconds, micros = queue.client.time()
    return seconds * 1000 + micros // 1000


def commands_run(client) -> dict[str, int]:
    """How many times the server has run each command to a reply so far (INFO commandstats, less the failed calls,
    such as a NOSCRIPT before redis-py loads a script; a script's own commands count): on a server of the test's
    own, the exact count of what a piece of work asked, which no slow machine changes."""
    return {name.removeprefix("cmdstat_"): stats["calls"] - stats.get("failed_calls", 0)
            for name, stats in client.info("commandstats").items()}


def script_calls(client) -> int:
    """Script calls the server has run to a reply so far (EVAL, EVALSHA and FCALL: see commands_run)."""
    ran = commands_run(client)
    return sum(ran.get(name, 0) for name in ("eval", "evalsha", "fcall"))


def fetch(queue: Queue, token: str = "token-1", lock_ms: int = 30_000, count: int = 1):
    """Take jobs as a worker would, returning [(id, Job-hash dict)]."""
    _due, jobs = take_jobs(queue, token, lock_ms, now_ms(), count, "test-worker")
    return [(job_id, dict(zip(flat[::2], flat[1::2]))) for job_id, flat in jobs]


def kill_lock(queue: Queue, job_id: str) -> None:
    """Make a job look abandoned: its worker died and the lock lapsed.

    As if its lock duration had passed: the lock key goes, and the job's time
    in the lock index moves to the past.
    """
    queue.client.delete(queue.keys.lock(job_id))
    queue.client.zadd(queue.keys.locks, {job_id: 0}, xx=True)


def sweep(queue: Queue, *, force: bool = True, max_stalled_count: int = 1, budget: int = 1000,
          interval_ms: int = 30_000, default_attempts: int = 3):
    """One whole sweep of `queue` (forced by default, so tests need not wait out the gate)."""
    from echomq_django.core import Sweeper

    sweeper = Sweeper(queue.client, [queue.name], prefix=queue.keys.prefix, interval_ms=interval_ms,
                      max_stalled_count=max_stalled_count, budget=budget,
                      default_attempts=default_attempts, scripts=queue.scripts)
    return sweeper.sweep(sweeper.targets[0], force=force)


def finish(queue: Queue, job_id: str, token: str, *, completed: bool = True, value: str = "null",
           backoff_ms: int = 0, **retention):
    return finish_attempt(
        queue, job_id, token, now_ms(), completed=completed, value=value,
        default_attempts=3, backoff_ms=backoff_ms, **retention)


def blocked_connections(client, name: str, key: str) -> int:
    """How many connections named `name` Redis holds blocked in a command (a worker's BZPOPMIN on `key`).

    Give the worker a client of its own name (`connect(url, client_name=...)`):
    other clients blocked on the same Redis (other tests, other processes)
    then do not count. On a cluster the node that owns `key` is asked.
    """
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        client = client.get_redis_connection(client.get_node_from_key(key))
    return sum(1 for entry in client.client_list() if entry["name"] == name and "b" in entry["flags"])


# One script call at a time, as the worker's batches send them.

def take_jobs(queue: Queue, token: str, lock_ms: int, now: int, count: int, worker_id: str):
    """One moveToActive call: (next delayed due time, [(id, flat job hash)])."""
    [reply] = queue.scripts.run_batch(
        [queue.scripts.fetch_call(queue.keys, token, lock_ms, now, count, worker_id)], raise_on_error=True)
    next_due, _wait, jobs = queue.scripts.fetched(reply)
    return next_due, jobs


def finish_attempt(queue: Queue, job_id: str, token: str, now: int, *, completed: bool, value: str,
                   stacktrace: str = "", default_attempts: int, backoff_ms: int = 0, keep_count: int = -1,
                   keep_age_ms: int = 0, keep_traces: int = 10, final: bool = False, error_class: str = "",
                   postponed: bool = False, parked: bool = False) -> int:
    """One moveToFinished call ending one attempt: its status code, or its error raised."""
    retention = (keep_count, keep_age_ms)
    call = queue.scripts.finish_call(
        queue.keys, [Finish(job_id, token, completed, value, stacktrace, backoff_ms, final, error_class,
                            postponed=postponed, parked=parked)], now,
        default_attempts=default_attempts, keep_completed=retention, keep_failed=retention, keep_traces=keep_traces)
    [[code]] = queue.scripts.run_batch([call], raise_on_error=True)
    return queue.scripts.finished(code, queue.keys, job_id)


def renew_lock(queue: Queue, job_id: str, token: str, lock_ms: int) -> bool:
    """One extendLocks call for one lock: whether `token` owns the job and renewed its lock."""
    return queue.scripts.lock_codes(queue.keys, [(job_id, token)], lock_ms) == [1]


class Running:
    """A worker's run() on a thread; `error` is what run() raised, if anything."""

    def __init__(self, worker: Worker) -> None:
        self.worker: Worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def start(self) -> "Running":
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as error:  # reported by the test, not lost on the thread
            self.error = error

    def stop(self, timeout_s: float = 10) -> None:
        """Stop as a first SIGTERM does; a second stop if it has not returned in time."""
        self.worker.stop()
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            self.worker.stop()
            self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the worker did not return"


@contextmanager
def running(worker: Worker, stop_timeout_s: float = 10) -> Iterator[Running]:
    """The worker running on a thread for the block; stopped after it, and it must not have raised."""
    run = Running(worker).start()
    try:
        yield run
    finally:
        run.stop(stop_timeout_s)
    assert run.error is None, f"worker.run() raised {run.error!r}"


def fail_jobs(queue: Queue, count: int, *, reason: str = "boom", error_class: str = "", name: str = "work",
              now: int = 1_700_000_000_000, batch: int = 500) -> list[str]:
    """`count` jobs of one attempt each, failed for good through the real scripts, `batch` per call: add, fetch, fail.

    The queue must have no other job ready (the fetch would take it).
    """
    from echomq_django.core import JobOptions, NewJob

    ids: list[str] = []
    for start in range(0, count, batch):
        size = min(batch, count - start)
        added = queue.add_bulk([NewJob(name, {"n": start + n}, JobOptions(attempts=1)) for n in range(size)])
        _due, taken = take_jobs(queue, "fail-jobs", 30_000, now_ms(), size, "test-worker")
        assert sorted(job_id for job_id, _ in taken) == sorted(added)
        attempts = [Finish(job_id, "fail-jobs", False, reason, error_class=error_class) for job_id in added]
        call = queue.scripts.finish_call(queue.keys, attempts, now + start, default_attempts=1)
        queue.scripts.run_batch([call], raise_on_error=True)
        ids += added
    return ids
