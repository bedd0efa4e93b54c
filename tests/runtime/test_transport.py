"""The two ways to a plain or Sentinel Redis behave alike: each thread's own connection (the fast path,
core/protocol/own_connections.py) and the client's pool with redis-py's public API (ECHOMQ_OWN_CONNECTIONS=0).

Each test runs on both: batches and their re-sends after a SCRIPT FLUSH, a wait and the calls behind it, a
cut that ends a wait for good, another thread's CLIENT UNBLOCK, and a worker's stop on top of them.
"""

import threading
import time

import pytest
import redis

from echomq_django.core import Queue, Scripts, Worker, WorkerOptions, connect
from echomq_django.core.protocol.scripts import Wait, pairs
from echomq_django.core.protocol.transport import OWN_CONNECTIONS_ENV, POOL_WAIT_STEP_S
from tests.helpers import blocked_connections, wait_until

PATHS = pytest.mark.parametrize("own_connections", [True, False], ids=["own-connections", "pool"])


@pytest.fixture
def named(redis_url, prefix):
    """A client whose connections Redis lists under a name of this test's, and that name."""
    name = f"{prefix}-transport"
    client = connect(redis_url, client_name=name)
    yield client, name
    client.close()


def waiting_scripts(named, own_connections: bool) -> Scripts:
    client, _name = named
    scripts = Scripts(client, own_connections=own_connections)
    if not scripts.waits_then_runs:
        pytest.skip("a cluster client waits through redis-py's own bzpopmin (the worker's marker thread)")
    return scripts


def add_call(queue: Queue, job_id: str = ""):
    """The addJob call of one job, as Queue.add sends it."""
    from echomq_django.core import NewJob

    return queue.scripts.add_jobs_call(queue.keys, 1, [queue.encode(NewJob("x", job_id=job_id or None))])


