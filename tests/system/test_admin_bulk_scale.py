"""The admin's bulk retry at scale, on a Redis of the test's own (its command counts are the test's alone)."""

import time

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from echomq_django.core import BULK_BATCH, Queue
from tests.helpers import commands_run, fail_jobs, script_calls
from tests.redis_servers import redis_server

pytestmark = pytest.mark.django_db
JOBS = 20_000


@pytest.mark.slow
@pytest.mark.timeout(180)  # about 5 s here
def test_bulk_retry_of_20000_failed_jobs_sends_each_back_once_in_a_script_call_each(settings):
    with redis_server() as url:
        client = redis.Redis.from_url(url, decode_responses=True)
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
