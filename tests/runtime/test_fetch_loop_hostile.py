"""Hostile tests of the fetch loop's `_drained` state: a fetch that left no job ready makes the
worker send no fetch until a signal comes (its results go alone when nothing else runs).

The danger is a lost wake-up: a job ready (or due) that no worker takes until its block timeout. Each
worker here waits up to BLOCK_S (30 s) on the marker, on a client whose socket timeout is longer (so the
wait is not cut to the default socket timeout's 9 s), and every job must start within DEADLINE_S.
Real workers, real Redis, no mocks.
"""

import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack

import pytest

from echomq_django.core import (
    Backoff,
    Chain,
    Job,
    JobOptions,
    Member,
    NewJob,
    RateLimit,
    RateLimited,
    Worker,
    WorkerOptions,
    connect,
)
from tests.helpers import blocked_connections, fetch, kill_lock, running, sweep, wait_until

BLOCK_S = 30  # a lost wake-up shows as a job that waits this long
DEADLINE_S = 15  # half of BLOCK_S, and far over any honest latency (milliseconds), even on a slow machine


@pytest.fixture
def named_client(redis_url, prefix):
    """named_client(label) -> (client, name): a client with a socket timeout above BLOCK_S, whose
    connections Redis lists under a name of this test's (to see a worker blocked on the marker)."""
    clients = []

    def make(label: str):
        name = f"{prefix}-{label}"
        clients.append(connect(redis_url, client_name=name, socket_timeout=BLOCK_S + 30))
        return clients[-1], name

    yield make
    for client in clients:
        client.close()


class Runs:
    """A thread handler that counts each job's starts, fails an attempt when the job asks (data["fail"]:
    the number of attempts to fail), and blocks an attempt on an Event when the test asks (`hold`)."""

    def __init__(self) -> None:
        self.starts: Counter[str] = Counter()
        self.done: set[str] = set()
        self.gates: dict[str, threading.Event] = {}
        self.running: set[str] = set()
        self.lock = threading.Lock()

    def hold(self, job_id: str) -> threading.Event:
        with self.lock:
            return self.gates.setdefault(job_id, threading.Event())

    def __call__(self, job):
        with self.lock:
            self.starts[job.id] += 1
            self.running.add(job.id)
            gate = self.gates.get(job.id)
        try:
            if gate is not None:
                assert gate.wait(BLOCK_S + 10), "the test never let the job end"
            data = job.data or {}
            if data.get("limited") and self.starts[job.id] == 1:
                raise RateLimited(data["limited"])
            if job.attempts_made < data.get("fail", 0):
                raise RuntimeError(f"attempt {job.attempts_made + 1} fails")
            with self.lock:
                self.done.add(job.id)
            return job.attempts_made
        finally:
            with self.lock:
                self.running.discard(job.id)


def make_worker(queue, client, handler, **options) -> Worker:
    options.setdefault("block_timeout_s", BLOCK_S)
    return Worker(queue.name, handler, client, WorkerOptions(prefix=queue.keys.prefix, **options))


def idle(queue, name: str, count: int = 1) -> bool:
    """Wait until `count` connections named `name` block on the queue's marker (the worker(s) went idle)."""
    return wait_until(lambda: blocked_connections(queue.client, name, queue.keys.marker) >= count, DEADLINE_S)


def completed_within(queue, job_id: str, timeout_s: float = DEADLINE_S) -> bool:
    return wait_until(lambda: queue.get_state(job_id) == "completed", timeout_s)


# -- a delayed job the worker knew of, before its results went alone ----------------------------------


@pytest.mark.parametrize("concurrency", [1, 8])
def test_a_delayed_job_becomes_due_after_a_job_ended_alone(queue, named_client, concurrency):
    """The worker learns a delayed job's due time from a fetch (the marker its add set), then takes and runs
    another job; that job's result is written alone (nothing ready, nothing else runs). The delayed job
    must still start when due, not a block timeout later: nothing sets the marker when a job becomes due."""
    client, name = named_client("w")
    runs = Runs()
    with running(make_worker(queue, client, runs, concurrency=concurrency)):
        assert idle(queue, name)
        delayed = queue.add("later", opts=JobOptions(delay_ms=1000))
        # The worker's wait took the add's marker and its fetch read the due time; it waits again.
        assert wait_until(lambda: not queue.client.exists(queue.keys.marker), DEADLINE_S)
        assert idle(queue, name)
        now = queue.add("now")
        assert completed_within(queue, now)
        assert completed_within(queue, delayed, 1 + DEADLINE_S), (
            f"the delayed job (due 1 s after it was added) is {queue.get_state(delayed)}: the result written "
            "alone forgot the due time, and the worker waits its block timeout on the marker")
    assert runs.starts[delayed] == 1 and runs.starts[now] == 1


