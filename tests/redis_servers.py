"""Throwaway redis-server processes on free loopback ports, for tests that need their own."""

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """A redis-server on a fixed free port that can be stopped and started again."""

    def __init__(self, *config: str) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.fail("redis-server is not installed (.ci/run installs it)")
        self.port = free_port()
        self.config = config
        self.workdir = tempfile.TemporaryDirectory(prefix="echomq-test-redis-")
        self.process: subprocess.Popen | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--dir", self.workdir.name, *self.config], stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
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
