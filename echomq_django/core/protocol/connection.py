"""Redis clients configured the way the queue needs them, from one URL.

Three kinds of URL name where the queue lives:

    redis://[user:password@]host:port/db       one server (rediss:// for TLS, unix:// for a socket)
    redis+cluster://[user:password@]host:port[,host:port...]
                                               Redis Cluster; the nodes are where discovery starts
    redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]
                                               the primary that these Sentinels name `service`

Query options (`?socket_timeout=5&ssl_ca_certs=...`) are those of redis-py's
`from_url` and apply to the Redis servers; credentials too. Sentinels are
asked without credentials.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import parse_url
from redis.exceptions import ConnectionError, RedisClusterException, TimeoutError
from redis.retry import Retry
from redis.sentinel import Sentinel

from .. import defaults
from ..errors import RedisURLError

DEFAULT_REDIS_URL = defaults.REDIS_URL
# What "Redis cannot be reached right now" looks like: a failed connection or
# reply, or a cluster of which no node answers.
UNREACHABLE = (ConnectionError, TimeoutError, RedisClusterException)
SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "redis+sentinel")


def _retry() -> Retry:
    # Backoff growing to 0.5 s between tries, about 15 s in all: long enough
    # for a restart or a failover (Sentinel or Cluster) to finish, and short
    # steps, so a worker's renewal lands within half a second of Redis coming
    # back (the sweep's hold gives it one lock duration; see protocol.md).
    return Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=32)


def require_text_replies(client: Any) -> None:
    """ValueError unless `client` decodes Redis's replies to str as `connect` sets it up, bytes that are not
    UTF-8 (another client's) included: every reply the runtime reads (ids, states, tokens) is compared as
    text, so with bytes nothing matches and a worker would leave every job it took to the sweeper; and with
    strict decoding one such byte in one job makes a worker raise, its fetched jobs left behind."""
    kwargs = getattr(client, "get_connection_kwargs", None)
    if not callable(kwargs):
        return
    options = kwargs()
    if not options.get("decode_responses") or options.get("encoding_errors", "strict") == "strict":
        raise ValueError("this Redis client must decode its replies: create it with decode_responses=True and "
                         'encoding_errors="replace", or use echomq_django.core.connect(url), which does')


def connect(url: str = DEFAULT_REDIS_URL, **options: Any) -> Any:
    """A client for `url` that decodes replies to str and rides out short outages.

    Returns a `redis.Redis` (one server or a Sentinel-managed primary) or a
    `redis.cluster.RedisCluster`. Commands are retried with backoff on
    connection errors, so a restarting Redis or a failover is survived
    without the caller noticing; the scripts are written so that a re-sent
    call is harmless. Workers block on the marker for less than the socket
    timeout (10 s). `options` override the defaults (`retry=None` turns off
    the retries of a plain or Sentinel client; a cluster client then keeps
    redis-py's own few). Raises RedisURLError for a malformed URL.
    """
    scheme, nodes, kwargs, service = parse_redis_url(url)
    settings: dict[str, Any] = {
        "decode_responses": True,
        # Bytes that are not UTF-8 (a pickle written by some other client) are
        # shown with replacement characters, never decoded as anything else.
        "encoding_errors": "replace",
        "socket_timeout": 10.0,
        "socket_connect_timeout": 5.0,
        "retry": _retry(),
    }
    if scheme == "redis+cluster":
        # The cluster client retries at its own level, refreshing its map of
        # slots between tries; its connections to the nodes do not retry.
        # Script batches bypass it (they go to the owning node's client), and
        # scripts.py retries those itself.
        settings.update(kwargs)
        settings.update(options)
        return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in nodes],
                            retry=settings.pop("retry"), **settings)
    settings.update({"health_check_interval": 30, "retry_on_error": [ConnectionError, TimeoutError]})
    settings.update(kwargs)
    settings.update(options)
    if scheme == "redis+sentinel":
        sentinel = Sentinel(nodes, socket_timeout=settings["socket_timeout"],
                            socket_connect_timeout=settings["socket_connect_timeout"])
        return sentinel.master_for(service, **settings)
    return redis.Redis.from_url(url, **settings)


def parse_redis_url(url: object) -> tuple[str, list[tuple[str, int]], dict[str, Any], str]:
    """Check a URL: (scheme, [(host, port), ...], connection options, Sentinel service).

    For redis://, rediss:// and unix:// the node list is empty and redis-py
    reads the URL itself. Raises RedisURLError naming what is wrong.
    """
    if not isinstance(url, str):
        raise RedisURLError(f"a Redis URL must be a string, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise RedisURLError(
            f"{_shown(url)} is not a Redis URL: it must start with one of "
            + ", ".join(f"{s}://" for s in SCHEMES))
    if scheme in ("redis", "rediss", "unix"):
        try:
            options = parse_url(url)
        except ValueError as error:
            raise RedisURLError(f"{_shown(url)}: {error}") from None
        database = unquote(urlsplit(url).path).strip("/") if scheme != "unix" else ""
        if database and not database.isdigit():  # redis-py would quietly use database 0
            raise RedisURLError(f"{_shown(url)}: {database!r} is not a database number")
        _check_options(url, options)
        return scheme, [], {}, ""
    parts = urlsplit("redis://" + rest)
    credentials, _, hosts = parts.netloc.rpartition("@")
    default_port = 26379 if scheme == "redis+sentinel" else 6379
    nodes = [_node(item, default_port, url) for item in hosts.split(",")]
    path = [unquote(p) for p in parts.path.split("/") if p]
    service, db = "", "0"
    if scheme == "redis+sentinel":
        if not path:
            raise RedisURLError(f"{_shown(url)} names no Sentinel service: "
                                "end it with /service_name, as in redis+sentinel://host:26379/mymaster")
        service, *rest_path = path
        if len(rest_path) > 1:
            raise RedisURLError(f"{_shown(url)}: after the service name only a database number may follow")
        db = rest_path[0] if rest_path else "0"
        if not db.isdigit():
            raise RedisURLError(f"{_shown(url)}: {db!r} is not a database number")
    elif path and path != ["0"]:
        raise RedisURLError(f"{_shown(url)}: a cluster has only database 0, so the URL may not name {'/'.join(path)!r}")
    query = f"?{parts.query}" if parts.query else ""
    at = f"{credentials}@" if credentials else ""
    try:
        options = parse_url(f"redis://{at}{hosts.split(',')[0]}/{db}{query}")
    except ValueError as error:
        raise RedisURLError(f"{_shown(url)}: {error}") from None
    for key in ("host", "port"):
        options.pop(key, None)
    if scheme == "redis+cluster":
        options.pop("db", None)
    _check_options(url, options)
    return scheme, nodes, options, service


def _check_options(url: str, options: dict[str, Any]) -> None:
    """Refuse a query parameter no connection takes (redis-py would fail on the first command)."""
    options = dict(options)
    connection_class = options.pop("connection_class", redis.Connection)  # SSL, a Unix socket
    try:
        connection_class(**options)  # builds the connection only: nothing is sent
    except TypeError as error:
        unknown = str(error).rpartition("argument ")[2] or str(error)
        raise RedisURLError(f"{_shown(url)}: no connection option is called {unknown}") from None


def _node(item: str, default_port: int, url: str) -> tuple[str, int]:
    if item.startswith("["):  # [IPv6]:port
        host, _, port = item[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "")
    if not host:
        raise RedisURLError(f"{_shown(url)} has an empty host in its node list {item!r}")
    if not port:
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise RedisURLError(f"{_shown(url)}: {port!r} is not a port number (in {item!r})")
    return host, int(port)


def redacted_url(url: str) -> str:
    """The URL as it may appear in a message or a log: its password replaced by ***."""
    scheme, sep, rest = url.partition("://")
    credentials, at, hosts = rest.partition("@")
    if at and ":" in credentials:
        rest = f"{credentials.split(':', 1)[0]}:***@{hosts}"
    return f"{scheme}{sep}{rest}"


def _shown(url: str) -> str:
    return repr(redacted_url(url))


def socket_timeout(client: Any) -> float | None:
    """The socket timeout of `client`'s connections (a plain, Sentinel or cluster client)."""
    timeout: float | None = client.get_connection_kwargs().get("socket_timeout")
    return timeout
