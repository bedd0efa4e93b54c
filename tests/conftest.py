"""Fixtures: a real Redis, and a key prefix of each test's own that is deleted afterwards.

The Redis is the one ECHOMQ_TEST_REDIS_URL names (any URL `connect` reads),
127.0.0.1:6379 by default. ECHOMQ_TEST_REDIS_URL=cluster starts a 3-master
Redis Cluster on free loopback ports for the run and runs everything on it;
ECHOMQ_TEST_REDIS_URL=valkey starts a valkey-server (found on PATH) on a free
port for the run, and the servers tests start of their own are valkey-server too.

Each test is marked with its layer, the folder it lives in (tests/unit/ gets
`unit`, ...): CI picks a line's tests by these markers (see .ci/run).
"""

import os
import shutil
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from echomq_django.core import Queue, Scripts, connect
from tests.redis_servers import SERVER_PROGRAM, ClusterServers, RedisServer

# The fixtures a project's tests get from echomq (docs/testing.md): `echomq`.
pytest_plugins = ["echomq_django.testing"]
_run_servers: ClusterServers | RedisServer | None = None  # the servers this run started for its fixtures
TESTS = Path(__file__).resolve().parent
LAYERS = ("unit", "protocol", "runtime", "django", "system")


def pytest_configure(config) -> None:
    global _run_servers
    # A run started in the background of a shell without job control inherits SIGINT ignored, and so would the
    # processes its tests start: the tests of Ctrl-C would wait for good. Python's own handler, as in a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    mode = os.environ.get("ECHOMQ_TEST_REDIS_URL")
    if mode == "cluster":
        _run_servers = ClusterServers(masters=3, replicas=0)
    elif mode == "valkey":
        if shutil.which("valkey-server") is None:
            raise pytest.UsageError("ECHOMQ_TEST_REDIS_URL=valkey needs valkey-server on PATH (see .ci/run)")
        os.environ[SERVER_PROGRAM] = "valkey-server"  # child processes (and xdist's) see it too
        _run_servers = RedisServer()
    else:
        return
    _run_servers.start()
    os.environ["ECHOMQ_TEST_REDIS_URL"] = _run_servers.url  # child processes see it too


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0]
        if folder not in LAYERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in the folder of its layer, one of {LAYERS}")
        item.add_marker(folder)


def pytest_unconfigure(config) -> None:
    if _run_servers is not None:
        _run_servers.stop()
        if isinstance(_run_servers, RedisServer):
            _run_servers.workdir.cleanup()


def current_redis_url() -> str:
    return os.environ.get("ECHOMQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_url() -> str:
    return current_redis_url()


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """A cheap password hash for the users tests create (PBKDF2's 0.25 s each adds minutes to the suite)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def redis_client():
    url = current_redis_url()
    client = connect(url, retry=None, retry_on_error=[])
    try:
        client.ping()
    except Exception as error:  # a clear reason instead of a stack of retries
        pytest.fail(f"the tests need a Redis at {url} (set ECHOMQ_TEST_REDIS_URL): {error}")
    client.close()
    client = connect(url)
    yield client
    client.close()


@pytest.fixture
def prefix(redis_client) -> Iterator[str]:
    """A key prefix no other test uses; every key under it is deleted afterwards."""
    name = f"t{uuid.uuid4().hex[:12]}"
    yield name
    keys = list(redis_client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        redis_client.delete(*keys)


@pytest.fixture
def subprocess_env(transactional_db, redis_url, prefix) -> dict[str, str]:
    """Environment for a manage.py child process: the test database, Redis and prefix."""
    from django.db import connection

    db = connection.settings_dict
    if db["ENGINE"].endswith("sqlite3"):
        database_url = f"sqlite:///{db['NAME']}"
    else:
        database_url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"
    return {**os.environ, "DATABASE_URL": database_url, "ECHOMQ_REDIS_URL": redis_url, "ECHOMQ_PREFIX": prefix}


@pytest.fixture
def echomq_settings(settings, redis_url, prefix):
    """ECHOMQ pointing at the test Redis and this test's prefix, with one queue `q`."""
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"q": {}}}
    return settings


@pytest.fixture
def scripts(redis_client) -> Scripts:
    return Scripts(redis_client)


@pytest.fixture
def queue(redis_client, prefix, scripts) -> Queue:
    return Queue("q", redis_client, prefix=prefix, scripts=scripts)


@pytest.fixture
def project_jobs_only(monkeypatch):
    """The @job registry with only the jobs of installed apps' modules, restored after the test.

    Tests register jobs of their own (tests.beat_app's, which the schedules
    tests install, stays registered once imported); a check of the project's
    jobs looks only at the project's.
    """
    from django.apps import apps

    from echomq_django import jobs

    monkeypatch.setattr(jobs.registry, "_registry", {
        name: function for name, function in jobs.registered_jobs().items()
        if apps.get_containing_app_config(function.func.__module__) is not None})
