"""Redis clients configured the way the queue needs them."""

from __future__ import annotations

import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError
from redis.retry import Retry

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def connect(url: str = DEFAULT_REDIS_URL, **options: object) -> redis.Redis:
    """A client for `url` that decodes replies to str and rides out short outages.

    Commands are retried with exponential backoff (up to about 15 s in all) on
    connection errors, so a restarting Redis is survived without the caller
    noticing; the scripts are written so that a re-sent call is harmless.
    Workers block on the marker for less than the socket timeout (10 s).
    """
    settings: dict[str, object] = {
        "decode_responses": True,
        # Bytes that are not UTF-8 (a pickle written by some other client) are
        # shown with replacement characters, never decoded as anything else.
        "encoding_errors": "replace",
        "socket_timeout": 10.0,
        "socket_connect_timeout": 5.0,
        "health_check_interval": 30,
        "retry": Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=12),
        "retry_on_error": [ConnectionError, TimeoutError],
    }
    settings.update(options)
    return redis.Redis.from_url(url, **settings)
