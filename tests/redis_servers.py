"""Throwaway redis-server processes on free loopback ports, for tests that need their own."""

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from echomq_django.core import QueueKeys
from tests.helpers import wait_until

_handed_out: set[int] = set()  # ports given out in this process (and cluster servers' bus ports)
# The server program the tests start, on PATH: redis-server, or valkey-server where the run is on Valkey
# (ECHOMQ_TEST_REDIS_URL=valkey sets it, tests/conftest.py), so that the servers tests start are Valkey too.
SERVER_PROGRAM = "ECHOMQ_TEST_SERVER"


def server_program() -> str:
    return os.environ.get(SERVER_PROGRAM, "redis-server")


def free_port(*, with_bus: bool = False) -> int:
    """A free loopback port; `with_bus`: one whose cluster bus port (+10000) is free too.

    Taken below Linux's ephemeral range (32768 on): the kernel gives those to the local ends of the suite's
    own client connections, one of which could take a port between this probe and a server's bind, or
    while a test's server is down for a restart.
    """
    while True:
        port = random.randrange(10000, 22768) if with_bus else random.randrange(10000, 32768)
        if port in _handed_out or port + 10000 in _handed_out:
            continue
        try:
            with socket.socket() as probe, socket.socket() as bus:
                probe.bind(("127.0.0.1", port))
                if with_bus:
                    bus.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        _handed_out.update((port, port + 10000) if with_bus else (port,))
        return port


class RedisServer:
    """A redis-server on a fixed free port that can be stopped and started again.

    With `tls` (a folder holding ca.crt, server.crt and server.key) it speaks
    only TLS on that port, and `url` is a rediss:// URL trusting that CA.
    """

    def __init__(self, *config: str, tls: Path | None = None, port: int | None = None) -> None:
        self.binary = shutil.which(server_program())
        if self.binary is None:
            pytest.fail(f"{server_program()} is not on PATH (.ci/run installs it)")
        self.port = port or free_port()
        self.workdir = tempfile.TemporaryDirectory(prefix="echomq-test-redis-")
        self.process: subprocess.Popen | None = None
        self.config_file: list[str] = []  # a config file must come first on the command line
        if tls is None:
            self.args = ["--port", str(self.port), *config]
            self.url = f"redis://127.0.0.1:{self.port}/0"
        else:
            self.args = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(tls / "server.crt"),
                         "--tls-key-file", str(tls / "server.key"), "--tls-ca-cert-file", str(tls / "ca.crt"),
                         "--tls-auth-clients", "no", *config]
            self.url = f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={tls / 'ca.crt'}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, *self.config_file, "--bind", "127.0.0.1", "--save", "", "--dir", self.workdir.name,
             "--logfile", "redis.log", *self.args],
            stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.AuthenticationError:
                return  # it answers: it wants a password
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.05)

    def log_tail(self, lines: int = 40) -> str:
        log = Path(self.workdir.name) / "redis.log"
        text = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else ["(no log)"]
        return "\n".join(line for line in text if "Memory overcommit" not in line)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@contextmanager
def redis_server(*config: str) -> Iterator[str]:
    """Run a redis-server with extra `--option value` arguments; yields its URL."""
    server = RedisServer(*config)
    server.start()
    try:
        yield server.url
    finally:
        server.stop()
        server.workdir.cleanup()


