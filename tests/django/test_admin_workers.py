"""The workers registry in the Django layer: the Workers page, the dashboard's warnings, echomq_status, Prometheus."""

import json
import threading
from io import StringIO

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.test import Client

from echomq_django.core import NewJob, Worker, WorkerOptions, now_ms
from echomq_django.queues import make_sweeper
from tests.django.test_prometheus import scrape, value
from tests.helpers import running, wait_until

pytestmark = pytest.mark.django_db
WORKERS = "/admin/echomq/worker/"
DASHBOARD = "/admin/echomq/queue/"
HOSTILE = '<script>alert("x")</script>'


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="echomq", codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def make_worker(queue, handler, worker_id=None, **options) -> Worker:
    options = WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.2, renew_interval_ms=100, lock_duration_ms=5000,
                            **options)
    return Worker(queue.name, handler, queue.client, options, worker_id=worker_id)


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200
    return response.content.decode()


def test_the_workers_page_lists_each_worker_and_links_its_running_jobs(echomq_settings, queue):
    client = staff("ops", "view_worker", "view_job")
    release = threading.Event()
    worker = make_worker(queue, lambda job: release.wait(30), concurrency=2, worker_id="host-a.1")
    assert "No live worker serves this queue." in page(client, WORKERS)
    with running(worker):
        job_id = queue.add("hold")
        assert wait_until(lambda: [w.busy_slots for w in queue.workers()] == [1], 10)
        text = page(client, WORKERS)
        assert "host-a.1" in text and "threads" in text and "1/2" in text
        assert f'href="/admin/echomq/job/q/job/{job_id}/"' in text
        release.set()
    assert "No live worker serves this queue." in page(client, WORKERS)


def test_without_the_view_permission_the_page_is_refused_and_job_links_need_theirs(echomq_settings, queue):
    assert staff("nobody").get(WORKERS).status_code == 403
    release = threading.Event()
    with running(make_worker(queue, lambda job: release.wait(30))):
        job_id = queue.add("hold")
        assert wait_until(lambda: [w.busy_slots for w in queue.workers()] == [1], 10)
        text = page(staff("workers-only", "view_worker"), WORKERS)
        assert job_id in text and f"/job/{job_id}/" not in text
        release.set()


def test_a_record_another_client_wrote_is_escaped_and_its_odd_job_id_not_linked(echomq_settings, queue):
    now = now_ms()
    record = {"id": HOSTILE, "host": HOSTILE, "pid": 1, "queues": [HOSTILE], "pool": HOSTILE, "concurrency": 1,
              "version": HOSTILE, "started_at_ms": now, "heartbeat_at_ms": now, "done": 0, "failed": 0,
              "running": [["../../x", now]]}
    queue.client.set(queue.keys.worker("odd"), json.dumps(record), px=60_000)
    queue.client.zadd(queue.keys.workers, {"odd": now + 60_000})
    text = page(staff("ops", "view_worker", "view_job"), WORKERS)
    assert HOSTILE not in text and "&lt;script&gt;" in text
    assert "../../x" in text and 'href="/admin/echomq/job/q/job/../../x/"' not in text


def test_the_dashboard_warns_of_waiting_jobs_with_no_worker_until_one_serves_the_queue(echomq_settings, queue):
    client = staff("ops", "view_queue", "view_worker")
    assert "no workers" not in page(client, DASHBOARD), "an empty queue needs no worker"
    queue.add_bulk([NewJob("x") for _ in range(3)])
    assert "no workers: 3 job(s) waiting" in page(client, DASHBOARD)
    release = threading.Event()
    with running(make_worker(queue, lambda job: release.wait(30))):
        assert wait_until(lambda: len(queue.workers()) == 1, 10)
        text = page(client, DASHBOARD)
        assert "no workers" not in text and 'href="/admin/echomq/worker/#queue-q">1</a>' in text
        release.set()