def test_a_retry_due_after_its_backoff_starts_though_the_last_job_running_ended_alone(queue, named_client):
    """A job fails with a backoff while another job of the worker runs: that result goes with a fetch, which
    reads the retry's due time. Then the other job ends, and its result goes alone (nothing ready, nothing
    else runs). The retry must start when its backoff ends."""
    client, name = named_client("w")
    runs = Runs()
    with running(make_worker(queue, client, runs, concurrency=2)):
        assert idle(queue, name)
        held = "held-" + uuid.uuid4().hex[:8]
        gate = runs.hold(held)
        queue.add("held", job_id=held)
        assert wait_until(lambda: held in runs.running, DEADLINE_S)
        retried = queue.add("retried", {"fail": 1}, opts=JobOptions(attempts=2, backoff=Backoff("fixed", 1000)))
        assert wait_until(lambda: queue.get_state(retried) == "delayed", DEADLINE_S)
        time.sleep(0.2)  # the worker's wake-ups on the retry's marker are over: it waits for the due time
        gate.set()
        assert completed_within(queue, held)
        assert completed_within(queue, retried, 1 + DEADLINE_S), (
            f"the retry (due 1 s after its failure) is {queue.get_state(retried)}: the last result, written "
            "alone, forgot the due time, and the worker waits its block timeout on the marker")
    assert runs.starts[retried] == 2 and runs.starts[held] == 1


@pytest.mark.parametrize("busy", [False, True])
def test_a_delayed_job_starts_when_due(queue, named_client, busy):
    """Due while the worker is idle (its own wait is cut to the due time), or while another job of the
    worker runs (the marker waiter's wait is)."""
    client, name = named_client("w")
    runs = Runs()
    with running(make_worker(queue, client, runs, concurrency=4)):
        assert idle(queue, name)
        gate = None
        if busy:
            held = "held-" + uuid.uuid4().hex[:8]
            gate = runs.hold(held)
            queue.add("held", job_id=held)
            assert wait_until(lambda: held in runs.running, DEADLINE_S)
        try:
            delayed = queue.add("later", opts=JobOptions(delay_ms=500))
            assert completed_within(queue, delayed, 0.5 + DEADLINE_S), queue.get_state(delayed)
        finally:
            if gate is not None:
                gate.set()
    assert runs.starts[delayed] == 1


# -- adds racing finishes ------------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency,workers", [(1, 1), (8, 1), (1, 3), (8, 3)])
def test_a_job_added_as_others_end_starts_promptly(queue, named_client, concurrency, workers):
    """Round after round, the running jobs are let end and a new one is added at once (a little later, or a
    little sooner): a job added while a worker writes a result alone must still start, on some worker."""
    runs = Runs()
    clients = [named_client(f"w{n}") for n in range(workers)]
    jitters = [0, 0, 0.0002, 0.0005, 0.001, 0.002, 0.004, -0.001]  # s from the jobs' end to the add (< 0: before)
    held_per_round = min(concurrency * workers, 3)
    with ExitStack() as stack:
        for client, _name in clients:
            stack.enter_context(running(make_worker(queue, client, runs, concurrency=concurrency)))
        for _client, name in clients:
            assert idle(queue, name)
        for round_ in range(24):
            held = [f"h{round_}-{n}" for n in range(held_per_round)]
            gates = [runs.hold(job_id) for job_id in held]
            queue.add_bulk([NewJob("held", job_id=job_id) for job_id in held])
            assert wait_until(lambda held=held: set(held) <= runs.running, DEADLINE_S), (
                f"round {round_}: the held jobs did not all start: {set(held) - runs.running}")
            jitter, added = jitters[round_ % len(jitters)], f"n{round_}"
            adder = threading.Thread(target=lambda jitter=jitter, added=added: (
                time.sleep(max(jitter, 0)), queue.add("next", job_id=added)))
            if jitter < 0:
                adder.start()
                adder.join()
            for gate in gates:
                gate.set()
            if jitter >= 0:
                adder.start()
                adder.join()
            assert wait_until(lambda added=added: added in runs.done, DEADLINE_S), (
                f"round {round_} (jitter {jitter} s): the job added as the others ended is "
                f"{queue.get_state(added)}, not run within {DEADLINE_S} s")
            assert wait_until(lambda held=held: set(held) <= runs.done, DEADLINE_S)
    assert all(count == 1 for count in runs.starts.values()), runs.starts


