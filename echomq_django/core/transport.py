"""Calling the scripts: one at a time, or pipelined in batches with confirmation and re-sends.

Each script is registered once per Redis client with redis-py's
`register_script`, which sends EVALSHA and falls back to loading the script on
NOSCRIPT, so a `SCRIPT FLUSH` or a restarted Redis is invisible to callers.
Batches (`run_batch`, `run_confirmed`) do the same for every call in them and,
on a cluster, follow a slot to its new owner.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, MovedError, NoScriptError, ResponseError, TryAgainError

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


@dataclass(frozen=True)
class Confirm:
    """Count writes as done only once `replicas` replicas have them (Redis WAIT), waiting up to `timeout_ms`."""

    replicas: int
    timeout_ms: int = defaults.CONFIRM_TIMEOUT_MS



class ScriptClient:
    """The protocol's scripts registered on one client, and the ways to call them."""

    def __init__(self, client: Any, *, reroute_s: float = _REROUTE_S) -> None:
        """`reroute_s`: how long a batch on a cluster keeps looking for the new owner of its slot."""
        self.client = client
        self.reroute_s = reroute_s
        self._scripts = {name: client.register_script(script_source(name)) for name in script_names()}

    def _run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        script = self._scripts[name]
        try:
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
        pipe = client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
        if confirm is None:
            return pipe.execute(raise_on_error=False), 0
        pipe.execute_command("WAIT", confirm.replicas, confirm.timeout_ms)
        *answers, acked = pipe.execute(raise_on_error=False)
        return answers, acked if isinstance(acked, int) else 0

    def _reread_map(self, pause: float) -> float:
        """Pause, then ask the cluster again which node owns which slot; returns the next, longer pause."""
        time.sleep(pause)
        try:
            self.client.nodes_manager.initialize()
        except UNREACHABLE:
            pass  # the failover is still under way; the next round tries again
        return min(pause * 2, 1.0)