def test_the_dashboard_warns_of_no_sweeper_after_three_intervals(echomq_settings, queue, settings):
    settings.ECHOMQ = {**settings.ECHOMQ, "QUEUES": {"q": {"SWEEP_INTERVAL": 0.2}}}
    client = staff("ops", "view_queue")
    sweeper = make_sweeper(["q"], long_running=False)
    sweeper.sweep(sweeper.targets[0], force=True)
    assert "no sweeper" not in page(client, DASHBOARD)
    assert wait_until(lambda: "no sweeper: the last sweep ended" in page(client, DASHBOARD), 10)
    sweeper.sweep(sweeper.targets[0], force=True)
    assert "no sweeper" not in page(client, DASHBOARD)


def test_echomq_status_and_prometheus_show_the_workers(echomq_settings, queue, settings):
    settings.ECHOMQ = {**settings.ECHOMQ, "METRICS_TOKEN": "t" * 32}
    release = threading.Event()
    with running(make_worker(queue, lambda job: release.wait(30), concurrency=3, worker_id="w-1")):
        queue.add_bulk([NewJob("hold") for _ in range(2)])
        assert wait_until(lambda: [w.busy_slots for w in queue.workers()] == [2], 10)
        out = StringIO()
        call_command("echomq_status", "--json", stdout=out)
        [status] = json.loads(out.getvalue())
        [listed] = status["workers"]
        assert (listed["id"], listed["concurrency"], len(listed["running"])) == ("w-1", 3, 2)
        assert [warning.split(":")[0] for warning in status["warnings"]] == ["no sweeper"]  # running, never swept
        out = StringIO()
        call_command("echomq_status", stdout=out)
        assert "  q: w-1 on " in out.getvalue() and "busy 2/3" in out.getvalue()
        text = scrape(token="t" * 32)
        assert value(text, "echomq_workers", queue="q") == 1.0
        assert value(text, "echomq_worker_busy_slots", queue="q") == 2.0
        release.set()
    out = StringIO()
    call_command("echomq_status", stdout=out)
    assert "  q: none" in out.getvalue()
    assert value(scrape(token="t" * 32), "echomq_workers", queue="q") == 0.0


def test_no_sweeper_is_judged_by_the_interval_the_sweeper_ran_with(echomq_settings, queue, settings):
    """`echomq_sweep --interval` overrides SWEEP_INTERVAL: a sweep every 60 s is not late after 1 s."""
    from echomq_django.core import Sweeper
    from echomq_django.status import queue_status

    settings.ECHOMQ = {**settings.ECHOMQ, "QUEUES": {"q": {"SWEEP_INTERVAL": 0.2}}}
    sweeper = Sweeper(queue.client, [queue.name], prefix=queue.keys.prefix, interval_ms=60_000)
    sweeper.sweep(sweeper.targets[0], force=True)
    started = now_ms()
    assert wait_until(lambda: now_ms() - started > 1000, 5)
    assert queue_status("q")["warnings"] == []


def test_a_record_of_any_size_makes_a_page_of_bounded_size(echomq_settings, queue):
    """One corrupt record, a 5 MB host and 100,000 running entries, made a 14 MB page (issue 38, item 6)."""
    now = now_ms()
    record = {"id": "w" * 1_000_000, "host": "h" * 5_000_000, "pid": 1, "queues": ["q" * 1000] * 10_000,
              "pool": "p" * 100_000, "concurrency": 1, "version": "v" * 100_000, "started_at_ms": now,
              "heartbeat_at_ms": now, "done": 0, "failed": 0,
              "running": [[f"job-{n}", now - n] for n in range(100_000)] + [["x" * 1_000_000, now]]}
    queue.client.set(queue.keys.worker("huge"), json.dumps(record), px=60_000)
    queue.client.zadd(queue.keys.workers, {"huge": now + 60_000})
    text = page(staff("ops", "view_worker", "view_job"), WORKERS)
    assert len(text) < 100_000, f"a page of {len(text):,} characters"
    assert "h" * 200 not in text and "h" * 100 in text and "…" in text
    assert "100,001/1" in text, "the busy count is of every entry, shown or not"
    assert 'href="/admin/echomq/job/q/job/job-0/"' in text and "job-49</a>" in text and "job-50<" not in text
    assert "and 99,951 more" in text and "and 9,980 more" in text