# -- retries, burst and not ----------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_retry_with_no_backoff_starts_at_once_on_an_idle_worker(queue, named_client, concurrency):
    client, name = named_client("w")
    runs = Runs()
    with running(make_worker(queue, client, runs, concurrency=concurrency)):
        for n in range(5):
            assert idle(queue, name)
            job_id = queue.add("flaky", {"fail": 2}, opts=JobOptions(attempts=3))
            assert completed_within(queue, job_id), (
                f"job {n}: {queue.get_state(job_id)} after {runs.starts[job_id]} start(s)")
            assert runs.starts[job_id] == 3


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_retry_with_a_short_backoff_starts_when_due_on_an_idle_worker(queue, named_client, concurrency):
    client, name = named_client("w")
    runs = Runs()
    with running(make_worker(queue, client, runs, concurrency=concurrency)):
        assert idle(queue, name)
        job_id = queue.add("flaky", {"fail": 2}, opts=JobOptions(attempts=3, backoff=Backoff("fixed", 150)))
        assert completed_within(queue, job_id), f"{queue.get_state(job_id)} after {runs.starts[job_id]} start(s)"
        assert runs.starts[job_id] == 3


@pytest.mark.parametrize("concurrency", [1, 4])
def test_burst_does_not_end_while_a_retried_job_is_ready(queue, named_client, concurrency):
    """Jobs that fail twice each, retried at once (no backoff): burst must run them to completion."""
    client, _name = named_client("w")
    runs = Runs()
    ids = queue.add_bulk([NewJob("flaky", {"fail": 2}, JobOptions(attempts=3)) for _ in range(3)])
    worker = make_worker(queue, client, runs, concurrency=concurrency)
    returned: list[int] = []
    thread = threading.Thread(target=lambda: returned.append(worker.run(burst=True)), daemon=True)
    thread.start()
    thread.join(DEADLINE_S)
    if thread.is_alive():
        worker.stop()
        thread.join(10)
        pytest.fail("burst did not return in time")
    assert [queue.get_state(job_id) for job_id in ids] == ["completed"] * 3, runs.starts
    assert returned == [9] and all(runs.starts[job_id] == 3 for job_id in ids)


# -- a stalled job recovered by a sweep ----------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_job_recovered_by_a_sweep_starts_again_on_the_worker_that_lost_it(queue, named_client, concurrency):
    """The worker runs a job whose lock lapses; a sweep puts it back in wait (and sets the marker); the lost
    attempt then ends (its result, refused, goes alone): the job must start again at once."""
    client, name = named_client("w")
    runs = Runs()
    with running(make_worker(queue, client, runs, concurrency=concurrency)):
        assert idle(queue, name)
        job_id = "stalls-" + uuid.uuid4().hex[:8]
        gate = runs.hold(job_id)
        queue.add("stalls", job_id=job_id)
        assert wait_until(lambda: job_id in runs.running, DEADLINE_S)
        kill_lock(queue, job_id)
        sweep(queue)
        assert sweep(queue).recovered == 1
        if concurrency > 1:  # a free slot: it starts again while the lost attempt still runs
            assert wait_until(lambda: runs.starts[job_id] == 2, DEADLINE_S), (
                f"the recovered job is {queue.get_state(job_id)}")
        gate.set()
        assert wait_until(lambda: runs.starts[job_id] == 2, DEADLINE_S), (
            f"the recovered job is {queue.get_state(job_id)}, not started again")
        assert completed_within(queue, job_id)
    assert runs.starts[job_id] == 2


def test_a_job_recovered_by_a_sweep_starts_on_an_idle_worker(queue, named_client):
    client, name = named_client("w")
    runs = Runs()
    job_id = queue.add("stalls")
    [(taken, _)] = fetch(queue)  # a worker that died with it
    assert taken == job_id
    with running(make_worker(queue, client, runs)):
        assert idle(queue, name)
        kill_lock(queue, job_id)
        sweep(queue)
        assert sweep(queue).recovered == 1
        assert completed_within(queue, job_id)
    assert runs.starts[job_id] == 1


