"""The admin's bulk retry at scale, on a Redis of the test's own (its command counts are the test's alone): the
largest a request runs itself, and a larger one that the queue's workers run."""

import re
import time

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from echomq_django.admin.bulk_runs import BACKGROUND_ABOVE
from echomq_django.core import BULK_BATCH, Queue, Worker, WorkerOptions
from echomq_django.core.protocol.registry import Heartbeat, WorkerInfo
from echomq_django.jobs import run_job
from tests.helpers import commands_run, fail_jobs, running, script_calls, wait_until
from tests.redis_servers import redis_server

pytestmark = pytest.mark.django_db(transaction=True)  # the worker's threads write the audit line
JOBS = BACKGROUND_ABOVE  # the most a request changes itself
LARGE = 100_000


@pytest.mark.slow
@pytest.mark.timeout(180)  # about 5 s here
def test_bulk_retry_of_5000_failed_jobs_sends_each_back_once_in_a_script_call_each(settings):
    with redis_server() as url:
        client = redis.Redis.from_url(url, decode_responses=True, encoding_errors="replace")
        queue = Queue("q", client, prefix="bulk")
        settings.ECHOMQ = {"REDIS_URL": url, "PREFIX": "bulk", "QUEUES": {"q": {}}}
        ids = fail_jobs(queue, JOBS)
        assert client.zcard(queue.keys.failed) == JOBS
        root = Client(enforce_csrf_checks=True)
        root.force_login(User.objects.create_superuser("root", password="pw"))
        browse = reverse("admin:echomq_job_browse", args=["q", "failed"])
        page = root.get(browse).content.decode()
        token = page.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
        assert f"all {JOBS} job(s) in failed" in page
        client.config_resetstat()

        bulk = reverse("admin:echomq_job_bulk", args=["q", "failed"])
        form = {"action": "retry", "scope": "all", "csrfmiddlewaretoken": token}
        asked = root.post(bulk, form).content.decode()
        assert f"Retry {JOBS} failed job(s) of queue q?" in asked and client.zcard(queue.keys.failed) == JOBS
        started = time.monotonic()
        done = root.post(bulk, {**form, "post": "yes"}, follow=True).content.decode()
        took_s = time.monotonic() - started
        ran = commands_run(client)
        calls = script_calls(client)

        assert f"{JOBS} job(s) sent back to wait, of {JOBS} asked for in queue q." in done
        # Counted, not timed: no call walks the whole state, however slow the machine.
        assert calls == JOBS, f"{calls} script calls for {JOBS} jobs, not one each"
        reads = ran.get("zrange", 0) + ran.get("zrevrange", 0)
        assert reads >= JOBS // BULK_BATCH, f"{reads} reads of failed: not {BULK_BATCH} ids at a time"
        wait = client.lrange(queue.keys.wait, 0, -1)
        assert len(wait) == JOBS and set(wait) == set(ids), "each job in wait, once"
        assert client.zcard(queue.keys.failed) == 0
        print(f"bulk retry of {JOBS} failed jobs through the admin: {took_s:.2f} s")


def live_worker_record(queue: Queue) -> None:
    """The record a worker of the queue writes at its start (registry.py), for a worker that takes nothing yet."""
    now = int(time.time() * 1000)
    info = WorkerInfo("idle-1", queue.name, "host", 1, (queue.name,), "threads", 1, "test", now, now)
    Heartbeat(queue.client, queue.keys, lambda: info, 60_000).beat()


@pytest.mark.slow
@pytest.mark.timeout(600)  # about 60 s here
def test_a_bulk_retry_of_100000_failed_jobs_asks_the_request_for_a_constant_few_calls_and_the_workers_do_it(
        settings):
    with redis_server() as url:
        client = redis.Redis.from_url(url, decode_responses=True, encoding_errors="replace")
        queue = Queue("q", client, prefix="bulk")
        settings.ECHOMQ = {"REDIS_URL": url, "PREFIX": "bulk", "QUEUES": {"q": {}}}
        fail_jobs(queue, LARGE)
        live_worker_record(queue)
        root = Client(enforce_csrf_checks=True)
        root.force_login(User.objects.create_superuser("root", password="pw"))
        page = root.get(reverse("admin:echomq_job_browse", args=["q", "failed"])).content.decode()
        token = page.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
        form = {"action": "retry", "scope": "all", "csrfmiddlewaretoken": token, "post": "yes"}
        before = commands_run(client)
        started = time.monotonic()
        response = root.post(reverse("admin:echomq_job_bulk", args=["q", "failed"]), form)
        request_s = time.monotonic() - started
        ran = {name: n - before.get(name, 0) for name, n in commands_run(client).items() if n != before.get(name)}
        assert response.status_code == 302 and "/bulk-run/" in response["Location"], response
        # Counted, not timed: the request's Redis work does not grow with the selection.
        assert sum(ran.values()) < 30 and ran.get("evalsha") == 1, f"the request ran {ran}"
        assert client.zcard(queue.keys.failed) == LARGE
        run_page = response["Location"]
        worker = Worker("q", run_job, client, WorkerOptions(prefix="bulk", block_timeout_s=0.2))
        started = time.monotonic()
        with running(worker):
            assert wait_until(lambda: "Done:" in root.get(run_page).content.decode(), 500)
            run_s = time.monotonic() - started
        page = root.get(run_page).content.decode()
        assert re.search(r"Done: 100,000 job\(s\) sent back to wait, of 100,000 asked for in queue q\.", page), page
        print(f"bulk retry of {LARGE} failed jobs through the admin: the request {request_s:.2f} s "
              f"({sum(ran.values())} commands), the run {run_s:.1f} s")
