"""Calling the scripts: one at a time, or pipelined in batches with confirmation and re-sends.

Each script is registered once per Redis client with redis-py's
`register_script`, which sends EVALSHA and falls back to loading the script on
NOSCRIPT, so a `SCRIPT FLUSH` or a restarted Redis is invisible to callers.
Batches (`run_batch`, `run_confirmed`) do the same for every call in them and,
on a cluster, follow a slot to its new owner.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import hiredis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, ConnectionError, MovedError, NoScriptError, ResponseError, TryAgainError
from redis.retry import Retry

from . import defaults
from .connection import UNREACHABLE
from .errors import QueueStateError
from .lua import script_names, script_source

# One script call: (script name, KEYS, ARGV).
Call = tuple[str, Sequence[str], Sequence[Any]]
# Replies that mean "this node does not own the slot (any more)": the command
# did nothing, and the cluster's map must be read again.
_ROUTING_ERRORS = (MovedError, ClusterDownError, TryAgainError)
# How long a batch keeps looking for the owner of its slot on a cluster, about
# as long as connect()'s retries wait for a failover.
_REROUTE_S = 15.0
# An own connection idle this long is checked before a call: Redis may have closed it (its `timeout`),
# which the pool finds out by the same check on every checkout.
_IDLE_CHECK_S = 1.0


def _closed(connection: Any) -> bool:
    """Whether Redis closed this connection (or left a stray reply on it): readable while nothing was asked."""
    try:
        return bool(connection.can_read(timeout=0))
    except (*UNREACHABLE, OSError):
        return True


@dataclass(frozen=True)
class Confirm:
    """Count writes as done only once `replicas` replicas have them (Redis WAIT), waiting up to `timeout_ms`."""

    replicas: int
    timeout_ms: int = defaults.CONFIRM_TIMEOUT_MS



class _OwnConnection(threading.local):
    """One thread's own connection to a plain (not cluster) Redis, and the process that made it."""

    connection: Any = None
    pid = 0
    client_id: int | None = None  # its id in Redis (CLIENT ID), once asked for
    busy = False  # a call is on it: one made meanwhile on this thread (a signal handler's) takes the pool's
    used_at = 0.0  # time.monotonic() of its latest call


class Wait:
    """A worker's blocking waits (`ScriptClient.wait_then_run`), which another thread may cut short for good.

    A cut closes the writing half of the connection: Redis, reading the end of
    the commands, drops the client with the wait and the calls behind it
    still pending; the replies of calls it ran just before still arrive. A
    wait that ends without them owes an answer all the same (a proxy on the
    way may drop a reply in flight): the caller asks again, as after any
    lost reply.
    """

    def __init__(self) -> None:
        # Reentrant: stop() cuts from a signal handler, which may run on the waiting thread inside _begin.
        self._lock = threading.RLock()
        self._connection: Any = None  # the connection a wait is blocked on now
        self.cut_short = False

    def cut(self) -> None:
        """End the wait in progress, if any, and every later one before it starts; needs no word from Redis."""
        with self._lock:
            self.cut_short = True
            connection = self._connection
        sock = getattr(connection, "_sock", None)  # redis-py's socket
        if sock is not None:
            try:
                # The plain socket's shutdown, also for TLS: ssl.SSLSocket's would drop the TLS
                # state, and the replies still coming would be read as plain text.
                socket.socket.shutdown(sock, socket.SHUT_WR)
            except OSError:
                pass  # closed meanwhile

    def _begin(self, connection: Any) -> bool:
        with self._lock:
            self._connection = None if self.cut_short else connection
            return not self.cut_short

    def _end(self) -> None:
        with self._lock:
            self._connection = None