# -- pause and resume -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "group", "prioritized"])
def test_jobs_added_while_paused_start_on_resume(queue, named_client, kind):
    client, name = named_client("w")
    runs = Runs()
    opts = {"plain": JobOptions(), "group": JobOptions(group="g1"), "prioritized": JobOptions(priority=5)}[kind]
    with running(make_worker(queue, client, runs, concurrency=2)):
        assert idle(queue, name)
        held = "held-" + uuid.uuid4().hex[:8]
        gate = runs.hold(held)
        queue.add("held", job_id=held)
        assert wait_until(lambda: held in runs.running, DEADLINE_S)
        queue.pause()
        ids = queue.add_bulk([NewJob("paused", {"n": n}, opts) for n in range(3)])
        gate.set()  # its result goes alone: nothing it may take
        assert completed_within(queue, held)
        assert idle(queue, name)
        time.sleep(0.1)
        assert runs.starts.keys() == {held}, "a job started while the queue was paused"
        queue.resume()
        for job_id in ids:
            assert completed_within(queue, job_id), f"{job_id} is {queue.get_state(job_id)} after the resume"


# -- flow control: a fetch takes fewer than asked, jobs left ready --------------------------------------------


@pytest.mark.parametrize("concurrency,workers", [(4, 1), (1, 2), (3, 2)])
def test_rate_limited_jobs_all_start(queue, named_client, concurrency, workers):
    """2 starts per 300 ms: 8 jobs take 4 windows; every fetch but the last takes fewer than it asked."""
    runs = Runs()
    clients = [named_client(f"w{n}") for n in range(workers)]
    with ExitStack() as stack:
        for client, _name in clients:
            stack.enter_context(running(make_worker(queue, client, runs, concurrency=concurrency,
                                                    rate_limit=RateLimit(2, 300))))
        for _client, name in clients:
            assert idle(queue, name)
        ids = queue.add_bulk([NewJob("limited", {"n": n}) for n in range(8)])
        for job_id in ids:
            assert completed_within(queue, job_id, 1.2 + DEADLINE_S), (
                f"{job_id} is {queue.get_state(job_id)}: {queue.counts()}")
    assert all(runs.starts[job_id] == 1 for job_id in ids)


@pytest.mark.parametrize("concurrency,workers", [(4, 1), (2, 2)])
def test_jobs_held_back_by_max_active_all_start(queue, named_client, concurrency, workers):
    runs = Runs()
    clients = [named_client(f"w{n}") for n in range(workers)]
    with ExitStack() as stack:
        for client, _name in clients:
            stack.enter_context(running(make_worker(queue, client, runs, concurrency=concurrency,
                                                    max_active=2)))
        for _client, name in clients:
            assert idle(queue, name)
        held = [f"held-{n}" for n in range(2)]
        gates = [runs.hold(job_id) for job_id in held]
        queue.add_bulk([NewJob("held", job_id=job_id) for job_id in held])
        ids = queue.add_bulk([NewJob("capped", {"n": n}) for n in range(4)])
        assert wait_until(lambda: set(held) <= runs.running, DEADLINE_S)
        time.sleep(0.3)
        assert not runs.done, "a job started past max_active"
        for gate in gates:
            gate.set()
        for job_id in ids:
            assert completed_within(queue, job_id), f"{job_id} is {queue.get_state(job_id)}: {queue.counts()}"


@pytest.mark.parametrize("concurrency,workers", [(1, 1), (4, 1), (1, 2), (2, 2)])
def test_a_capped_groups_next_job_starts_when_its_running_one_ends(queue, named_client, concurrency, workers):
    """GROUP_MAX_ACTIVE 1: the group's second job is not ready while the first runs (a fetch takes fewer than
    it asks); the first's end must let it start at once, on whichever worker."""
    runs = Runs()
    clients = [named_client(f"w{n}") for n in range(workers)]
    with ExitStack() as stack:
        for client, _name in clients:
            stack.enter_context(running(make_worker(queue, client, runs, concurrency=concurrency,
                                                    group_max_active=1)))
        for _client, name in clients:
            assert idle(queue, name)
        for round_ in range(4):
            first, second = f"g{round_}-a", f"g{round_}-b"
            gate = runs.hold(first)
            queue.add_bulk([NewJob("grouped", job_id=job_id, opts=JobOptions(group="tenant"))
                            for job_id in (first, second)])
            assert wait_until(lambda first=first: first in runs.running, DEADLINE_S)
            time.sleep(0.05)
            assert second not in runs.starts, "the group ran past its cap"
            gate.set()
            assert completed_within(queue, second), (
                f"round {round_}: the group's next job is {queue.get_state(second)} after its first ended")
            assert runs.starts[second] == 1


