"""Odd records in the workers registry: echomq_status (text and JSON), the Workers page and the metrics still answer."""

import json
from io import StringIO

import pytest
from django.core.management import call_command

from tests.django.test_admin_workers import WORKERS, page, staff
from tests.django.test_prometheus import TOKEN, scrape
from tests.runtime.test_hostile_29_registry import record, write

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("text", ["[" * 100_000, record(id="far", started_at_ms=10**400, heartbeat_at_ms=10**400,
                                                        running=[["j", 10**400]])], ids=["deep", "huge"])
def test_every_reader_of_the_registry_answers(echomq_settings, queue, text):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "METRICS_TOKEN": TOKEN}
    write(queue, "odd", text)
    out = StringIO()
    call_command("echomq_status", stdout=out)
    assert "q: none" in out.getvalue()
    out = StringIO()
    call_command("echomq_status", "--json", stdout=out)
    assert json.loads(out.getvalue())[0]["workers"] == []
    assert "No live worker serves this queue." in page(staff("ops", "view_worker", "view_job"), WORKERS)
    assert 'echomq_workers{queue="q"} 0.0' in scrape()


def test_a_sweep_report_whose_time_no_float_holds_is_an_unreadable_report(echomq_settings, queue):
    # seconds_since's callers catch what it documents (ValueError, KeyError, TypeError); float(10**400) raised
    # OverflowError past all four of them.
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "METRICS_TOKEN": TOKEN}
    queue.client.hset(queue.keys.meta, "lastSweep", json.dumps({"finished_at_ms": 10**400, "host": "h", "marked": 0,
                                                                "recovered": 0, "failed": 0}))
    queue.add("waiting")
    out = StringIO()
    call_command("echomq_status", stdout=out)
    assert "unreadable report" in out.getvalue()
    out = StringIO()
    call_command("echomq_status", "--json", stdout=out)
    assert json.loads(out.getvalue())[0]["warnings"] == [
        "no workers: 1 job(s) waiting and no live worker serves this queue"]
    assert "echomq_last_sweep_age_seconds{" not in scrape()
    page(staff("ops", "view_queue", "view_worker"), "/admin/echomq/queue/")
    page(staff("ops2", "view_worker"), WORKERS)
