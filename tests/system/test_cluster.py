"""Redis Cluster and Sentinel: queues spread over masters, and failovers that lose no confirmed job.

These tests start their own servers (3 masters with a replica each; a
primary, a replica and a Sentinel) on free loopback ports, whatever
ECHOMQ_TEST_REDIS_URL says. The protocol and runtime tests run on a cluster when
ECHOMQ_TEST_REDIS_URL=cluster (a CI line does that; tests/runtime/test_on_a_cluster.py
checks that it does).
"""

import threading
import time
import uuid
from collections import Counter

import pytest
import redis
from redis.cluster import RedisCluster

from echomq_django.core import (
    Confirm,
    NewJob,
    NotConfirmedError,
    Queue,
    QueueKeys,
    Retention,
    Sweeper,
    SweepTarget,
    Worker,
    WorkerOptions,
    connect,
)
from tests.helpers import wait_until
from tests.redis_servers import ClusterServers, SentinelServers, logs_on_failure

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a failover takes up to 20 s
LOCK_MS = 2000


@pytest.fixture
def cluster():  # one per test: a failover leaves a cluster in a state of its own
    servers = ClusterServers(masters=3, replicas=1)
    servers.start()
    yield servers
    servers.stop()


@pytest.fixture
def own_prefix() -> str:  # no cleanup: every test stops its own servers, keys and all
    return f"c{uuid.uuid4().hex[:10]}"


class Load:
    """Producers adding confirmed jobs with their own ids, a worker per queue and one sweeper, all in threads.

    `acknowledged` holds every id whose add returned: those must all end completed.
    """

    def __init__(self, url: str, prefix: str, names: list[str]) -> None:
        self.client = connect(url)
        self.confirm = Confirm(replicas=1, timeout_ms=500)
        self.queues = [Queue(name, self.client, prefix=prefix, confirm=self.confirm) for name in names]
        self.acknowledged: set[tuple[str, str]] = set()
        self.acknowledged_per_queue: Counter[str] = Counter()
        self.not_confirmed = 0
        self.runs: Counter[tuple[str, str]] = Counter()
        self.stopping = threading.Event()
        self.workers = [Worker(name, self._handle(name), self.client, WorkerOptions(prefix=prefix, concurrency=4,
                                                                                    lock_duration_ms=LOCK_MS,
                                                                                    block_timeout_s=0.5,
                                                                                    confirm=self.confirm,
                                                                                    keep_completed=Retention()))
                        for name in names]
        self.sweeper = Sweeper(self.client, [SweepTarget(name, interval_ms=500) for name in names], prefix=prefix)
        self.threads = [threading.Thread(target=self._produce, args=(queue,), daemon=True) for queue in self.queues]
        self.threads += [threading.Thread(target=worker.run, daemon=True) for worker in self.workers]
        self.threads.append(threading.Thread(target=self.sweeper.run, daemon=True))

    def _handle(self, name: str):
        def handle(job):
            self.runs[(name, job.id)] += 1
            time.sleep(0.002)
        return handle

    def _produce(self, queue: Queue) -> None:
        n = 0
        while not self.stopping.is_set():
            job_id = f"job-{n}"
            try:
                queue.add("work", {"n": n}, job_id=job_id)
            except NotConfirmedError:
                self.not_confirmed += 1  # in the queue but unconfirmed: add the same id again
                continue
            self.acknowledged.add((queue.name, job_id))
            self.acknowledged_per_queue[queue.name] += 1
            n += 1

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def each_acknowledged(self, count: int, timeout: float = 30) -> bool:
        """Wait until every queue has `count` more acknowledged jobs than now.

        (A replica that has just synced gets the stream only after its first
        ACK, up to a second later; until then no add to its master is confirmed.)
        """
        goal = {queue.name: self.acknowledged_per_queue[queue.name] + count for queue in self.queues}
        return wait_until(lambda: all(self.acknowledged_per_queue[name] >= n for name, n in goal.items()), timeout)

    def stop_producing(self) -> None:
        self.stopping.set()

    def completed(self) -> set[tuple[str, str]]:
        done = set()
        for queue in self.queues:
            done |= {(queue.name, job_id) for job_id in queue.client.zrange(queue.keys.completed, 0, -1)}
        return done

    def finish(self, timeout: float = 60) -> None:
        """Wait until every acknowledged job is completed, then stop everything."""
        self.stop_producing()
        try:
            assert wait_until(lambda: self.acknowledged <= self.completed(), timeout, 0.2), (
                "acknowledged jobs never completed, per queue: "
                f"{Counter(n for n, _ in self.acknowledged - self.completed())}"
                f"; counts: {[queue.counts() for queue in self.queues]}")
        finally:
            for worker in self.workers:
                worker.stop()
                worker.stop()
            self.sweeper.stop()
            for thread in self.threads:
                thread.join(10)

    def report(self, what: str) -> str:
        twice = Counter(name for (name, _), runs in self.runs.items() if runs > 1)
        return (f"{what}: {len(self.acknowledged)} acknowledged, {self.not_confirmed} adds not confirmed and "
                f"sent again, jobs that ran twice per queue: {dict(twice)}")

    def lost(self) -> set[tuple[str, str]]:
        """Acknowledged jobs whose hash is gone."""
        return {(name, job_id) for name, job_id in self.acknowledged
                if not self.client.exists(QueueKeys(name, self.queues[0].keys.prefix).job(job_id))}


