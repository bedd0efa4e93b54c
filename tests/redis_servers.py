"""Throwaway redis-server processes on free loopback ports, for tests that need their own."""

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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """A redis-server on a fixed free port that can be stopped and started again.

    With `tls` (a folder holding ca.crt, server.crt and server.key) it speaks
    only TLS on that port, and `url` is a rediss:// URL trusting that CA.
    """

    def __init__(self, *config: str, tls: Path | None = None) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.fail("redis-server is not installed (.ci/run installs it)")
        self.port = free_port()
        self.workdir = tempfile.TemporaryDirectory(prefix="echomq-test-redis-")
        self.process: subprocess.Popen | None = None
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
            [self.binary, "--bind", "127.0.0.1", "--save", "", "--dir", self.workdir.name, *self.args],
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
