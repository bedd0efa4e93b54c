"""The longest script call of a workflow's worst shapes, and how many calls they take (issue 38).

    python bench/workflow_bounds.py [--steps 100000] [--members 200] [--member-kb 400] [--redis-url URL]

Three shapes, each on a fresh queue, on a private redis-server (no persistence, a free
loopback port) unless --redis-url names an idle one:

1. A chain of `--steps` steps whose first step fails for good: the finish, then the
   deliveries that spread the failure (a worker's own `deliver_handoffs`).
2. The same chain cancelled (`WorkflowResult.cancel`).
3. A group of `--members` members of `--member-kb` KB each, added.

For each: the script calls (EVALSHA), Redis's time in them, the longest one (SLOWLOG,
top-level calls only) and the wall time. The target: no call over 50 ms.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.measure import drop, script_time, slowlog_on  # noqa: E402
from echomq_django.core import Chain, Group, JobOptions, Member, Plan, Queue, connect  # noqa: E402
from echomq_django.core.producing.handoff import deliver_handoffs  # noqa: E402
from echomq_django.core.producing.queue import now_ms  # noqa: E402
from tests.helpers import fetch, finish  # noqa: E402
from tests.redis_servers import redis_server  # noqa: E402


def member(queue: Queue, *args: Any) -> Member:
    return Member(queue, "step", {"args": list(args)}, JobOptions(attempts=1))


def failing_chain(client: Any, prefix: str, steps: int) -> Callable[[], Any]:
    queue = Queue("chain", client, prefix=prefix)
    plan = Plan.of(Chain(*[member(queue, n) for n in range(steps)], on_error=member(queue, "handler")))
    plan.add()
    [(first, _)] = fetch(queue)

    def fail() -> int:
        finish(queue, first, "token-1", completed=False, value="boom")
        deliver_handoffs(queue.scripts, queue.keys, now_ms(), limit=10**9)
        failed = queue.client.zcard(queue.keys.failed)
        assert failed == steps, f"{failed} of {steps} steps failed"
        return failed

    return fail


def cancelled_chain(client: Any, prefix: str, steps: int) -> Callable[[], Any]:
    queue = Queue("cancel", client, prefix=prefix)
    plan = Plan.of(Chain(*[member(queue, n) for n in range(steps)], on_error=member(queue, "handler")))
    plan.add()

    def cancel() -> int:
        plan.handle().cancel("bench")
        failed = queue.client.zcard(queue.keys.failed)
        assert failed == steps, f"{failed} of {steps} steps failed"
        return failed

    return cancel


def large_group(client: Any, prefix: str, members: int, member_kb: int) -> Callable[[], Any]:
    queue = Queue("group", client, prefix=prefix)
    blob = "x" * (member_kb * 1024)
    plan = Plan.of(Group(*[member(queue, blob) for _ in range(members)]))
    return plan.add


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=99_999)  # with on_error, the most a workflow has
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--member-kb", type=int, default=400)
    parser.add_argument("--redis-url", help="an idle Redis to use instead of a private redis-server")
    args = parser.parse_args()
    with ExitStack() as stack:
        url = args.redis_url or stack.enter_context(redis_server())
        client = connect(url)
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        shapes = [
            (f"chain of {args.steps:,}, first step fails", lambda: failing_chain(client, prefix, args.steps)),
            (f"chain of {args.steps:,}, cancelled", lambda: cancelled_chain(client, prefix, args.steps)),
            (f"group of {args.members} x {args.member_kb} KB, added",
             lambda: large_group(client, prefix, args.members, args.member_kb)),
        ]
        print(f"{'shape':<40} {'calls':>7} {'Redis ms':>9} {'longest ms':>11} {'wall s':>7}")
        try:
            with slowlog_on(client):
                for label, prepare in shapes:
                    action = prepare()
                    measured, _ = script_time(client, action)
                    print(f"{label:<40} {measured.calls:>7} {measured.total_ms:>9.1f} {measured.longest_ms:>11.2f} "
                          f"{measured.wall_ms / 1000:>7.2f}")
        finally:
            drop(client, f"{prefix}:*")


if __name__ == "__main__":
    main()