def test_queues_spread_over_the_masters_and_each_queue_lives_on_one(cluster, own_prefix):
    client = connect(cluster.url)
    assert isinstance(client, RedisCluster)
    names = cluster.queues_on_each_master(client, own_prefix)
    load = Load(cluster.url, own_prefix, names)
    load.start()
    assert load.each_acknowledged(200)
    load.finish()
    for master, name in zip(cluster.masters, names):
        with redis.Redis(port=master.port, decode_responses=True) as node:
            here = {key.split(":")[1] for key in node.scan_iter(match=f"{own_prefix}:*", count=1000)}
        assert here == {f"{{{name}}}"}, f"node {master.port} holds keys of {here}, not only of {name}"
    per_queue = Counter(name for name, _ in load.acknowledged)
    assert all(per_queue[name] > 0 for name in names), per_queue
    assert not load.lost()


@pytest.mark.parametrize("how", ["CLUSTER FAILOVER", "kill -9"])
def test_a_master_failover_loses_no_acknowledged_job(cluster, own_prefix, how):
    client = connect(cluster.url)
    names = cluster.queues_on_each_master(client, own_prefix)
    load = Load(cluster.url, own_prefix, names)
    # The first queue's master hands over to its replica, or dies.
    master, replica = cluster.masters[0], cluster.replicas[0]
    with logs_on_failure([master, replica]):
        load.start()
        assert load.each_acknowledged(100)
        if how == "kill -9":
            master.process.kill()
            master.process.wait(10)
            with redis.Redis(port=replica.port, decode_responses=True) as promoted:
                assert wait_until(lambda: promoted.info("replication")["role"] == "master", 30, 0.1)
            # Only once the whole cluster knows, the old master comes back, and then as
            # the replica of the node that took over. (A master without persistence that
            # is back sooner can still claim its slots and hand its empty dataset on.)
            cluster.wait_ok()
            time.sleep(1)
            master.start()
        else:
            cluster.promote(replica)
        assert load.each_acknowledged(100, timeout=60), "producers did not go on after the failover"
        load.finish()
        assert not load.lost()
        assert load.acknowledged <= load.completed()
        print(load.report(how))


def test_a_sentinel_failover_loses_no_acknowledged_job(own_prefix):
    servers = SentinelServers()
    servers.start()
    try:
        with logs_on_failure([servers.sentinel, servers.primary, servers.replica]):
            load = Load(servers.url, own_prefix, ["a", "b"])
            load.start()
            assert load.each_acknowledged(150)
            old_port = servers.primary.port
            servers.primary.process.kill()
            servers.primary.process.wait(10)
            assert wait_until(lambda: servers.primary_port() != old_port, 30, 0.1), "Sentinel did not fail over"
            # Until a replica is back, no add can be confirmed, and none is acknowledged.
            servers.primary.start()  # Sentinel turns the old primary into a replica of the new one
            assert load.each_acknowledged(150, timeout=60), "producers did not go on after the failover"
            load.finish()
            assert not load.lost()
            assert load.acknowledged <= load.completed()
            print(load.report("Sentinel failover"))
    finally:
        servers.stop()


def test_fifty_workers_on_five_queues_are_listed_per_queue_on_a_cluster(own_prefix):
    servers = ClusterServers(masters=3, replicas=0)
    servers.start()
    try:
        client = connect(servers.url)
        names = servers.queues_on_each_master(client, own_prefix, per_master=2)[:5]  # every master owns one or two
        options = WorkerOptions(prefix=own_prefix, lock_duration_ms=LOCK_MS, block_timeout_s=0.5)
        workers = {name: [Worker(name, lambda job: None, client, options, worker_id=f"{name}-w{n}") for n in range(10)]
                   for name in names}
        threads = [threading.Thread(target=worker.run, daemon=True) for each in workers.values() for worker in each]
        for thread in threads:
            thread.start()
        queues = {name: Queue(name, client, prefix=own_prefix) for name in names}

        def listed() -> dict[str, list[str]]:
            return {name: sorted(info.id for info in queue.workers()) for name, queue in queues.items()}

        expected = {name: sorted(f"{name}-w{n}" for n in range(10)) for name in names}
        assert wait_until(lambda: listed() == expected, 30), listed()
        for queue in queues.values():
            queue.add_bulk([NewJob("x") for _ in range(20)])
        assert wait_until(lambda: all(sum(info.done for info in queue.workers()) == 20 for queue in queues.values()),
                          30), {name: [info.done for info in queue.workers()] for name, queue in queues.items()}
        first = names[0]
        for worker in workers[first]:
            worker.stop()
        assert wait_until(lambda: listed() == {**expected, first: []}, 30), listed()
    finally:
        for each in workers.values():
            for worker in each:
                worker.stop()
                worker.stop()
        for thread in threads:
            thread.join(10)
        servers.stop()