class ScriptClient:
    """The protocol's scripts registered on one client, and the ways to call them.

    On a plain or Sentinel client each thread sends its calls on a connection
    of its own, built and connected as the client's pool builds its own, but
    held outside it. redis-py spends about as much of the client's CPU around
    each command as the round trip itself costs (its pool's check for a stale
    reply is a system call; its wrappers for retries and metrics), which is
    what every single add from a web request and every round trip of a worker
    paid. A connection error is retried as the client's Retry says, as the
    client would: a call it may have delivered is sent again, which every
    script is written to allow. A cluster client keeps redis-py's way (and
    its routing).
    """

    def __init__(self, client: Any, *, reroute_s: float = _REROUTE_S) -> None:
        """`reroute_s`: how long a batch on a cluster keeps looking for the new owner of its slot."""
        self.client = client
        self.reroute_s = reroute_s
        self._scripts = {name: client.register_script(script_source(name)) for name in script_names()}
        self._own = None if isinstance(client, RedisCluster) else _OwnConnection()
        self._retry: Retry | None = None  # the client's retry policy, for calls on the own connections

    def _own_free(self) -> bool:
        """Whether this thread's own connection can take a call: not a cluster, nor in the middle of one."""
        return self._own is not None and not self._own.busy

    def _direct(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Each command's reply (an error reply as its exception), sent on this thread's own connection.

        A connection error is retried as the client's own policy says (its
        Retry: how often, how long between), the commands sent again on a
        new connection; the last one is raised. (The connection itself tries
        each connect and health check once: retries inside retries would
        multiply the time a call may take, past ENQUEUE_TIMEOUT.)
        """
        if self._retry is None:
            pool = self.client.connection_pool
            self._retry = pool.connection_class(**pool.connection_kwargs).retry  # the client's own (unconnected)
        return self._retry.call_with_retry(lambda: self._attempt(commands), lambda _error: None)

    def _attempt(self, commands: Sequence[tuple[Any, ...]], replies: list[Any] | None = None) -> list[Any]:
        """`_direct` without retries: one sending of the commands; their replies, appended to `replies` as read."""
        own = self._own
        assert own is not None
        replies = [] if replies is None else replies
        connection = None
        own.busy = True  # from the connect on: its handshake is a call too
        try:
            connection = self._connection()
            if time.monotonic() - own.used_at > _IDLE_CHECK_S and _closed(connection):
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
            own.busy = False
            own.used_at = time.monotonic()

    def _connection(self) -> Any:
        """This thread's own connection (see the class), connected: made on first use, and again in a forked child."""
        own = self._own
        assert own is not None
        if own.connection is None or own.pid != os.getpid():  # none yet, or the parent's, inherited by a fork
            # Built as the pool builds its own (class, options), outside its count and its list.
            pool = self.client.connection_pool
            options = {**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0)}  # see _direct
            own.connection, own.pid = pool.connection_class(**options), os.getpid()
            own.client_id = None
            own.connection.register_connect_callback(self._forget_client_id)  # a reconnect gets a new id
        if own.connection._sock is None:
            # Connected as its pool connects it: a Sentinel's connection asks for the primary's address
            # here (sending on an unconnected one would go to its default address instead).
            own.connection.connect()
        return own.connection

    @property
    def waits_then_runs(self) -> bool:
        """Whether `wait_then_run` can be used (not on a cluster)."""
        return self._own is not None

    def client_id(self) -> int:
        """The id Redis gives this thread's own connection (for CLIENT UNBLOCK), asked again after a reconnect."""
        own = self._own
        assert own is not None, "a cluster client has no connection of its own (waits_then_runs)"
        connection = self._connection()
        if own.client_id is None:
            connection.send_command("CLIENT", "ID")
            own.client_id = int(connection.read_response())
        return own.client_id

    def _forget_client_id(self, _connection: Any) -> None:
        assert self._own is not None
        self._own.client_id = None

    def wait_then_run(
        self, marker: str, timeout_s: float, calls: Sequence[Call], confirm: Confirm | None, wait: Wait | None,
        *, unblock: int | None = None,
    ) -> tuple[Any, list[Any], int] | None:
        """Block until `marker` (a ZSET) has a member to pop or `timeout_s` passes, then run `calls`: one round trip.

        Redis runs the calls the moment the wait ends, and both answers come
        back together, where a wait and then a call would each cost the
        waiting process a wake-up. Returns (the wait's reply, the calls'
        replies, replicas that confirmed) as `run_confirmed` does, or None
        when this client cannot (a cluster: wait on a connection of its own).
        A wait cut short (`wait.cut()`) without the replies, like a lost
        connection, raises ConnectionError: whether the calls ran is unknown,
        as after any lost reply. `unblock`: a client id whose blocking call to
        end first (CLIENT UNBLOCK ... ERROR).
        """
        if not self._own_free():
            return None
        connection = self._connection()  # connected now, so that a cut has a socket to shut down whenever it comes
        commands = [("BZPOPMIN", marker, timeout_s), *self._commands(calls, confirm)]
        if unblock is not None:
            commands.insert(0, ("CLIENT", "UNBLOCK", unblock, "ERROR"))
        if wait is not None and not wait._begin(connection):
            raise ConnectionError("the wait was cut short before it began")
        try:
            replies = self._attempt(commands)  # once: a wait cut short must not begin again
        except Exception as error:
            if wait is not None and wait.cut_short:
                raise ConnectionError(f"the wait was cut short ({error!r})") from error
            raise
        finally:
            if wait is not None:
                wait._end()
                if wait.cut_short:
                    connection.disconnect()  # its writing half is closed
        if unblock is not None:
            replies.pop(0)
        woken, *answers = replies
        if any(isinstance(answer, NoScriptError) for answer in answers):
            # The scripts were flushed (a restart): they ran nowhere, so they are simply sent again.
            replies, acked = self._send(calls, confirm, False)
            return woken, replies, acked
        calls_replies, acked = self._answers(answers, confirm)
        return woken, calls_replies, acked

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = self._scripts[name]
        try:
            if self._own_free():
                [reply] = self._direct([("EVALSHA", script.sha, len(keys), *keys, *args)])
                if not isinstance(reply, NoScriptError):  # NOSCRIPT: redis-py's path below loads the script
                    if isinstance(reply, Exception):
                        raise reply
                    return reply
            for _ in range(2):
                try:
                    return script(keys=list(keys), args=list(args), client=self.client)
                except NoScriptError:
                    # redis-py reloads once on NOSCRIPT; a SCRIPT FLUSH racing that reload
                    # surfaces here, and one more round settles it.
                    continue
            return script(keys=list(keys), args=list(args), client=self.client)
        except ResponseError as error:
            if "echomq wrong type" in str(error):
                raise QueueStateError(str(error).removeprefix("echomq ")) from error
            raise

    def run_batch(self, calls: Sequence[Call], *, raise_on_error: bool = False) -> list[Any]:
        """Run several script calls of one queue in one pipelined round trip; their replies in order.

        A call that failed comes back as its exception, or with
        `raise_on_error` the first such exception is raised. The calls must
        all touch one queue: on a cluster they go, in one pipeline, to the
        node that owns the queue's slot.
        """
        replies, _acked = self._send(calls, None, raise_on_error)
        return replies

    def run_confirmed(
        self, calls: Sequence[Call], confirm: Confirm | None, *, raise_on_error: bool = False,
    ) -> tuple[list[Any], int]:
        """`run_batch` followed by WAIT: (replies, how many replicas confirmed the writes).

        WAIT confirms the writes made on its own connection, and a pipeline
        is one connection, so the WAIT simply ends the pipeline. Without
        `confirm` there is no WAIT, and the count is 0.
        """
        return self._send(calls, confirm, raise_on_error)

    def _send(self, calls: Sequence[Call], confirm: Confirm | None, raise_on_error: bool) -> tuple[list[Any], int]:
        # Calls refused with NOSCRIPT (after a SCRIPT FLUSH, a restart or a
        # failover) or, on a cluster, with MOVED (the slot has a new owner) did
        # nothing, so they are sent again: after loading the script, or after
        # reading the cluster's map again.
        cluster = isinstance(self.client, RedisCluster)
        if cluster and len({self.client.keyslot(keys[0]) for _name, keys, _args in calls}) > 1:
            raise ValueError("a batch of script calls must stay within one queue (one cluster slot)")
        replies: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        acked: int | None = None  # the fewest replicas any round's writes reached
        reloads, deadline, pause = 0, time.monotonic() + self.reroute_s, 0.05
        while pending:
            try:
                answers, round_acked = self._pipelined([calls[i] for i in pending], confirm)
            except UNREACHABLE:
                # A plain client has already retried; a cluster's pipeline to a dead
                # node has not, and a failover takes seconds: wait, look again.
                if not cluster or time.monotonic() > deadline:
                    raise
                pause = self._reread_map(pause)
                continue
            acked = round_acked if acked is None else min(acked, round_acked)
            refused = [i for i, reply in zip(pending, answers) if isinstance(reply, NoScriptError)]
            moved = [i for i, reply in zip(pending, answers) if cluster and isinstance(reply, _ROUTING_ERRORS)]
            for i, reply in zip(pending, answers):
                replies[i] = reply
            if refused and reloads < 2:
                reloads += 1
                for name in {calls[i][0] for i in refused}:
                    self.client.script_load(self._scripts[name].script)
            else:
                refused = []
            if moved and time.monotonic() < deadline:
                pause = self._reread_map(pause)
            else:
                moved = []
            pending = sorted(refused + moved)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
        return replies, acked or 0

    def _pipelined(self, calls: Sequence[Call], confirm: Confirm | None) -> tuple[list[Any], int]:
        """One pipeline of `calls`, ended by a WAIT with `confirm`: (replies, replicas the WAIT counted)."""
        client = self.client
        if isinstance(client, RedisCluster):
            # Straight to the node that owns the queue's slot: redis-py's cluster
            # pipeline refuses EVALSHA and retries a dead node without pausing,
            # which is over long before a failover is.
            client = client.get_redis_connection(client.get_node_from_key(calls[0][1][0]))
        if self._own_free():
            return self._answers(self._direct(self._commands(calls, confirm)), confirm)
        pipe = client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
        if confirm is None:
            return pipe.execute(raise_on_error=False), 0
        pipe.execute_command("WAIT", confirm.replicas, confirm.timeout_ms)
        *answers, acked = pipe.execute(raise_on_error=False)
        return answers, acked if isinstance(acked, int) else 0

    def _commands(self, calls: Sequence[Call], confirm: Confirm | None) -> list[tuple[Any, ...]]:
        """The EVALSHA commands of `calls`, and a WAIT after them with `confirm`."""
        commands: list[tuple[Any, ...]] = [("EVALSHA", self._scripts[name].sha, len(keys), *keys, *args)
                                           for name, keys, args in calls]
        if confirm is not None:
            commands.append(("WAIT", confirm.replicas, confirm.timeout_ms))
        return commands

    @staticmethod
    def _answers(replies: list[Any], confirm: Confirm | None) -> tuple[list[Any], int]:
        """(the calls' replies, replicas the WAIT counted) from the replies of `_commands`."""
        if confirm is None:
            return replies, 0
        *answers, acked = replies
        return answers, acked if isinstance(acked, int) else 0

    def _reread_map(self, pause: float) -> float:
        """Pause, then ask the cluster again which node owns which slot; returns the next, longer pause."""
        time.sleep(pause)
        try:
            self.client.nodes_manager.initialize()
        except UNREACHABLE:
            pass  # the failover is still under way; the next round tries again
        return min(pause * 2, 1.0)
