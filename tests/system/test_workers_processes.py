"""The workers registry with real processes: a worker killed with SIGKILL lapses, one stopped leaves at once,
and the dashboard's warnings appear and clear as worker and sweeper commands come and go."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.test import Client

from echomq_django.core import NewJob, Queue
from tests.helpers import wait_until
from tests.system.test_chaos import ManagePy

WORKER = Path(__file__).resolve().parents[1] / "worker_process.py"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def spawn_worker(redis_url: str, queue: Queue, lock_ms: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, str(WORKER), redis_url, queue.keys.prefix, queue.name, str(lock_ms)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    return process


def test_a_killed_worker_lapses_within_its_lock_duration_and_a_stopped_one_leaves_at_once(queue, redis_url):
    lock_ms = 1500
    victim, stopped = spawn_worker(redis_url, queue, lock_ms), spawn_worker(redis_url, queue, lock_ms)
    try:
        assert wait_until(lambda: sorted(w.pid for w in queue.workers()) == sorted([victim.pid, stopped.pid]), 20)
        [record] = [w for w in queue.workers() if w.pid == victim.pid]
        victim.kill()
        victim.wait(10)
        # Nothing writes it again: what is left of its life is at most a lock duration, on Redis's clock (or
        # none: on a slow machine it may have lapsed already, -2; a record kept for good, -1, is the defect).
        left_ms = queue.client.pttl(queue.keys.worker(record.id))
        assert left_ms == -2 or 0 <= left_ms <= lock_ms, left_ms
        assert wait_until(lambda: victim.pid not in [w.pid for w in queue.workers()], 10 * lock_ms / 1000)
        assert [w.pid for w in queue.workers()] == [stopped.pid]
        [alive] = queue.workers()
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(20) == 0
        assert queue.workers() == [], "a clean stop takes the record out before the process exits"
        assert queue.client.zscore(queue.keys.workers, alive.id) is None
        assert not queue.client.exists(queue.keys.worker(alive.id))
    finally:
        for process in (victim, stopped):
            if process.poll() is None:
                process.kill()
                process.wait(10)


def warnings_shown(client: Client) -> list[str]:
    page = client.get("/admin/echomq/queue/")
    assert page.status_code == 200
    text = page.content.decode()
    return [kind for kind in ("no workers", "no sweeper") if f'class="errornote echomq-warning">{kind}:' in text]


def test_the_dashboard_warnings_appear_and_clear_with_real_workers_and_sweepers(subprocess_env, settings, prefix,
                                                                                redis_url):
    # The demo project's queue "demo" as the commands see it: a lock of 3 s, a sweep every 2 s.
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix,
                       "QUEUES": {"demo": {"LOCK_DURATION": 3, "SWEEP_INTERVAL": 2}}}
    from echomq_django.queues import get_queue

    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    queue = get_queue("demo")
    queue.pause()  # the jobs stay ready while a worker is there: only the worker's presence clears the warning
    queue.add_bulk([NewJob("demo_project.demo_app.jobs.greet", {"args": ["x"], "kwargs": {}}) for _ in range(3)])
    assert warnings_shown(client) == ["no workers"]
    processes = []
    try:
        worker = ManagePy(subprocess_env, "echomq_worker", "--queue", "demo")
        processes.append(worker)
        assert wait_until(lambda: warnings_shown(client) == [], 60), worker.err
        worker.process.kill()  # no clean stop: the warning comes back once its record lapses (3 s)
        worker.process.wait(10)
        assert wait_until(lambda: warnings_shown(client) == ["no workers"], 60)

        sweeper = ManagePy(subprocess_env, "echomq_sweep", "--queue", "demo")
        processes.append(sweeper)
        assert wait_until(lambda: queue.client.hexists(queue.keys.meta, "lastSweep"), 60), sweeper.err
        assert warnings_shown(client) == ["no workers"]
        assert sweeper.end() == 0
        # Three intervals (6 s) after its last sweep without another.
        assert wait_until(lambda: warnings_shown(client) == ["no workers", "no sweeper"], 60)
        sweeper = ManagePy(subprocess_env, "echomq_sweep", "--queue", "demo")
        processes.append(sweeper)
        assert wait_until(lambda: warnings_shown(client) == ["no workers"], 60), sweeper.err
    finally:
        for process in processes:
            process.end()


def test_a_frozen_worker_drops_out_and_comes_back_when_it_resumes(queue, redis_url):
    """SIGSTOP: nothing renews its record, which lapses as its locks would; SIGCONT: its next round writes it again."""
    lock_ms = 1000
    worker = spawn_worker(redis_url, queue, lock_ms)
    try:
        assert wait_until(lambda: [w.pid for w in queue.workers()] == [worker.pid], 20)
        worker.send_signal(signal.SIGSTOP)
        assert wait_until(lambda: queue.workers() == [], 10 * lock_ms / 1000)
        worker.send_signal(signal.SIGCONT)
        assert wait_until(lambda: [w.pid for w in queue.workers()] == [worker.pid], 20), "listed again"
        queue.add("noop")  # and it still works
        assert wait_until(lambda: queue.counts()["completed"] == 1, 20)
    finally:
        worker.send_signal(signal.SIGCONT)
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(10)
