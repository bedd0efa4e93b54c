"""A bulk change whose round trip's replies are lost on the wire: the client sends it again, and the counts hold.

A Redis of its own behind tests/fault_proxy.py: the proxy loses the replies of
one round trip of 500 script calls after Redis ran them, and goes down; the
client's own retries send the round trip again once it is back. Each job must be
changed once and counted as the first send found it (issue 38, item 4: the jobs
the first send retried came back "no longer failed", and that count went into
the admin's message and audit line).
"""

import hashlib
import threading

import pytest

from echomq_django.core import BULK_BATCH, STOPPING, NewJob, Queue, connect
from echomq_django.core.protocol.lua import script_names, script_source
from tests.fault_proxy import FaultProxy
from tests.helpers import fail_jobs, fetch, wait_until
from tests.redis_servers import RedisServer


@pytest.fixture
def behind_proxy():
    """(a queue reached through the proxy, the same queue reached directly, the proxy)."""
    server = RedisServer()
    server.start()
    labels = {hashlib.sha1(script_source(name).encode()).hexdigest(): name.split("-")[0] for name in script_names()}
    proxy = FaultProxy(server.port, labels=labels).start()
    direct = connect(server.url)
    for name in script_names():  # loaded: the lost replies are the scripts' answers, not NOSCRIPT refusals
        direct.script_load(script_source(name))
    try:
        yield Queue("q", connect(proxy.url), prefix="resend"), Queue("q", direct, prefix="resend"), proxy
    finally:
        proxy.stop()
        server.stop()
        server.workdir.cleanup()


def lose_the_reply_to(proxy: FaultProxy, script: str) -> threading.Thread:
    """Lose the reply to the next round trip of `script` and go down; come back up once it is lost."""
    proxy.down_instead_of_reply(script)

    def back_up() -> None:
        wait_until(lambda: proxy.replies_dropped >= 1, 60)
        proxy.up()

    thread = threading.Thread(target=back_up, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("action", ["retry", "delete", "cancel"])
def test_a_bulk_change_whose_replies_were_lost_counts_each_job_as_the_first_send_did(behind_proxy, action):
    queue, direct, proxy = behind_proxy
    if action == "retry":
        ids = fail_jobs(direct, BULK_BATCH)
    else:
        ids = direct.add_bulk([NewJob("work", {"n": n}) for n in range(BULK_BATCH)])
    script = {"retry": "retryJob", "delete": "removeJob", "cancel": "cancelJob"}[action]
    back_up = lose_the_reply_to(proxy, script)
    if action == "retry":
        outcome = queue.retry_many(ids)
    elif action == "delete":
        outcome = queue.remove_many(ids)
    else:
        outcome = queue.cancel_many(ids, reason="by a test")
    back_up.join(60)
    assert proxy.replies_dropped == 1 and proxy.dropped_by_request[script] == 1, proxy.summary()
    assert sorted(outcome.done) == sorted(ids), (
        f"{len(outcome.done)} counted done; the others: { {why: len(left) for why, left in outcome.other.items()} }")
    assert outcome.other == {}
    counts = direct.counts()
    expected = {"retry": ("wait", BULK_BATCH), "delete": ("wait", 0), "cancel": ("failed", BULK_BATCH)}[action]
    assert counts[expected[0]] == expected[1], counts


def test_a_cancel_of_running_jobs_whose_replies_were_lost_counts_them_as_flagged(behind_proxy):
    queue, direct, proxy = behind_proxy
    ids = direct.add_bulk([NewJob("work", {"n": n}) for n in range(BULK_BATCH)])
    assert len(fetch(direct, token="runner", count=BULK_BATCH)) == BULK_BATCH
    back_up = lose_the_reply_to(proxy, "cancelJob")
    outcome = queue.cancel_many(ids)
    back_up.join(60)
    assert proxy.replies_dropped == 1, proxy.summary()
    assert outcome.done == [], f"{len(outcome.done)} counted cancelled"
    assert list(outcome.other) == [STOPPING], {why: len(left) for why, left in outcome.other.items()}
    assert sorted(outcome.other[STOPPING]) == sorted(ids)
