"""A paged fan-out's page entries are delivered once however many deliverers read the same hand-off list.

Two deliverers (a worker after its finish, a sweep, Queue.cancel, another worker) may read the same entry
of kind "f" before either removes it. Each delivered that page and handed on the next one, so the copies
doubled at each overlap: a failure before a group of 20,000 (201 pages) took about 500,000 entries and
8.7 s with two deliverers, and before a group of 50,000 it had not ended after 110 s. Nothing ran twice
(a delivery counts once); the bound is on the work. Now a page is delivered by the call that deletes it.
"""

import threading
import time

from echomq_django.core import Chain, Group, JobOptions, Member, Plan, Queue, connect
from echomq_django.core.producing.handoff import deliver_handoffs
from echomq_django.core.producing.queue import now_ms
from tests.helpers import fetch, finish
from tests.redis_servers import RedisServer

FAN = 20_000  # 201 pages of edges


def test_two_concurrent_deliverers_do_not_multiply_a_paged_fan_outs_entries():
    server = RedisServer("--appendonly", "no")
    server.start()
    try:
        client = connect(server.url)
        queue = Queue("A", client)
        plan = Plan.of(Chain(Member(queue, "boom", {"args": []}, JobOptions(attempts=1)),
                             Group(*[Member(queue, "add", {"args": [n]}, JobOptions(attempts=1)) for n in range(FAN)])))
        plan.add()
        pages = len(plan.steps[0].pages)
        [(first, _)] = fetch(queue)
        finish(queue, first, "token-1", completed=False, value="boom")
        delivered, lock, deadline = [0, 0], threading.Lock(), time.monotonic() + 60

        def deliverer(index: int) -> None:
            own = connect(server.url)
            scripts = Queue("A", own).scripts
            while time.monotonic() < deadline and (own.zcard(queue.keys.deferred) or own.llen(queue.keys.handoff)):
                count = deliver_handoffs(scripts, queue.keys, now_ms())
                with lock:
                    delivered[index] += count

        threads = [threading.Thread(target=deliverer, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert client.zcard(queue.keys.deferred) == 0, "every member failed"
        assert sum(delivered) <= 4 * pages, (
            f"{pages} pages took {sum(delivered)} hand-off entries with two deliverers (one alone: {pages})")
    finally:
        server.stop()
