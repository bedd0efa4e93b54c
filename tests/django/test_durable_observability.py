"""Jobs parked by a durable signal wait, as `echomq_status` and `/echomq/metrics/` show them."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from echomq_django.core import COUNTED, Worker, WorkerOptions, durable
from tests.django.test_prometheus import TOKEN, scrape, value
from tests.django.test_status import status_table
from tests.helpers import running, wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]


def park(queue, count: int) -> list[str]:
    """`count` jobs, each run by a real worker to its signal wait, so parked; their ids."""
    ids = [queue.add("approval") for _ in range(count)]
    worker = Worker(queue.name, lambda job: durable.wait_signal(job, "approved", None), queue.client,
                    WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.1), scripts=queue.scripts)
    with running(worker):
        assert wait_until(lambda: queue.counts()["parked"] == count, 60), queue.counts()
    return ids


def test_parked_jobs_are_counted_in_the_table_and_the_json_and_warn_of_nothing(echomq_settings, queue):
    park(queue, 2)
    queue.add("work")
    assert "parked" in COUNTED
    assert status_table()["q"] == {**dict.fromkeys(COUNTED, "0"), "parked": "2", "wait": "1"}
    out = StringIO()
    call_command("echomq_status", "--json", stdout=out)
    [status] = json.loads(out.getvalue())
    assert status["counts"]["parked"] == 2 and status["counts"]["active"] == 0
    # A parked job waits for a signal, not for a worker: only the job in wait makes the queue want one.
    assert status["warnings"] == ["no workers: 1 job(s) waiting and no live worker serves this queue"]


def test_the_jobs_gauge_has_the_parked_state_and_a_signal_takes_a_job_out_of_it(echomq_settings, queue):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "METRICS_TOKEN": TOKEN}
    first, _ = park(queue, 2)
    text = scrape()
    assert value(text, "echomq_queue_jobs", queue="q", state="parked") == 2
    assert {state: value(text, "echomq_queue_jobs", queue="q", state=state) for state in COUNTED} == {
        **dict.fromkeys(COUNTED, 0), "parked": 2}
    assert queue.signal(first, "approved", True) is True
    text = scrape()
    assert value(text, "echomq_queue_jobs", queue="q", state="parked") == 1
    assert value(text, "echomq_queue_jobs", queue="q", state="wait") == 1
