"""Calling the scripts: one at a time, or pipelined in batches with confirmation and re-sends.

Each script is registered once per Redis client with redis-py's
`register_script`. A call sends EVALSHA and, refused with NOSCRIPT, loads the
script and sends it again, so a `SCRIPT FLUSH` or a restarted Redis is
invisible to callers. Batches (`run_batch`, `run_confirmed`) do the same for
every call in them, without asking Redis first (a redis-py pipeline of Script
calls sends SCRIPT EXISTS on every execute), and on a cluster follow a slot
to its new owner.

The calls reach a plain or Sentinel Redis on each thread's own connection
(own_connections.py: the fast path, on by default), or, with that switched
off (`own_connections=False`, or ECHOMQ_OWN_CONNECTIONS=0), through the
client's pool and pipelines, redis-py's public API only. A cluster client
always takes the pool's way (and its routing).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, ConnectionError, MovedError, NoScriptError, ResponseError, TryAgainError

from .. import defaults
from ..errors import QueueStateError
from .connection import UNREACHABLE, require_text_replies
from .lua import script_names, script_source
from .own_connections import OwnConnections

# One script call: (script name, KEYS, ARGV).
Call = tuple[str, Sequence[str], Sequence[Any]]
# Replies that mean "this node does not own the slot (any more)": the command
# did nothing, and the cluster's map must be read again.
_ROUTING_ERRORS = (MovedError, ClusterDownError, TryAgainError)
# How long a batch keeps looking for the owner of its slot on a cluster, about
# as long as connect()'s retries wait for a failover.
_REROUTE_S = 15.0
# The switch of the fast path (own_connections.py): "0" turns it off, "1" (the default) on.
OWN_CONNECTIONS_ENV = "ECHOMQ_OWN_CONNECTIONS"
# On the pool's connections nothing can end a wait early: one that a Wait may cut lasts at most this long.
POOL_WAIT_STEP_S = 1.0


def own_connections_wanted() -> bool:
    """Whether the environment asks for the fast path (ECHOMQ_OWN_CONNECTIONS: 1, the default, or 0)."""
    value = os.environ.get(OWN_CONNECTIONS_ENV, "1")
    if value not in ("0", "1"):
        raise ValueError(f"{OWN_CONNECTIONS_ENV} must be 1 (each thread's own connection, the default) "
                         f"or 0 (the client's pool), not {value!r}")
    return value == "1"


@dataclass(frozen=True)
class Confirm:
    """Count writes as done only once `replicas` replicas have them (Redis WAIT), waiting up to `timeout_ms`."""

    replicas: int
    timeout_ms: int = defaults.CONFIRM_TIMEOUT_MS


class Wait:
    """A worker's blocking waits (`ScriptClient.wait_then_run`), which another thread may cut short for good.

    On a thread's own connection a cut ends the wait in progress at once (see
    OwnConnections.send_once); on the pool's it ends within POOL_WAIT_STEP_S.
    A wait that ends without its replies owes an answer all the same (a
    proxy on the way may drop a reply in flight): the caller asks again, as
    after any lost reply.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._end_now: Callable[[], None] | None = None  # what ends the wait in progress early, where one can
        self.cut_short = False

    def cut(self) -> None:
        """End the wait in progress, if any, and every later one before it starts; needs no word from Redis."""
        with self._lock:
            self.cut_short = True
            end_now, self._end_now = self._end_now, None
        if end_now is not None:
            end_now()

    def _begin(self, end_now: Callable[[], None] | None) -> bool:
        """Whether a wait may begin (not cut); `end_now` ends it early, called by a cut meanwhile."""
        with self._lock:
            self._end_now = None if self.cut_short else end_now
            return not self.cut_short

    def _end(self) -> None:
        with self._lock:
            self._end_now = None


class _HeldClient(threading.local):
    """One thread's client holding one of the pool's connections, for its waits (pool path), and its process."""

    client: Any = None
    pid = 0


