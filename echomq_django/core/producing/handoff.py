"""Hand-offs: the end of a workflow's member bound for another queue, delivered there.

The script that ends a member delivers its result (or failure) to the steps
of its own queue in the same call (lua/includes/workflow.lua). A step in
another queue, on a Redis Cluster maybe another slot, cannot be written from
that call: the end is pushed to the member's queue's `handoff` list instead,
and delivered from there by deliverWorkflow, which counts an end once however
often it comes. A worker delivers right after writing such an end; every
sweep delivers what is left (the worker died, Redis went away), and so do
Queue.cancel and Queue.remove, whose cascade may hand ends off.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from redis.client import NEVER_DECODE

from ..defaults import WORKFLOW_DELIVERIES_PER_CALL
from ..protocol.codec import decode_stored
from ..protocol.keys import QueueKeys
from ..protocol.script_args import script_argv, script_argv_each
from ..protocol.scripts import Scripts

# Ends read from a handoff list, and delivered, per step.
HANDOFFS_PER_CALL = 100
_BASE = re.compile(r"^(.+):\{(.+)\}:$")  # a queue's key base, "<prefix>:{<queue>}:"
logger = logging.getLogger("echomq.workflow")


def deliver_handoffs(scripts: Scripts, keys: QueueKeys, now: int, *, limit: int = 10_000) -> int:
    """Deliver the ends the members of `keys`' queue handed to other queues (`now`: ms); how many.

    Each is delivered before it leaves the list, so a deliverer that dies
    between leaves it for the next (a worker after its next such finish, the
    sweep); delivering one twice counts it once. A delivered failure that
    fails a step of the target queue hands that step's end on from there:
    the target queues' lists are delivered next, so a failure crosses every
    queue of its workflow in one call instead of one sweep a hop.
    """
    client, delivered = scripts.client, 0
    todo, listed = [keys], {keys.base}  # the queues whose lists are to be read, in order
    while todo and delivered < limit:
        keys = todo[0]
        # Read as the bytes Redis holds, so each is removed by them: text another client wrote that is not
        # UTF-8 reads as replacement characters, which would never match it.
        raw = client.execute_command("LRANGE", keys.handoff, 0, HANDOFFS_PER_CALL - 1, **{NEVER_DECODE: True})
        if not raw:
            listed.discard(todo.pop(0).base)
            continue
        by_target: dict[str, list[list[Any]]] = defaultdict(list)
        for message in raw:
            if (end := _end(message)) is None:
                logger.warning("queue %s: a hand-off that is not one was dropped: %.200r", keys.queue, message)
                continue  # not a hand-off: it only leaves the list
            prefix, *rest = end
            by_target[prefix].append(rest)
        for prefix, ends in by_target.items():
            if (match := _BASE.match(prefix)) is None:
                continue
            target_keys = QueueKeys(match.group(2), match.group(1))
            args = script_argv("deliverWorkflow-5", prefix=target_keys.base, now=now)
            for target, slot, kind, passed, value, origin in ends:
                args += script_argv_each("deliverWorkflow-5", target=target, slot=slot, kind=kind, passed=passed,
                                         value=value, origin=origin)
            scripts.run_batch([("deliverWorkflow-5", target_keys.for_script("deliverWorkflow-5"), args)],
                              raise_on_error=True)
            if target_keys.base not in listed and any(not passed for *_, passed, _, _ in ends):
                listed.add(target_keys.base)  # (only a failure can fail a step there, and hand its end on)
                todo.append(target_keys)
        pipe = client.pipeline(transaction=False)
        for message in raw:
            pipe.lrem(keys.handoff, 1, message)
        removed = pipe.execute()
        delivered += len(raw)
        if not any(removed):  # another deliverer took these meanwhile: what follows them is its to deliver
            listed.discard(todo.pop(0).base)
    return delivered


def _end(message: Any) -> list[Any] | None:
    """A hand-off entry as its seven values, or None for anything else (another client's, a corrupt one).

    Checked before anything is delivered: one entry the script or Redis
    cannot take would make every delivery of the list raise, and stay at its
    head, blocking every hand-off of the queue for good.
    """
    try:  # delivered even with bytes that are not UTF-8 (as replacement characters): an end is never dropped
        end = decode_stored(message.decode(errors="replace") if isinstance(message, bytes) else message)
    except (ValueError, TypeError):
        return None
    if not (isinstance(end, list) and len(end) == 7 and end[4] in (0, 1) and not isinstance(end[4], bool)
            and all(isinstance(part, str) for index, part in enumerate(end) if index != 4)
            and _BASE.match(end[0])):
        return None
    return end


def hands_off(ends: Iterable[tuple[str | None, bool]], keys: QueueKeys) -> bool:
    """Whether the ends of these jobs, written in one call (each its `nxt` field, and whether it failed for
    good), may have left ends in a `handoff` list: an edge to another queue; a failure reaching a later step,
    whose own edges it follows (they may lead there, or go past the call's budget); edges in pages (kind
    "f"), handed on a page at a time; or more edges in this queue than one call delivers
    (WORKFLOW_DELIVERIES_PER_CALL, includes/workflow.lua)."""
    local = 0
    for nxt, failed in ends:
        if not nxt:
            continue  # no workflow's member
        try:
            edges = decode_stored(nxt)
            for edge in edges:
                if edge[0] != keys.base or edge[3] == "f" or (
                        failed and edge[3] == "r" and not edge[1].startswith("wf:")):
                    return True
            local += len(edges)
        except (ValueError, TypeError, IndexError, KeyError, AttributeError):
            continue
    return local > WORKFLOW_DELIVERIES_PER_CALL
