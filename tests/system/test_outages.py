"""A sweeper rides out a Redis restart: it says so once, reconnects and keeps sweeping."""

import logging
import threading
import time

import pytest

from echomq_django.core import Queue, Sweeper, connect
from tests.helpers import fetch, kill_lock, wait_until
from tests.redis_servers import RedisServer

pytestmark = pytest.mark.slow


def test_the_sweeper_reconnects_after_redis_restarts(caplog):
    server = RedisServer()
    server.start()
    # Few retries inside the client, so the outage reaches the sweeper's own loop quickly.
    client = connect(server.url, retry=None, retry_on_error=[], socket_connect_timeout=0.5)
    sweeper = Sweeper(client, ["q"], prefix="out", interval_ms=100)
    reports = []
    thread = threading.Thread(target=sweeper.run, args=(reports.append,), daemon=True)
    try:
        with caplog.at_level(logging.INFO, logger="echomq.sweeper"):
            thread.start()
            assert wait_until(lambda: len(reports) >= 2, 5)
            server.stop()
            time.sleep(1.5)
            swept_during_outage = len(reports)
            server.start()  # same port, empty data

            queue = Queue("q", client, prefix="out")
            job_id = queue.add("work")
            fetch(queue)
            kill_lock(queue, job_id)
            assert wait_until(lambda: queue.get_state(job_id) == "wait", 10), "sweeping resumed"
    finally:
        sweeper.stop()
        thread.join(5)
        server.stop()
    assert swept_during_outage <= len(reports) - 2
    # The sweeper's own lines (a worker thread another test left behind may log here too).
    messages = [record.getMessage() for record in caplog.records if record.name == "echomq.sweeper"]
    assert sum("Redis unreachable" in m for m in messages) == 1, "said once, not once per retry"
    assert sum("Redis is back" in m for m in messages) == 1