class ScriptClient:
    """The protocol's scripts registered on one client, and the ways to call them."""

    def __init__(self, client: Any, *, reroute_s: float = _REROUTE_S, own_connections: bool | None = None) -> None:
        """`reroute_s`: how long a batch on a cluster keeps looking for the new owner of its slot.

        `own_connections`: whether a plain or Sentinel client's calls take the
        fast path (see the module); None asks ECHOMQ_OWN_CONNECTIONS.
        """
        require_text_replies(client)
        self.client = client
        self.reroute_s = reroute_s
        self._scripts = {name: client.register_script(script_source(name)) for name in script_names()}
        cluster = isinstance(client, RedisCluster)
        if own_connections is None:
            own_connections = own_connections_wanted()
        self._own = OwnConnections(client) if own_connections and not cluster else None
        self._held = None if cluster else _HeldClient()

    @property
    def own_connections(self) -> bool:
        """Whether the calls take the fast path (each thread's own connection)."""
        return self._own is not None

    @property
    def waits_then_runs(self) -> bool:
        """Whether `wait_then_run` can be used (not on a cluster)."""
        return self._held is not None

    def client_id(self) -> int:
        """The id Redis gives the connection this thread's waits block on (for CLIENT UNBLOCK).

        On the pool path it is asked each time: the connection may have been
        made anew since.
        """
        if self._own is not None:
            return self._own.client_id()
        return int(self._held_client().client_id())

    def _held_client(self) -> Any:
        """This thread's client for its waits on the pool path: one of the pool's connections, kept, so that
        `client_id` names it; made again in a forked child."""
        held = self._held
        assert held is not None, "a cluster client has no connection to wait on (waits_then_runs)"
        if held.client is None or held.pid != os.getpid():
            held.client = redis.Redis(connection_pool=self.client.connection_pool, single_connection_client=True)
            held.pid = os.getpid()
        return held.client

    def wait_then_run(
        self, marker: str, timeout_s: float, calls: Sequence[Call], confirm: Confirm | None, wait: Wait | None,
        *, unblock: int | None = None,
    ) -> tuple[Any, list[Any], int] | None:
        """Block until `marker` (a ZSET) has a member to pop or `timeout_s` passes, then run `calls`.

        Returns (the wait's reply: the popped [key, member, score], None, or
        an error reply as its exception; the calls' replies; replicas that
        confirmed) as `run_confirmed` does, or None when this client cannot
        (a cluster). On the fast path the wait and the calls are one round
        trip: Redis runs the calls the moment the wait ends, and both answers
        come back together, where a wait and then a call would each cost the
        waiting process a wake-up. On the pool path the calls follow the
        wait, and a wait that `wait` may cut lasts at most POOL_WAIT_STEP_S.
        A wait cut short (`wait.cut()`) without the replies, like a lost
        connection, raises ConnectionError: whether the calls ran is unknown,
        as after any lost reply. `unblock`: a client id whose blocking call to
        end first (CLIENT UNBLOCK ... ERROR).
        """
        if not self.waits_then_runs:
            return None
        if self._own is not None and self._own.free():
            return self._wait_then_run_own(marker, timeout_s, calls, confirm, wait, unblock)
        return self._wait_then_run_pooled(marker, timeout_s, calls, confirm, wait, unblock)

    def _wait_then_run_own(
        self, marker: str, timeout_s: float, calls: Sequence[Call], confirm: Confirm | None, wait: Wait | None,
        unblock: int | None,
    ) -> tuple[Any, list[Any], int]:
        assert self._own is not None
        commands = [("BZPOPMIN", marker, timeout_s), *self._commands(calls, confirm)]
        if unblock is not None:
            commands.insert(0, ("CLIENT", "UNBLOCK", unblock, "ERROR"))
        try:
            replies = self._own.send_once(commands, wait)  # once: a wait cut short must not begin again
        except Exception as error:
            if wait is not None and wait.cut_short:
                raise ConnectionError(f"the wait was cut short ({error!r})") from error
            raise
        if unblock is not None:
            replies.pop(0)
        woken, *answers = replies
        if any(isinstance(answer, NoScriptError) for answer in answers):
            # The scripts were flushed (a restart): they ran nowhere, so they are simply sent again.
            replies, acked = self._send(calls, confirm, False)
            return woken, replies, acked
        calls_replies, acked = self._answers(answers, confirm)
        return woken, calls_replies, acked

    def _wait_then_run_pooled(
        self, marker: str, timeout_s: float, calls: Sequence[Call], confirm: Confirm | None, wait: Wait | None,
        unblock: int | None,
    ) -> tuple[Any, list[Any], int]:
        if wait is not None:
            if not wait._begin(None):
                raise ConnectionError("the wait was cut short before it began")
            timeout_s = min(timeout_s, POOL_WAIT_STEP_S)
        try:
            if unblock is not None:
                self.client.client_unblock(unblock, error=True)
            try:
                woken = self._held_client().bzpopmin(marker, timeout=timeout_s)
            except ResponseError as error:  # UNBLOCKED (a failover, or another thread's CLIENT UNBLOCK)
                woken = error
        finally:
            if wait is not None:
                wait._end()
        if wait is not None and wait.cut_short:
            # The calls are not sent (a marker the wait took is lost: other workers wake at their timeout).
            raise ConnectionError("the wait was cut short")
        replies, acked = self._send(calls, confirm, False) if calls else ([], 0)
        return (list(woken) if isinstance(woken, tuple) else woken), replies, acked

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = self._scripts[name]
        try:
            if self._own is not None and self._own.free():
                [reply] = self._own.send([("EVALSHA", script.sha, len(keys), *keys, *args)])
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
        commands = self._commands(calls, confirm)
        if self._own is not None and self._own.free():
            return self._answers(self._own.send(commands), confirm)
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return self._answers(pipe.execute(raise_on_error=False), confirm)

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
