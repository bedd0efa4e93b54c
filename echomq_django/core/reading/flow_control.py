"""Reading a queue's flow control as it stands: its rate limit's window, a RateLimited pause, its groups.

The limits themselves are decided in moveToActive (docs/protocol.md, "Flow
control" and "Groups"); this only reads, for the dashboard and the status.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import MAX_RETRY_AFTER_S
from ..producing.queue import Queue
from ..protocol.scripts import RateLimit
from ..protocol.times import now_ms


@dataclass(frozen=True)
class GroupState:
    name: str
    waiting: int
    active: int


@dataclass(frozen=True)
class FlowState:
    started_in_window: int | None  # attempts started in the rate limit's window now; None without a limit
    paused_for_ms: int  # how long a RateLimited pause still holds every worker (0: none)
    groups_waiting: int  # groups with jobs waiting
    groups_active: int  # groups with jobs running
    top_groups: list[GroupState] = field(default_factory=list)  # the most waiting jobs first


def flow_state(queue: Queue, rate_limit: RateLimit | None = None, top: int = 10) -> FlowState:
    """The queue's flow control now: two round trips, none of them a scan.

    The window and the pause are kept on Redis's clock and read here with this
    host's, so a skew between the two shifts them by as much.
    """
    client, keys = queue.client, queue.keys
    now = now_ms()
    pipe = client.pipeline(transaction=False)
    if rate_limit:
        pipe.zcount(keys.limiter, f"({now - rate_limit.duration_ms}", "+inf")
    pipe.hget(keys.meta, "limitedUntil")
    pipe.zcard(keys.group_waiting)
    pipe.hlen(keys.group_active)
    pipe.zrevrange(keys.group_waiting, 0, top - 1, withscores=True)
    replies = pipe.execute()
    started = int(replies.pop(0)) if rate_limit else None
    limited_until, waiting_groups, active_groups, ranked = replies
    names = [name for name, _ in ranked]
    active = client.hmget(keys.group_active, names) if names else []
    # As moveToActive reads the pause: a whole number of ms at most a day ahead, else another client's value.
    paused_for = _whole(limited_until) - now
    if not 0 < paused_for <= MAX_RETRY_AFTER_S * 1000:
        paused_for = 0
    return FlowState(started, paused_for, int(waiting_groups), int(active_groups),
                     [GroupState(name, int(waiting), _whole(running))
                      for (name, waiting), running in zip(ranked, active)])


def _whole(raw: str | None) -> int:
    """A counter as the scripts keep it; anything but a whole number (another client's value) is 0."""
    try:
        return int(raw or 0)
    except ValueError:
        return 0