# -- priorities, workflows, max_jobs -------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 4])
def test_prioritized_jobs_start_on_an_idle_worker_and_as_others_end(queue, named_client, concurrency):
    client, name = named_client("w")
    runs = Runs()
    with running(make_worker(queue, client, runs, concurrency=concurrency)):
        for n in range(3):
            assert idle(queue, name)
            job_id = queue.add("urgent", opts=JobOptions(priority=n + 1))
            assert completed_within(queue, job_id)
        held = "held-" + uuid.uuid4().hex[:8]
        gate = runs.hold(held)
        queue.add("held", job_id=held)
        assert wait_until(lambda: held in runs.running, DEADLINE_S)
        ids = queue.add_bulk([NewJob("pri", opts=JobOptions(priority=p)) for p in (-3, 4, 2)])
        gate.set()
        for job_id in ids:
            assert completed_within(queue, job_id)


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_chains_next_step_starts_when_the_previous_ends(queue, named_client, concurrency):
    """Each step's finish releases the next (it becomes ready as the result is written, alone)."""
    client, name = named_client("w")
    runs = Runs()
    with running(make_worker(queue, client, runs, concurrency=concurrency)):
        assert idle(queue, name)
        workflow = Chain(*(Member(queue, "step", {"n": n}, JobOptions(attempts=1)) for n in range(5))).enqueue()
        assert wait_until(lambda: workflow.status == "succeeded", DEADLINE_S), (
            f"workflow {workflow.status}, {len(runs.done)} of 5 steps ran")
    assert len(runs.starts) == 5 and all(count == 1 for count in runs.starts.values())


def test_a_worker_with_max_jobs_takes_its_last_job_and_returns(queue, named_client):
    client, name = named_client("w")
    runs = Runs()
    worker = make_worker(queue, client, runs, concurrency=2)
    returned: list[int] = []
    thread = threading.Thread(target=lambda: returned.append(worker.run(max_jobs=3)), daemon=True)
    thread.start()
    try:
        for n in range(3):
            assert idle(queue, name)
            job_id = queue.add("one", {"n": n})
            assert completed_within(queue, job_id), f"job {n} is {queue.get_state(job_id)}"
        thread.join(DEADLINE_S)
        assert not thread.is_alive() and returned == [3]
    finally:
        if thread.is_alive():
            worker.stop()
            thread.join(10)


# -- the marker left for another blocked worker ----------------------------------------------------------------


@pytest.mark.parametrize("concurrencies", [(1, 1), (2, 1), (1, 1, 1)])
def test_idle_workers_all_start_jobs_added_at_once(queue, named_client, concurrencies):
    """One add_bulk of as many jobs as the workers have slots sets the marker once: each worker's fetch takes
    all its free slots can (fewer than are ready) and must leave the marker for the next, so that every job
    runs at once (each blocks until all have started)."""
    runs = Runs()
    ids = [f"at-once-{n}" for n in range(sum(concurrencies))]
    gates = [runs.hold(job_id) for job_id in ids]
    clients = [named_client(f"w{n}") for n in range(len(concurrencies))]
    try:
        with ExitStack() as stack:
            for (client, _name), concurrency in zip(clients, concurrencies):
                stack.enter_context(running(make_worker(queue, client, runs, concurrency=concurrency)))
            for _client, name in clients:
                assert idle(queue, name)
            queue.add_bulk([NewJob("at-once", job_id=job_id) for job_id in ids])
            assert wait_until(lambda: set(ids) <= runs.running, DEADLINE_S), (
                f"running {sorted(runs.running)}, states {[queue.get_state(job_id) for job_id in ids]}")
            for gate in gates:
                gate.set()
            for job_id in ids:
                assert completed_within(queue, job_id)
    finally:
        for gate in gates:
            gate.set()
    assert all(runs.starts[job_id] == 1 for job_id in ids)


