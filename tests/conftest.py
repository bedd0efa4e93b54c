"""Fixtures: a real Redis, and a key prefix of each test's own that is deleted afterwards.

The Redis is the one ECHOMQ_TEST_REDIS_URL names (any URL `connect` reads),
127.0.0.1:6379 by default. ECHOMQ_TEST_REDIS_URL=cluster starts a 3-master
Redis Cluster on free loopback ports for the run and runs everything on it.
"""

import os
import sys
import uuid
from collections.abc import Iterator

import pytest

from echomq_django.core import Queue, Scripts, connect
from tests.redis_servers import ClusterServers

_cluster: ClusterServers | None = None
_SKIP_OWN_SERVERS = pytest.StashKey[bool]()
_SKIP_NO_DATABASE = pytest.StashKey[bool]()
_LTS_LINE = pytest.StashKey[bool]()
_DATABASE_ONLY = pytest.StashKey[bool]()
# What a test asks for when it reaches the Django database (the rest cannot tell PostgreSQL from SQLite).
_DATABASE_FIXTURES = {"db", "transactional_db", "django_db_setup", "django_db_reset_sequences",
                      "django_db_serialized_rollback", "live_server", "admin_client", "admin_user",
                      "django_user_model"}


def pytest_configure(config) -> None:
    global _cluster
    on_sqlite = os.environ.get("DATABASE_URL", "sqlite").startswith("sqlite")
    if os.environ.get("ECHOMQ_TEST_REDIS_URL") == "cluster" or not on_sqlite or sys.version_info < (3, 12):
        # A test that brings its own Redis servers and tests no database would only run
        # again here; the SQLite run of the newest Python and Django has it. (What it tests
        # is Redis's faults and topology, not the Python or Django version: those marked
        # every_python, the demo's, run on the Python 3.11 line too.)
        config.stash[_SKIP_OWN_SERVERS] = True
    config.stash[_LTS_LINE] = on_sqlite and sys.version_info < (3, 12)
    # The same for a test of the runtime's processes alone (no Django database, and nothing the
    # topology of Redis changes: tests/test_cluster.py runs the pool once on the cluster).
    config.stash[_SKIP_NO_DATABASE] = not on_sqlite or os.environ.get("ECHOMQ_TEST_REDIS_URL") == "cluster"
    # The PostgreSQL run is there for the database: a test that never reaches it runs on SQLite alone.
    config.stash[_DATABASE_ONLY] = not on_sqlite
    if os.environ.get("ECHOMQ_TEST_REDIS_URL") == "cluster":
        _cluster = ClusterServers(masters=3, replicas=0)
        _cluster.start()
        os.environ["ECHOMQ_TEST_REDIS_URL"] = _cluster.url  # child processes see it too


def pytest_collection_modifyitems(config, items) -> None:
    if config.stash.get(_SKIP_OWN_SERVERS, False):
        skip = pytest.mark.skip(reason="own servers, no database: the SQLite run of the newest Python has it")
        for item in items:
            if item.get_closest_marker("own_servers") and not (
                    config.stash.get(_LTS_LINE, False) and item.get_closest_marker("every_python")):
                item.add_marker(skip)
    if config.stash.get(_SKIP_NO_DATABASE, False):
        skip = pytest.mark.skip(reason="no database: the SQLite run of this Python has it")
        for item in items:
            if item.get_closest_marker("no_database"):
                item.add_marker(skip)
    if config.stash.get(_DATABASE_ONLY, False):
        skip = pytest.mark.skip(reason="reaches no database: the SQLite runs have it")
        for item in items:
            if not (_DATABASE_FIXTURES & set(item.fixturenames) or item.get_closest_marker("django_db")):
                item.add_marker(skip)


def pytest_unconfigure(config) -> None:
    if _cluster is not None:
        _cluster.stop()


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

    monkeypatch.setattr(jobs, "_registry", {
        name: function for name, function in jobs.registered_jobs().items()
        if apps.get_containing_app_config(function.func.__module__) is not None})