def in_thread(function) -> tuple[threading.Thread, list]:
    """Run `function` on a thread of its own; the list gets what it returned or raised."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(function())
        except Exception as error:
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@PATHS
def test_a_batch_after_a_script_flush_runs_each_call_once_in_order(redis_client, prefix, own_connections):
    scripts = Scripts(redis_client, own_connections=own_connections)
    queue = Queue("q", redis_client, prefix=prefix, scripts=scripts)
    queue.add("before")  # the scripts are loaded
    redis_client.script_flush()  # on a cluster, every node's
    replies = scripts.run_batch([add_call(queue, f"id-{n}") for n in range(3)], raise_on_error=True)
    assert [pairs(reply) for reply in replies] == [[(f"id-{n}", True)] for n in range(3)]
    assert queue.counts()["wait"] == 4
    queue.client.script_flush()
    assert queue.add("after") and queue.counts()["wait"] == 5, "a single call reloads its script too"


@PATHS
def test_a_confirmed_batch_counts_the_replicas_its_wait_reached(redis_client, prefix, own_connections):
    from echomq_django.core import Confirm

    scripts = Scripts(redis_client, own_connections=own_connections)
    queue = Queue("q", redis_client, prefix=prefix, scripts=scripts)
    call = add_call(queue)
    started = time.monotonic()
    replies, acked = scripts.run_confirmed([call], Confirm(replicas=1, timeout_ms=200))
    assert (len(replies), acked) == (1, 0), "the test Redis has no replica"
    assert time.monotonic() - started >= 0.19, "WAIT waited for the replica it asked for"
    assert queue.counts()["wait"] == 1


@PATHS
def test_a_wait_ends_on_the_marker_and_runs_its_calls(named, prefix, own_connections):
    scripts = waiting_scripts(named, own_connections)
    client, name = named
    queue = Queue("q", client, prefix=prefix, scripts=scripts)
    call = add_call(queue)
    thread, outcome = in_thread(lambda: scripts.wait_then_run(queue.keys.marker, 5, [call], None, Wait()))
    assert wait_until(lambda: blocked_connections(client, name, queue.keys.marker) == 1, 5)
    client.zadd(queue.keys.marker, {"0": 0})
    thread.join(5)
    [(woken, replies, acked)] = outcome
    assert woken == [queue.keys.marker, "0", woken[2]] and (len(replies), acked) == (1, 0)
    assert queue.counts()["wait"] == 1


@PATHS
def test_a_cut_ends_the_wait_for_good_and_its_calls_never_run(named, prefix, own_connections):
    scripts = waiting_scripts(named, own_connections)
    client, name = named
    queue = Queue("q", client, prefix=prefix, scripts=scripts)
    call = add_call(queue)
    wait = Wait()
    thread, outcome = in_thread(lambda: scripts.wait_then_run(queue.keys.marker, 30, [call], None, wait))
    assert wait_until(lambda: blocked_connections(client, name, queue.keys.marker) == 1, 5)
    cut_at = time.monotonic()
    wait.cut()
    thread.join(20)
    took_s = time.monotonic() - cut_at
    assert outcome and isinstance(outcome[0], redis.ConnectionError), outcome
    # At once on an own connection, within a step of the wait on the pool's; 5 s more for a slow machine,
    # under what an uncut wait takes: its 30 s, or the client's socket timeout (10 s) on an own connection.
    assert took_s < 5 + (0 if own_connections else POOL_WAIT_STEP_S), f"{took_s:.2f} s"
    assert queue.counts()["wait"] == 0, "the calls behind a cut wait did not run"
    with pytest.raises(redis.ConnectionError):
        scripts.wait_then_run(queue.keys.marker, 30, [call], None, wait)
    assert queue.counts()["wait"] == 0


@PATHS
def test_another_thread_ends_a_wait_by_the_client_id_it_gave(named, prefix, own_connections):
    scripts = waiting_scripts(named, own_connections)
    client, name = named
    marker = Queue("q", client, prefix=prefix, scripts=scripts).keys.marker

    asked = threading.Event()

    def wait_long():
        scripts.wait_then_run(marker, 0.01, [], None, None)  # as a worker's marker thread: it waited before
        ident = scripts.client_id()
        asked.set()
        return ident, scripts.wait_then_run(marker, 30, [], None, None)

    thread, outcome = in_thread(wait_long)
    assert asked.wait(5) and wait_until(lambda: blocked_connections(client, name, marker) == 1, 5)
    [ident] = [entry["id"] for entry in client.client_list() if entry["name"] == name and "b" in entry["flags"]]
    woken, replies, _acked = scripts.wait_then_run(marker, 0.01, [], None, None, unblock=int(ident))
    thread.join(5)
    [(given, (unblocked, _, _))] = outcome
    assert given == int(ident), "client_id() named the connection the wait then blocked on"
    assert isinstance(unblocked, redis.ResponseError) and "CLIENT UNBLOCK" in str(unblocked)
    assert woken is None and replies == []


@PATHS
def test_a_stopped_idle_worker_leaves_soon_and_takes_nothing_added_after(named, prefix, own_connections):
    scripts = waiting_scripts(named, own_connections)
    client, name = named
    queue = Queue("q", client, prefix=prefix, scripts=scripts)
    worker = Worker("q", lambda job: None, client, WorkerOptions(prefix=prefix, block_timeout_s=30), scripts=scripts)
    thread, outcome = in_thread(worker.run)
    assert wait_until(lambda: blocked_connections(client, name, queue.keys.marker) == 1, 5)
    stopped_at = time.monotonic()
    worker.stop()
    job_id = queue.add("late")
    thread.join(20)
    assert outcome == [0], outcome
    took_s = time.monotonic() - stopped_at
    # As a cut's (above): 5 s for a slow machine, under the 10 s socket timeout that ends an uncut wait.
    assert took_s < 5 + (0 if own_connections else POOL_WAIT_STEP_S), f"the 30 s wait took {took_s:.2f} s"
    assert queue.get_state(job_id) == "wait"


def test_the_environment_switches_the_fast_path_off(monkeypatch, redis_client):
    cluster = not Scripts(redis_client, own_connections=True).waits_then_runs
    monkeypatch.setenv(OWN_CONNECTIONS_ENV, "0")
    assert Scripts(redis_client).own_connections is False
    monkeypatch.setenv(OWN_CONNECTIONS_ENV, "1")
    assert Scripts(redis_client).own_connections is not cluster, "on by default, never on a cluster"
    monkeypatch.delenv(OWN_CONNECTIONS_ENV)
    assert Scripts(redis_client).own_connections is not cluster
    monkeypatch.setenv(OWN_CONNECTIONS_ENV, "off")
    with pytest.raises(ValueError, match=f"{OWN_CONNECTIONS_ENV} must be 1 .* or 0 .*, not 'off'"):
        Scripts(redis_client)
