"""Chaos: Redis killed and restarted under load, replies lost on the wire, long outages, a wake-up cut short.

Every test runs real processes against a real redis-server of its own; the
network faults come from tests/fault_proxy.py. Sizes fit CI; for a soak:

    ECHOMQ_SOAK_RESTARTS=16  Redis SIGKILLs and restarts under load (CI: 4)
    ECHOMQ_SOAK_ADDS=5000    adds through a proxy that loses 3% of replies (CI: 400)
"""

import hashlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from demo_project.demo_app.jobs import greet
from echomq_django.core import Job, JobOptions, NewJob, Queue, Sweeper, Worker, WorkerOptions, connect
from echomq_django.core.protocol.lua import script_names, script_source
from tests.fault_proxy import FaultProxy
from tests.helpers import fetch, running, wait_until
from tests.redis_servers import RedisServer
from tests.system.test_faults import Fleet, events, started_per_job, starts

ROOT = Path(__file__).resolve().parents[2]
# Ten times a CI run's longest (25 s), scaled for soak runs.
SOAK = max(1, int(os.environ.get("ECHOMQ_SOAK_RESTARTS", 4)) // 4, int(os.environ.get("ECHOMQ_SOAK_ADDS", 400)) // 400)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300 * SOAK)]


def attempt_counters(queue: Queue, ids: list[str]) -> dict[str, tuple[str, str, str]]:
    """(ats, atm, stc) of each job: attempts started, attempts made, stalls."""
    pipe = queue.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hmget(queue.keys.job(job_id), "ats", "atm", "stc")
    return {job_id: tuple(values) for job_id, values in zip(ids, pipe.execute())}


def stories(queue: Queue, started: Counter, counters: dict[str, tuple[str, str, str]]) -> str:
    """For a failure message: the events and tagged starts of a few jobs started twice or counted wrong."""
    odd = sorted({job_id for job_id, n in started.items() if n > 1}
                 | {job_id for job_id, c in counters.items() if c != ("1", "1", "0")})[:5]
    told = {job_id: sorted((ms, name) for name in ("active", "recovered", "retried", "failed", "completed")
                           for ms, event_job in events(queue, name) if event_job == job_id) for job_id in odd}
    return f"events (ms): {told}; starts: {[entry for entry in starts(queue) if entry.split(':')[0] in told]}"


def settled(queue: Queue, jobs: int) -> bool:
    """At least `jobs` jobs finished, and none is waiting or running (jobs added twice included)."""
    counts = queue.counts()
    return (counts["completed"] + counts["failed"] >= jobs
            and not any(counts[state] for state in ("wait", "active", "delayed", "prioritized", "paused")))


def blocked_clients(client) -> int:
    return int(client.info("clients")["blocked_clients"])


def running_after(queue: Queue, completed: int) -> Callable[[], bool]:
    """A predicate: at least `completed` jobs are completed, and some are running."""
    def check() -> bool:
        counts = queue.counts()
        return counts["completed"] >= completed and counts["active"] > 0
    return check


def test_the_fault_proxy_loses_replies_hangs_cuts_and_refuses():
    server = RedisServer()
    server.start()
    proxy = FaultProxy(server.port).start()
    client = connect(proxy.url, retry=None, retry_on_error=[], socket_timeout=0.5)
    direct = connect(server.url)
    try:
        assert client.incr("n") == 1
        proxy.drop_replies(1)
        with pytest.raises(redis.ConnectionError):
            client.incr("n")
        assert direct.get("n") == "2", "Redis ran the command whose reply was lost"
        proxy.drop_replies(0)
        proxy.freeze()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        proxy.thaw()
        assert client.ping()
        # The timed-out connection was closed by the client, but its pump only sees that
        # once it forwards the held PING and reads again: wait for it, then one is left.
        assert wait_until(lambda: proxy.open_connections == 1, timeout_s=5), proxy.open_connections
        assert proxy.cut() == 1
        proxy.down()
        with pytest.raises(redis.ConnectionError):
            client.ping()
        proxy.up()
        assert client.ping()
        assert (proxy.replies_dropped, proxy.connections_refused) == (1, 1)
    finally:
        proxy.stop()
        server.stop()
        server.workdir.cleanup()


def test_redis_restarts_never_run_a_job_twice():
    restarts = int(os.environ.get("ECHOMQ_SOAK_RESTARTS", 4))
    lock_ms = 2000
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    server.start()
    queue = Queue("q", connect(server.url), prefix="chaos")
    opts = JobOptions(attempts=20)

    def add_jobs(n: int) -> list[str]:
        return queue.add_bulk([NewJob("sleep", {"seconds": random.uniform(0.3, 0.8)}, opts) for _ in range(n)])

    ids: list[str] = []
    outages: list[float] = []
    windows: list[tuple[int, int]] = []  # (ms) Redis killed, Redis answering again
    try:
        with Fleet(queue, server.url, lock_ms, interval_ms=1000, max_stalled_count=20, sweepers=2) as fleet:
            for _ in range(3):
                fleet.spawn(4, "--tag-starts")
            for _ in range(restarts):
                ids += add_jobs(30)
                # Kill it mid-run: jobs finished since the last restart, others still running.
                assert wait_until(running_after(queue, queue.counts()["completed"] + 6), 30), queue.counts()
                down_at = time.time()
                server.stop()  # SIGKILL
                outages.append(random.uniform(2.5, 4.5))
                time.sleep(outages[-1])  # the fault: Redis stays down this long
                server.start()  # same port and directory: the AOF is replayed
                windows.append((int(down_at * 1000), int(time.time() * 1000)))
            ids += add_jobs(12)
            assert wait_until(lambda: queue.counts()["completed"] >= len(ids), 60), queue.counts()
            died = [worker.pid for worker in fleet.workers if worker.poll() is not None]
        counts = queue.counts()
        completed = set(queue.client.zrange(queue.keys.completed, 0, -1))
        started = started_per_job(queue)
        counters = attempt_counters(queue, ids)
        odd = stories(queue, started, counters)
    finally:
        server.stop()
        server.workdir.cleanup()
    run_twice = sorted(job_id for job_id, n in started.items() if n > 1)
    miscounted = {job_id: c for job_id, c in counters.items() if c != ("1", "1", "0")}
    lost = sorted(set(ids) - completed)
    print(f"\nRedis SIGKILL + restart x{restarts} (down {min(outages):.1f}-{max(outages):.1f} s): {len(ids)} jobs, "
          f"{len(run_twice)} started twice, {len(miscounted)} with ats/atm/stc != 1/1/0, {len(lost)} lost, "
          f"{counts['failed']} failed; max outage {max(outages):.1f} s")
    assert died == [], "worker processes died"
    what_happened = f"outages (ms, by the clock of the events): {windows}; {odd}"
    assert run_twice == [], f"jobs started twice across Redis restarts: {run_twice[:10]}; {what_happened}"
    assert miscounted == {}, f"(ats, atm, stc) != (1, 1, 0): {dict(list(miscounted.items())[:10])}; {what_happened}"
    assert lost == [] and set(started) == set(ids), f"jobs lost: {lost[:10]}"
    assert counts["completed"] == len(ids) and counts["failed"] == 0, counts


def test_lost_replies_never_add_a_job_twice_nor_waste_an_attempt():
    """3% of replies vanish after Redis ran the command: adds, fetches, finishes, renewals, wake-ups alike."""
    adds = int(os.environ.get("ECHOMQ_SOAK_ADDS", 400))
    # Every reply can be lost here, those of a reconnect's handshake (HELLO, CLIENT) too, so a fetch
    # may take a few of the client's backoff rounds (0.1 + 0.2 + 0.4 + 0.5 s) before it lands: the
    # lock must outlast that, as the default of 30 s does by far. With 1 s, about one run in 25
    # recovered a job whose fetch was still being re-sent.
    lock_ms = 3000
    server = RedisServer()
    server.start()
    # Lost replies counted by the script they answered (a fetch shares its pipeline with finishes).
    names = sorted(script_names(), key=lambda name: not name.startswith("moveToActive"))
    labels = {hashlib.sha1(script_source(name).encode()).hexdigest(): name.split("-")[0] for name in names}
    proxy = FaultProxy(server.port, labels=labels).start()
    queue = Queue("q", connect(server.url), prefix="lost")
    producer = Queue("q", connect(proxy.url), prefix="lost")
    ids: list[str] = []
    try:
        proxy.drop_replies(0.03)
        # The sweeper goes straight to Redis: a job orphaned by a lost reply is recovered (and counted).
        with Fleet(queue, server.url, lock_ms, interval_ms=300, max_stalled_count=10,
                   worker_url=proxy.url) as fleet:
            for _ in range(2):
                fleet.spawn(4, "--tag-starts")
            for n in range(adds):  # one call at a time: each one's reply can be the lost one
                ids.append(producer.add("jitter", {"ms": 10, "n": n}, opts=JobOptions(attempts=10)))
            assert wait_until(lambda: settled(queue, len(set(ids))), 30 + adds / 50), queue.counts()
        proxy.drop_replies(0)
        counts = queue.counts()
        job_hashes = [key for key in queue.client.scan_iter(match=queue.keys.base + "*", count=1000)
                      if re.fullmatch(rf"{re.escape(queue.name)}\.\d+", key.removeprefix(queue.keys.base))]
        generated = int(queue.client.get(queue.keys.id_counter))
        completed = set(queue.client.zrange(queue.keys.completed, 0, -1))
        completions = Counter(job_id for _, job_id in events(queue, "completed"))
        started = started_per_job(queue)
        counters = attempt_counters(queue, ids)
        odd = stories(queue, started, counters)
    finally:
        proxy.stop()
        server.stop()
        server.workdir.cleanup()
    wasted = {job_id: c for job_id, c in counters.items() if c != ("1", "1", "0")}
    print(f"\nlost replies: {adds} adds, {len(job_hashes)} job hashes, {generated} ids generated, "
          f"{len(wasted)} jobs with ats/atm/stc != 1/1/0, {sum(n > 1 for n in started.values())} started twice; "
          f"{proxy.summary()}")
    assert proxy.dropped_by_request["addJob"] and proxy.dropped_by_request["moveToActive"], \
        "no add or fetch reply was lost: the run tested nothing"
    problems = []
    if not (len(set(ids)) == len(job_hashes) == generated == adds):
        problems.append(f"adds twice: {adds} adds returned {len(set(ids))} distinct ids, but {generated} ids were "
                        f"generated and {len(job_hashes)} job hashes exist")
    if wasted:
        problems.append(f"attempts wasted by lost replies, (ats, atm, stc) of {len(wasted)} jobs: "
                        f"{dict(list(wasted.items())[:8])}")
    if any(n != 1 for n in started.values()) or set(started) != set(ids):
        problems.append(f"not started exactly once: {[j for j in ids if started[j] != 1][:10]}")
    if completed != set(ids) or set(completions.values()) != {1} or counts["failed"]:
        problems.append(f"not completed exactly once: {counts}, completed events {Counter(completions.values())}")
    assert problems == [], "\n".join([*problems, odd])


class ManagePy:
    """A `manage.py` command in a child process; its output lines are collected as they come."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.process = subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                        for stream, lines in ((self.process.stdout, self.out), (self.process.stderr, self.err))]
        for reader in self.readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def said(self, text: str, since: int = 0) -> bool:
        return any(text in line for line in self.out[since:])

    def stopped(self) -> bool:
        """Whether every thread of the process is stopped (SIGSTOP has taken effect)."""
        tasks = Path(f"/proc/{self.process.pid}/task")
        return all(Path(task, "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for task in tasks.iterdir())

    def end(self) -> int:
        """SIGTERM (after SIGCONT, were it stopped); returns the exit code (killed after 15 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        for reader in self.readers:
            reader.join(5)
        return self.process.returncode


def test_worker_and_sweeper_commands_survive_a_long_outage(subprocess_env, prefix):
    outage_s = 20  # longer than the client's own retries (about 17 s): the loops themselves must ride it out
    server = RedisServer()  # no persistence: Redis comes back empty
    server.start()
    env = {**subprocess_env, "ECHOMQ_REDIS_URL": server.url}
    client = connect(server.url)
    queue = Queue("demo", client, prefix=prefix)  # demo: 3 s locks

    def pickup_ms() -> int:
        """Enqueue a job to an idle worker; ms from the enqueue to its start."""
        assert wait_until(lambda: blocked_clients(client) == 1, 5), "the worker is not waiting on the marker"
        job_id = queue.add(greet.name, {"args": ["x"], "kwargs": {}})
        assert wait_until(lambda: queue.get_state(job_id) == "completed", 5)
        job = queue.get_job(job_id)
        return job.processed_on - job.timestamp

    worker = ManagePy(env, "echomq_worker", "--queue", "demo")
    sweeper = ManagePy(env, "echomq_sweep", "--queue", "demo", "--interval", "0.5")
    try:
        assert wait_until(lambda: worker.said("worker on demo") and sweeper.said("queue demo: marked"), 30), \
            (worker.out, worker.err, sweeper.out, sweeper.err)
        before = pickup_ms()
        server.stop()
        time.sleep(outage_s)  # the fault: Redis stays down this long
        server.start()
        sweeps_before = len(sweeper.out)
        assert worker.process.poll() is None, f"echomq_worker exited in the outage: {worker.err[-10:]}"
        assert sweeper.process.poll() is None, f"echomq_sweep exited in the outage: {sweeper.err[-10:]}"
        # The marker thread is alive: each job starts at once, not at the loop's next poll (up to 2 s).
        after = [pickup_ms() for _ in range(5)]
        assert max(after) < 500, f"pickup latencies after the outage {after} ms (before it: {before} ms)"

        # A job whose worker died: taken by a worker that never renews its lock. The real worker is
        # stopped meanwhile. Its wait for work, sent before it stopped, may take the job itself (Redis runs
        # it when the job comes); else the test's "worker" takes it, with a 0.5 s lock.
        worker.process.send_signal(signal.SIGSTOP)
        assert wait_until(worker.stopped, 5)
        orphan = queue.add(greet.name, {"args": ["orphan"], "kwargs": {}})
        if queue.get_state(orphan) == "wait":
            assert [job_id for job_id, _ in fetch(queue, token="dead-worker", lock_ms=500)] == [orphan]
        # Recovered while the worker is still stopped: a worker that took it must not start it when it wakes.
        assert wait_until(lambda: queue.get_state(orphan) == "wait", 15)
        worker.process.send_signal(signal.SIGCONT)
        assert wait_until(lambda: queue.get_state(orphan) == "completed", 10), queue.get_state(orphan)
        assert queue.get_job(orphan).stall_count == 1, "the sweeper recovered it, and the worker ran it"
        assert sweeper.said("recovered 1 to wait", since=sweeps_before)
    finally:
        worker_exit, sweeper_exit = worker.end(), sweeper.end()
        server.stop()
        server.workdir.cleanup()
    assert (worker_exit, sweeper_exit) == (0, 0), (worker.err[-20:], sweeper.err[-20:])
    print(f"\n{outage_s} s outage: both commands lived; pickup {before} ms before it, {after} ms after; "
          f"the orphan was recovered")


def test_the_marker_thread_survives_losing_redis_right_after_a_wake_up():
    """A stop() while a job runs makes the marker thread hand its wake-up back; Redis is gone just then."""
    server = RedisServer()
    server.start()
    proxy = FaultProxy(server.port).start()
    direct = connect(server.url)
    died: list[threading.ExceptHookArgs] = []
    pytest_hook = threading.excepthook  # pytest's: an unhandled thread exception fails the test too

    def record(args: threading.ExceptHookArgs) -> None:
        died.append(args)
        pytest_hook(args)

    threading.excepthook = record
    release = threading.Event()
    # No retries: an error reaches the worker's own code at once. The marker thread waits while a job
    # runs and a slot is free (an idle worker's loop waits itself).
    worker = Worker("q", lambda job: release.wait(10) if job.name == "long" else None,
                    connect(proxy.url, retry=None, retry_on_error=[]),
                    WorkerOptions(prefix="marker", concurrency=2, block_timeout_s=2))
    existing = set(threading.enumerate())
    running = threading.Thread(target=worker.run, name="worker-run", daemon=True)
    queue = Queue("q", direct, prefix="marker")
    try:
        running.start()
        queue.add("long")
        # Blocked on the marker in a BZPOPMIN that began just now, so it has most of its 2 s left.
        assert wait_until(lambda: queue.counts()["active"] == 1 and blocked_clients(direct) == 1
                          and time.monotonic() - proxy.last_bzpopmin_at < 0.5, 10)
        threads = [t for t in threading.enumerate() if t not in existing and t.name.startswith("echomq-")]
        worker.stop()
        proxy.down_after_bzpopmin_reply()
        job_id = queue.add("work")  # wakes the BZPOPMIN; then the proxy goes down
        assert wait_until(lambda: proxy.downs_after_bzpopmin == 1, 5), "the wake-up never came through the proxy"
        release.set()  # the long job ends; its result waits for Redis
        proxy.up()
        running.join(10)
        for thread in threads:
            thread.join(5)
        still_running = [t.name for t in [running, *threads] if t.is_alive()]
        assert queue.get_state(job_id) == "wait", "a stopping worker takes no job"
    finally:
        threading.excepthook = pytest_hook
        if running.is_alive():
            worker.stop()
            worker.stop()
        proxy.stop()
        server.stop()
        server.workdir.cleanup()
    assert still_running == [], f"worker threads still running: {still_running}"
    assert [f"{args.thread.name}: {args.exc_type.__name__}: {args.exc_value}" for args in died] == [], \
        "a worker thread died of an exception"
    assert {t.name for t in threads} >= {"echomq-marker", "echomq-renew", "echomq-job-0"}


class BehindProxy:
    """A Redis of its own behind a fault proxy; a worker and a sweeper reach it only through the proxy.

    A proxy that is down is an outage as both see it: their calls fail, and the
    sweep's clock (meta `sweptAt`) stands still, so its hold opens when they are
    back. Handlers are counted per job id.
    """

    def __init__(self, lock_ms: int, handler: Callable[[Job], object] = lambda job: None) -> None:
        self.lock_ms = lock_ms
        self.server = RedisServer()
        self.server.start()
        labels = {hashlib.sha1(script_source(name).encode()).hexdigest(): name.split("-")[0]
                  for name in script_names() if name.startswith("moveToActive")}
        self.proxy = FaultProxy(self.server.port, labels=labels).start()
        self.queue = Queue("q", connect(self.server.url), prefix="outage")
        self.calls: Counter[str] = Counter()

        def counted(job: Job) -> object:
            self.calls[job.id] += 1
            return handler(job)

        # No retries in the client: the worker's own loop meets the outage at once.
        self.worker = Worker("q", counted, connect(self.proxy.url, retry=None, retry_on_error=[]),
                             WorkerOptions(prefix="outage", lock_duration_ms=lock_ms, block_timeout_s=0.2))
        self.sweeper = Sweeper(connect(self.proxy.url), ["q"], prefix="outage", interval_ms=200,
                               lock_duration_ms=lock_ms, max_stalled_count=5)

    def outage_past_the_lock(self, job_id: str, down_at: float) -> None:
        """Keep the proxy down until the job's lock has lapsed and a whole lock duration has passed."""
        assert wait_until(lambda: not self.queue.client.exists(self.queue.keys.lock(job_id))
                          and time.monotonic() - down_at > 1.5 * self.lock_ms / 1000, 10), "the lock never lapsed"
        self.proxy.up()

    def close(self) -> None:
        self.sweeper.stop()
        self.proxy.stop()
        self.server.stop()
        self.server.workdir.cleanup()


def test_a_result_held_through_an_outage_longer_than_the_lock_is_written_not_run_again():
    """The job ends just as Redis goes out of reach, and stays so past its lock: its owner is alive."""
    down_at: list[float] = []

    def end_into_an_outage(job: Job) -> None:
        if not down_at:  # the first run only
            rig.proxy.down()
            down_at.append(time.monotonic())

    rig = BehindProxy(lock_ms=1000, handler=end_into_an_outage)
    sweeping = threading.Thread(target=rig.sweeper.run, args=(lambda report: None,), daemon=True)
    try:
        sweeping.start()
        # Sweeps before the outage: without a clock of sweeps to see a gap in, no hold opens.
        assert wait_until(lambda: rig.queue.client.hexists(rig.queue.keys.meta, "sweptAt"), 10)
        with running(rig.worker):
            job_id = rig.queue.add("work", opts=JobOptions(attempts=3))
            assert wait_until(lambda: down_at, 10), "the job never ran"
            rig.outage_past_the_lock(job_id, down_at[0])
            assert wait_until(lambda: rig.queue.get_state(job_id) == "completed", 10), rig.queue.counts()
            # Long enough for the hold to end and two sweeps to mark and recover a job left behind.
            assert wait_until(lambda: rig.queue.client.hget(rig.queue.keys.meta, "sweptAt")
                              and rig.queue.client.hget(rig.queue.keys.meta, "sweepHoldUntil")
                              and int(rig.queue.client.hget(rig.queue.keys.meta, "sweptAt"))
                              > int(rig.queue.client.hget(rig.queue.keys.meta, "sweepHoldUntil")) + 500, 10)
        attempts = rig.queue.client.hmget(rig.queue.keys.job(job_id), "ats", "atm", "stc")
    finally:
        rig.close()
        sweeping.join(10)
    assert rig.calls[job_id] == 1, "the job ran again: its result was dropped during the outage"
    assert attempts == ["1", "1", "0"], f"(ats, atm, stc): {attempts}"


def test_a_fetch_whose_reply_an_outage_longer_than_the_lock_swallowed_is_collected():
    """Redis took the job for the worker, the reply was lost, and Redis stayed out of reach past the lock."""
    rig = BehindProxy(lock_ms=1000)
    try:
        with running(rig.worker):
            assert wait_until(lambda: blocked_clients(rig.queue.client) == 1, 10), "the worker never went idle"
            rig.proxy.down_instead_of_reply("moveToActive")
            job_id = rig.queue.add("work", opts=JobOptions(attempts=3))
            assert wait_until(lambda: rig.proxy.replies_dropped == 1, 10), "the fetch's reply was never lost"
            down_at = time.monotonic()
            assert rig.queue.get_state(job_id) == "active", "Redis ran the fetch"
            rig.outage_past_the_lock(job_id, down_at)
            assert wait_until(lambda: rig.queue.get_state(job_id) == "completed", 10), rig.queue.counts()
        attempts = rig.queue.client.hmget(rig.queue.keys.job(job_id), "ats", "atm", "stc")
        record = rig.queue.client.keys(rig.queue.keys.fetch_record("*"))
    finally:
        rig.close()
    assert rig.calls[job_id] == 1
    assert attempts == ["1", "1", "0"], f"the re-sent fetch did not collect the job: (ats, atm, stc) {attempts}"
    assert record == [], "the finish ends the fetch's record"


def test_a_burst_worker_collects_a_fetch_whose_reply_was_lost_before_it_leaves():
    """Burst mode ends when nothing is ready, but not while the reply of a fetch that took a job is owed."""
    rig = BehindProxy(lock_ms=1000)
    processed: list[int] = []
    burst = threading.Thread(target=lambda: processed.append(rig.worker.run(burst=True)), daemon=True)
    try:
        job_id = rig.queue.add("work")
        rig.proxy.down_instead_of_reply("moveToActive")
        burst.start()
        assert wait_until(lambda: rig.proxy.replies_dropped == 1, 10), "the fetch's reply was never lost"
        assert not wait_until(lambda: not burst.is_alive(), 1), "the burst worker left with the job owed to it"
        rig.proxy.up()
        burst.join(10)
        attempts = rig.queue.client.hmget(rig.queue.keys.job(job_id), "ats", "atm", "stc")
    finally:
        rig.worker.stop()
        rig.worker.stop()
        rig.close()
    assert processed == [1] and rig.calls[job_id] == 1
    assert attempts == ["1", "1", "0"]


@pytest.mark.parametrize("fault", ["down", "freeze"])
def test_a_second_sigterm_leaves_at_once_through_an_outage(subprocess_env, prefix, fault):
    """A worker holding a result and a sweeper mid-call, Redis refusing or not answering: two SIGTERMs, out."""
    server = RedisServer()
    server.start()
    proxy = FaultProxy(server.port).start()
    env = {**subprocess_env, "ECHOMQ_REDIS_URL": proxy.url}
    queue = Queue("demo", connect(server.url), prefix=prefix)
    worker = ManagePy(env, "echomq_worker", "--queue", "demo")
    sweeper = ManagePy(env, "echomq_sweep", "--queue", "demo", "--interval", "0.5")
    try:
        assert wait_until(lambda: worker.said("worker on demo") and sweeper.said("queue demo: marked"), 30), \
            (worker.out, worker.err, sweeper.out, sweeper.err)
        job_id = queue.add(greet.name, {"args": ["x"], "kwargs": {}})
        assert wait_until(lambda: queue.get_state(job_id) == "completed", 10)
        running = queue.add("demo_project.demo_app.jobs.slow", {"args": [1], "kwargs": {}})
        assert wait_until(lambda: queue.get_state(running) == "active", 10)
        getattr(proxy, fault)()  # the job ends into the outage: its result is held
        time.sleep(1.5)  # the fault lasts; the job (1 s) ends meanwhile
        for command in (worker, sweeper):
            command.process.send_signal(signal.SIGTERM)
        # Two SIGTERMs sent at once can arrive as one: the second goes once the first is taken.
        assert wait_until(lambda: all(any("stopping" in line for line in command.out + command.err)
                                      for command in (worker, sweeper)), 10), (worker.err, sweeper.err)
        for command in (worker, sweeper):
            command.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        exits = [command.process.wait(30) for command in (worker, sweeper)]
        took = time.monotonic() - signalled
    finally:
        proxy.thaw()
        proxy.up()
        worker.end()
        sweeper.end()
        proxy.stop()
        server.stop()
        server.workdir.cleanup()
    assert exits == [0, 0], (worker.err[-10:], sweeper.err[-10:])
    assert took < 20, f"the commands left {took:.1f} s after the second SIGTERM (grace: 2 s)"
