"""A first stop while Redis is down, on the pool path and on the fast path (ECHOMQ_OWN_CONNECTIONS)."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.redis_servers import RedisServer

WORKER = Path(__file__).resolve().parents[1] / "worker_process.py"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


# Found (hostile test of issue 25): an idle worker whose Redis died while it waited for work held an
# unanswered fetch; a SIGTERM then left it retrying that fetch for as long as Redis stayed away (150 s and
# on, on the fast path; the pool path gave up after two rounds of the client's retries, 30 s). Nothing
# runs and nothing is held, but a deploy's stop hangs until its supervisor kills the worker. A fetch
# whose answer cannot be had while stopping is left to the sweeper, as a wait cut by the stop already is.
@pytest.mark.parametrize("own_connections", ["0", "1"])
def test_one_sigterm_stops_an_idle_worker_whose_redis_is_down(own_connections):
    server = RedisServer("--save", "")
    server.start()
    env = {**os.environ, "ECHOMQ_OWN_CONNECTIONS": own_connections}
    worker = subprocess.Popen([sys.executable, str(WORKER), server.url, "outage", "q", "3000", "2"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(worker.stderr), daemon=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        reader.start()
        server.stop()
        # The worker has found Redis gone (its fetch unanswered) before it is told to stop.
        assert wait_until(lambda: any("Redis unreachable" in line for line in lines), 60), lines
        worker.send_signal(signal.SIGTERM)
        # Two rounds of the client's 15 s of retries, four times over.
        assert worker.wait(120) == 0, "".join(lines)[-2000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
        server.stop()
        server.workdir.cleanup()
