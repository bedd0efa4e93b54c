"""The fast path to a plain or Sentinel Redis: each thread's calls on a connection of its own, outside the pool.

redis-py spends about as much of the client's CPU around each command as the
round trip itself costs (the pool's check for a stale reply is a system
call; its wrappers for retries and metrics), which every single add from a
web request and every round trip of a worker pays. `OwnConnections` skips
that: each thread gets one connection, built and connected as the client's
pool builds its own, but held outside it, and sends its commands packed in
one write. It is the one place in the package that uses redis-py's internals
(the pool's connection options, a connection's socket and its raw send and
read), which hold for the redis-py versions pyproject.toml allows;
`tests/system/test_packaging.py` keeps every other module to the public API. It can
be switched off (`ScriptClient(own_connections=False)`, or the environment
variable ECHOMQ_OWN_CONNECTIONS=0): the calls then go through the pool.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import hiredis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, ResponseError
from redis.retry import Retry

from .connection import UNREACHABLE

# A connection idle this long is checked before a call: Redis may have closed it (its `timeout`),
# which the pool finds out by the same check on every checkout.
_IDLE_CHECK_S = 1.0


class Cuttable(Protocol):
    """What a wait on an own connection needs of transport.Wait: whether it was cut, and a hook for a cut."""

    cut_short: bool

    def _begin(self, end_now: Callable[[], None] | None) -> bool: ...

    def _end(self) -> None: ...


class _Thread(threading.local):
    """One thread's own connection, and the process that made it."""

    connection: Any = None
    pid = 0
    client_id: int | None = None  # its id in Redis (CLIENT ID), once asked for
    busy = False  # a call is on it: one made meanwhile on this thread (a signal handler's) must not use it
    used_at = 0.0  # time.monotonic() of its latest call


class OwnConnections:
    """Each thread's own connection to the Redis of `client` (plain or Sentinel, not a cluster).

    A connection error is retried as the client's Retry says, as the client
    would: a call it may have delivered is sent again, which every script is
    written to allow.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._thread = _Thread()
        pool = client.connection_pool
        self._retry: Retry = pool.connection_class(**pool.connection_kwargs).retry  # the client's own (unconnected)

    def free(self) -> bool:
        """Whether this thread's connection can take a call (not in the middle of one: a signal handler's call)."""
        return not self._thread.busy

    def send(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Each command's reply (an error reply as its exception), all sent in one write.

        A connection error is retried as the client's own policy says (its
        Retry: how often, how long between), the commands sent again on a
        new connection; the last one is raised. (The connection itself tries
        each connect and health check once: retries inside retries would
        multiply the time a call may take, past ENQUEUE_TIMEOUT.)
        """
        return self._retry.call_with_retry(lambda: self._attempt(commands), lambda _error: None)

    def send_once(self, commands: Sequence[tuple[Any, ...]], wait: Cuttable | None) -> list[Any]:
        """`send` without retries, for a wait that `wait` may cut short.

        A cut closes the writing half of the connection: Redis, reading the
        end of the commands, drops the client with the wait and the calls
        behind it still pending; the replies of calls it ran just before
        still arrive. The connection is closed after a cut.
        """
        connection = self._connection()  # connected now, so that a cut has a socket to shut down whenever it comes
        if wait is not None and not wait._begin(lambda: self._shut_writing(connection)):
            raise ConnectionError("the wait was cut short before it began")
        try:
            return self._attempt(commands)
        finally:
            if wait is not None:
                wait._end()
                if wait.cut_short:
                    connection.disconnect()  # its writing half is closed

    def client_id(self) -> int:
        """The id Redis gives this thread's connection (for CLIENT UNBLOCK), asked again after a reconnect."""
        thread = self._thread
        connection = self._connection()
        if thread.client_id is None:
            connection.send_command("CLIENT", "ID")
            thread.client_id = int(connection.read_response())
        return thread.client_id

    def _attempt(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """One sending of the commands, on this thread's connection; their replies."""
        thread = self._thread
        replies: list[Any] = []
        connection = None
        thread.busy = True  # from the connect on: its handshake is a call too
        try:
            connection = self._connection()
            if time.monotonic() - thread.used_at > _IDLE_CHECK_S and self._closed(connection):
                connection.disconnect()  # closed by Redis while idle (its `timeout`): a new one, as the pool would
                connection = self._connection()
            # hiredis packs as redis-py does with hiredis installed (a dependency), without its wrapper's copies.
            connection.send_packed_command([b"".join(map(hiredis.pack_command, commands))])
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except ResponseError as error:
                    replies.append(error)
            return replies
        except BaseException:  # an interrupted read too: a reply left unread would answer the next call
            if connection is not None:
                connection.disconnect()
            raise
        finally:
            thread.busy = False
            thread.used_at = time.monotonic()

    def _connection(self) -> Any:
        """This thread's connection, connected: made on first use, and again in a forked child."""
        thread = self._thread
        if thread.connection is None or thread.pid != os.getpid():  # none yet, or the parent's, inherited by a fork
            # Built as the pool builds its own (class, options), outside its count and its list.
            pool = self.client.connection_pool
            options = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}  # see send
            thread.connection, thread.pid = pool.connection_class(**options), os.getpid()
            thread.client_id = None
            thread.connection.register_connect_callback(self._forget_client_id)  # a reconnect gets a new id
        if thread.connection._sock is None:
            # Connected as its pool connects it: a Sentinel's connection asks for the primary's address
            # here (sending on an unconnected one would go to its default address instead).
            thread.connection.connect()
        return thread.connection

    def _forget_client_id(self, _connection: Any) -> None:
        self._thread.client_id = None

    @staticmethod
    def _shut_writing(connection: Any) -> None:
        """Close the writing half of the socket `connection` holds now (a cut: see send_once)."""
        sock = connection._sock  # redis-py's socket (a new one if the call reconnected, say after an idle check)
        if sock is not None:
            try:
                # The plain socket's shutdown, also for TLS: ssl.SSLSocket's would drop the TLS
                # state, and the replies still coming would be read as plain text.
                socket.socket.shutdown(sock, socket.SHUT_WR)
            except OSError:
                pass  # closed meanwhile

    @staticmethod
    def _closed(connection: Any) -> bool:
        """Whether Redis closed this connection (or left a stray reply on it): readable while nothing was asked."""
        try:
            return bool(connection.can_read(timeout=0))
        except (*UNREACHABLE, OSError):
            return True