class ClusterServers:
    """A Redis Cluster on free loopback ports: `masters` masters with `replicas` replicas each.

    Built with CLUSTER ADDSLOTSRANGE, MEET and REPLICATE rather than
    `redis-cli --cluster create`, which refuses fewer than three masters. A
    node counts as failed after 3 s without answers (see SentinelServers).
    `url` is the redis+cluster:// URL naming every master.
    """

    def __init__(self, masters: int = 3, replicas: int = 1, *config: str) -> None:
        cluster = ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                   "--cluster-node-timeout", "3000", "--appendonly", "no",
                   "--repl-diskless-sync-delay", "0", *config)
        self.masters = [RedisServer(*cluster, port=free_port(with_bus=True)) for _ in range(masters)]
        self.replicas = [RedisServer(*cluster, port=free_port(with_bus=True)) for _ in range(masters * replicas)]
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.masters)

    @property
    def nodes(self) -> list[RedisServer]:
        return self.masters + self.replicas

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        clients = [redis.Redis(port=node.port, decode_responses=True) for node in self.nodes]
        per_master = 16384 // len(self.masters)
        for i, client in enumerate(clients[:len(self.masters)]):
            last = 16383 if i == len(self.masters) - 1 else (i + 1) * per_master - 1
            client.execute_command("CLUSTER ADDSLOTSRANGE", i * per_master, last)
            # Distinct epochs, as redis-cli gives them: a failover must be able
            # to outbid every other master's claim.
            client.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
        for client in clients[1:]:
            client.execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].port)
        wait_for(lambda: all(int(c.execute_command("CLUSTER INFO")["cluster_known_nodes"]) == len(clients)
                             for c in clients), "every node to know every other")
        for i, client in enumerate(clients[len(self.masters):]):
            master = clients[i % len(self.masters)]
            client.execute_command("CLUSTER REPLICATE", master.execute_command("CLUSTER MYID"))
        self.wait_ok()
        for client in clients:
            client.close()

    def wait_ok(self, timeout: float = 30) -> None:
        """Wait until every live node reports cluster_state:ok and every replica has synced."""
        def healthy() -> bool:
            for node in self.nodes:
                if node.process is None or node.process.poll() is not None:
                    continue
                with redis.Redis(port=node.port, decode_responses=True) as client:
                    if client.execute_command("CLUSTER INFO")["cluster_state"] != "ok":
                        return False
                    info = client.info("replication")
                    if info["role"] == "slave" and info.get("master_link_status") != "up":
                        return False
            return True
        wait_for(healthy, "the cluster to be ok", timeout)

    def queues_on_each_master(self, client, prefix: str, per_master: int = 1) -> list[str]:
        """Queue names `q0`, `q1`, ... chosen so that each master owns `per_master` of them, in master order."""
        names: dict[int, list[str]] = {master.port: [] for master in self.masters}
        n = 0
        while any(len(owned) < per_master for owned in names.values()):
            owned = names[client.get_node_from_key(QueueKeys(f"q{n}", prefix).wait).port]
            if len(owned) < per_master:
                owned.append(f"q{n}")
            n += 1
        return [name for owned in names.values() for name in owned]

    def promote(self, replica: RedisServer, timeout: float = 40) -> None:
        """Make `replica` a master with CLUSTER FAILOVER (its master alive and agreeing).

        Asked again every few seconds: masters refuse a second vote about the
        same master's replicas within two node timeouts, and then the manual
        failover expires.
        """
        deadline = time.monotonic() + timeout
        with redis.Redis(port=replica.port, decode_responses=True) as client:
            wait_for(lambda: client.info("replication").get("master_link_status") == "up", "the replica to sync")
            while client.info("replication")["role"] != "master":
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{replica.port} did not become a master in {timeout} s")
                client.execute_command("CLUSTER FAILOVER")
                wait_until(lambda: client.info("replication")["role"] == "master", 6, 0.05)
        self.wait_ok()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
            node.workdir.cleanup()


class SentinelServers:
    """A primary, one replica and one Sentinel watching them as `service`, on free loopback ports.

    Failure detection takes 3 s: with less, a busy 2-core machine can miss a
    PING reply from a just-promoted primary and start a second failover.
    """

    def __init__(self, service: str = "echomq", *config: str) -> None:
        self.service = service
        self.primary = RedisServer("--repl-diskless-sync-delay", "0", *config)
        self.replica = RedisServer("--replicaof", "127.0.0.1", str(self.primary.port),
                                   "--repl-diskless-sync-delay", "0", *config)
        self.sentinel = RedisServer()
        self.url = f"redis+sentinel://127.0.0.1:{self.sentinel.port}/{service}"

    def start(self) -> None:
        self.primary.start()
        self.replica.start()
        conf = Path(self.sentinel.workdir.name) / "sentinel.conf"
        conf.write_text(
            f"sentinel monitor {self.service} 127.0.0.1 {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {self.service} 3000\n"
            f"sentinel failover-timeout {self.service} 10000\n"
            f"sentinel resolve-hostnames no\n")
        self.sentinel.config_file = [str(conf)]
        self.sentinel.args = ["--sentinel", "--port", str(self.sentinel.port)]
        self.sentinel.start()
        with redis.Redis(port=self.replica.port, decode_responses=True) as replica:
            wait_for(lambda: replica.info("replication").get("master_link_status") == "up",
                     "the replica to sync")
        with redis.Redis(port=self.sentinel.port, decode_responses=True) as sentinel:
            wait_for(lambda: sentinel.execute_command("SENTINEL REPLICAS", self.service),
                     "the Sentinel to find the replica")

    def primary_port(self) -> int:
        with redis.Redis(port=self.sentinel.port, decode_responses=True) as sentinel:
            return int(sentinel.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)[1])

    def stop(self) -> None:
        for server in (self.sentinel, self.replica, self.primary):
            server.stop()
            server.workdir.cleanup()


@contextmanager
def logs_on_failure(servers: list[RedisServer]) -> Iterator[None]:
    """Print the end of each server's log when the block fails, to show what the servers did."""
    try:
        yield
    except BaseException:
        for server in servers:
            print(f"----- redis-server on port {server.port}:\n{server.log_tail()}")
        raise


def wait_for(predicate, what: str, timeout: float = 20) -> None:
    """`wait_until`, with a timeout as an error that names what was awaited."""
    if not wait_until(predicate, timeout, 0.05):
        raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
