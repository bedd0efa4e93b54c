"""On the CI line that runs the protocol and runtime tests on Valkey: the fixtures, and the servers tests start, use it.

Skipped unless the run is on Valkey (`ECHOMQ_TEST_REDIS_URL=valkey`, which tests/conftest.py turns into a
valkey-server of the run's own and ECHOMQ_TEST_SERVER=valkey-server for the servers tests start).
"""

import pytest

from echomq_django.core import connect
from tests.redis_servers import redis_server, server_program

pytestmark = pytest.mark.skipif(server_program() != "valkey-server", reason="the run is not on Valkey")


def test_the_fixtures_redis_is_valkey(redis_client, queue):
    info = redis_client.info("server")
    assert info["server_name"] == "valkey", info
    queue.add("x")
    assert redis_client.llen(queue.keys.wait) == 1


def test_a_server_a_test_starts_is_valkey_too():
    with redis_server() as url:
        client = connect(url)
        try:
            assert client.info("server")["server_name"] == "valkey"
        finally:
            client.close()