# -- a capped group's slot freed by a script other than moveToFinished -------------------------------------------


@pytest.mark.parametrize("how", ["sweep fails it", "removed"])
def test_a_capped_groups_next_job_starts_when_a_dead_workers_job_leaves_active(queue, named_client, how):
    """GROUP_MAX_ACTIVE 1; a worker that died holds the group's first job (its lock lapsed); the group's
    second job waits, not ready. The first job leaves `active` by a sweep (its last attempt: it fails) or a
    removal: the group's slot is free, its turn back in the ring, and an idle worker must take the second."""
    client, name = named_client("w")
    runs = Runs()
    first = queue.add("grouped", opts=JobOptions(group="tenant", attempts=1))
    [(taken, _)] = fetch(queue)  # a worker that died with it
    assert taken == first
    second = queue.add("grouped", opts=JobOptions(group="tenant"))
    with running(make_worker(queue, client, runs, concurrency=2, group_max_active=1)):
        assert idle(queue, name)
        time.sleep(0.1)
        assert second not in runs.starts, "the group ran past its cap"
        kill_lock(queue, first)
        if how == "removed":
            assert queue.remove(first)
        else:
            sweep(queue)
            assert sweep(queue, default_attempts=1).failed == 1
        assert completed_within(queue, second), (
            f"the group's second job is {queue.get_state(second)} though its first left `active` ({how}): "
            "its group is back in the ring, but no marker woke the idle worker")


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_job_that_raised_rate_limited_starts_again_after_the_pause(queue, named_client, concurrency):
    """The job goes back to the front with the queue's fetching paused 0.3 s (limitedUntil); its result goes
    alone on an otherwise idle worker, whose next fetch is held back: it must start once the pause ends."""
    client, name = named_client("w")
    runs = Runs()
    with running(make_worker(queue, client, runs, concurrency=concurrency)):
        assert idle(queue, name)
        job_id = queue.add("limited", {"limited": 0.3})
        assert completed_within(queue, job_id, 0.3 + DEADLINE_S), (
            f"{queue.get_state(job_id)} after {runs.starts[job_id]} start(s)")
    assert runs.starts[job_id] == 2


# -- the processes pool ------------------------------------------------------------------------------------------


def process_handler(job: Job):
    """For the processes pool (imported by each child): record the start in Redis, fail the attempts data["fail"]
    asks to, and wait for data["go"] (a list the test pushes to) when given."""
    data = job.data
    client = _process_clients.get(data["url"]) or _process_clients.setdefault(data["url"], connect(data["url"]))
    client.rpush(data["key"], f"{job.id}:{job.attempts_made}")
    if job.attempts_made < data.get("fail", 0):
        raise RuntimeError("fails")
    if "go" in data:
        client.blpop([data["go"]], timeout=BLOCK_S)
    return job.attempts_made


_process_clients: dict = {}


def test_the_processes_pool_takes_jobs_added_as_others_end_and_retries(queue, named_client, redis_url):
    """Concurrency 2 in children: a job added as the running one ends, and a retry with no backoff, both
    start at once."""
    client, name = named_client("w")
    key, go = f"{queue.keys.prefix}:test-starts", f"{queue.keys.prefix}:test-go"
    base = {"url": redis_url, "key": key}
    helds, retrieds = [], []
    with running(make_worker(queue, client, process_handler, concurrency=2, pool="processes")):
        assert idle(queue, name)
        for round_ in range(6):
            held = queue.add("held", {**base, "go": go})
            helds.append(held)
            assert wait_until(lambda held=held: f"{held}:0" in queue.client.lrange(key, 0, -1), DEADLINE_S + 5)
            queue.client.rpush(go, "1")
            retrieds.append(queue.add("flaky", {**base, "fail": 1}, opts=JobOptions(attempts=2)))
            assert completed_within(queue, held) and completed_within(queue, retrieds[-1]), (
                f"round {round_}: {queue.get_state(held)}, {queue.get_state(retrieds[-1])}")
    starts = Counter(entry.rpartition(":")[0] for entry in queue.client.lrange(key, 0, -1))
    assert starts == {**dict.fromkeys(helds, 1), **dict.fromkeys(retrieds, 2)}
