"""Reading Redis URLs: each kind names its servers, and a malformed one is refused with a reason."""

import pytest

from echomq_django.core.connection import RedisURLError, connect, parse_redis_url


@pytest.mark.parametrize("url, expected", [
    ("redis://127.0.0.1:6379/2", ("redis", [], {}, "")),
    ("rediss://cache:6380/0", ("rediss", [], {}, "")),
    ("unix:///run/redis.sock?db=1", ("unix", [], {}, "")),
    ("redis+cluster://10.0.0.1:7000,10.0.0.2:7001,10.0.0.3",
     ("redis+cluster", [("10.0.0.1", 7000), ("10.0.0.2", 7001), ("10.0.0.3", 6379)], {}, "")),
    ("redis+cluster://app:s%40cret@[::1]:7000/0?socket_timeout=3",
     ("redis+cluster", [("::1", 7000)], {"username": "app", "password": "s@cret", "socket_timeout": 3.0}, "")),
    ("redis+sentinel://s1:26379,s2/mymaster",
     ("redis+sentinel", [("s1", 26379), ("s2", 26379)], {"db": 0}, "mymaster")),
    ("redis+sentinel://:pw@s1:5000/jobs/4",
     ("redis+sentinel", [("s1", 5000)], {"password": "pw", "db": 4}, "jobs")),
])
def test_each_kind_of_url_names_its_nodes_and_options(url, expected):
    assert parse_redis_url(url) == expected


@pytest.mark.parametrize("url, message", [
    ("http://localhost", "must start with one of redis://"),
    ("localhost:6379", "must start with one of"),
    ("redis+cluster://", "empty host"),
    ("redis+cluster://a:7000,,b:7001", "empty host"),
    ("redis+cluster://a:70000", "'70000' is not a port number"),
    ("redis+cluster://a:7000/1", "a cluster has only database 0"),
    ("redis+sentinel://a:26379", "names no Sentinel service"),
    ("redis+sentinel://a:26379/svc/1/2", "only a database number may follow"),
    ("redis+sentinel://a:26379/svc/x", "'x' is not a database number"),
    ("redis://a:port", "Port could not be cast"),
    (None, "must be a string, not NoneType"),
])
def test_a_malformed_url_is_refused_with_what_is_wrong(url, message):
    with pytest.raises(RedisURLError, match=message):
        parse_redis_url(url)
    with pytest.raises(ValueError):  # also one, for callers that catch that
        connect(url)


def test_a_password_never_appears_in_the_error():
    with pytest.raises(RedisURLError) as caught:
        parse_redis_url("redis+cluster://app:hunter2@a:x")
    assert "hunter2" not in str(caught.value) and "app:***@" in str(caught.value)
