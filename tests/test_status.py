"""What `echomq_status` (and the admin's dashboard, through echomq_django.status) shows of a queue."""

import json
import time
from io import StringIO

import pytest
from django.core.management import call_command

from echomq_django.core import COUNTED, JobOptions
from echomq_django.status import describe_sweep, queue_status

pytestmark = pytest.mark.django_db


def status_table() -> dict[str, dict[str, str]]:
    """echomq_status's table as queue -> {column: cell}."""
    out = StringIO()
    call_command("echomq_status", stdout=out)
    header, *rows = out.getvalue().splitlines()
    assert header.split()[1:len(COUNTED) + 1] == list(COUNTED)
    return {row.split()[0]: dict(zip(COUNTED, row.split()[1:])) for row in rows}


def test_prioritized_jobs_are_counted_in_the_table_and_the_json(echomq_settings, queue):
    for priority in (5, 10):
        queue.add("work", opts=JobOptions(priority=priority))
    assert status_table()["q"] == {**dict.fromkeys(COUNTED, "0"), "prioritized": "2"}
    out = StringIO()
    call_command("echomq_status", "--json", stdout=out)
    assert json.loads(out.getvalue())[0]["counts"]["prioritized"] == 2


def test_queue_status_is_plain_data_for_the_command_and_the_admin(echomq_settings, queue):
    queue.add("work")
    status = queue_status("q")
    assert status["queue"] == "q" and status["paused"] is False and status["last_sweep"] is None
    assert status["counts"]["wait"] == 1 and set(status["counts"]) == set(COUNTED)


def test_describe_sweep_reads_any_report():
    report = {"finished_at_ms": time.time() * 1000 - 5000, "host": "web-1", "marked": 2, "recovered": 1, "failed": 0}
    assert describe_sweep(report) == "5 s ago on web-1: marked 2, recovered 1, failed 0"
    assert describe_sweep(None) == "never"
    assert describe_sweep({"finished_at_ms": "soon"}) == "unreadable report"
