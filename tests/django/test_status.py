"""What `echomq_status` (and the admin's dashboard, through echomq_django.status) shows of a queue."""

import json
import time
from datetime import datetime
from io import StringIO

import pytest
from django.core.management import call_command

from echomq_django.core import COUNTED, JobOptions, Worker, WorkerOptions, now_ms
from echomq_django.status import describe_sweep, queue_status
from tests import hostile_pool_jobs
from tests.django.test_prometheus import run_known_jobs
from tests.helpers import running, wait_until

pytestmark = pytest.mark.django_db


def status_table() -> dict[str, dict[str, str]]:
    """echomq_status's table as queue -> {column: cell}."""
    out = StringIO()
    call_command("echomq_status", stdout=out)
    header, *rows = out.getvalue().split("\n\n")[0].splitlines()  # the table, before the workers
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


MINUTE_KEYS = {"minute", "completed", "failed", "retried", "recovered", "mean_wait_ms", "mean_run_ms"}


def minute_starts(entries: list[dict]) -> list[int]:
    """Each entry's minute as ms since the epoch."""
    return [round(datetime.fromisoformat(entry["minute"]).timestamp() * 1000) for entry in entries]


def test_json_gains_the_five_complete_minutes_before_now_and_their_rates(echomq_settings, queue):
    before = now_ms() // 60_000
    out = StringIO()
    call_command("echomq_status", "--json", stdout=out)
    after = now_ms() // 60_000
    [status] = json.loads(out.getvalue())
    minutes = status["last_5_minutes"]
    assert len(minutes) == 5 and all(set(entry) == MINUTE_KEYS for entry in minutes)
    assert all(entry["minute"].endswith("+00:00") for entry in minutes), "UTC"
    starts = minute_starts(minutes)
    assert starts[-1] // 60_000 in (before - 1, after - 1), "the last complete minute, not the one still counting"
    assert [later - earlier for earlier, later in zip(starts, starts[1:])] == [60_000] * 4, "oldest first"
    assert status["rates_per_minute"] == {"completed": 0.0, "failed": 0.0, "recovered": 0.0}
    assert all(type(rate) is float for rate in status["rates_per_minute"].values())


def test_the_table_keeps_one_line_per_queue(echomq_settings, queue):
    out = StringIO()
    call_command("echomq_status", stdout=out)
    table, workers = out.getvalue().split("\n\n")
    assert len(table.splitlines()) == 2 and "last_5_minutes" not in out.getvalue()
    assert workers.splitlines() == ["workers:", "  q: none"]


def test_a_run_counts_once_its_minute_is_complete(echomq_settings, queue):
    started = now_ms()
    run_known_jobs(queue)  # 5 completed, 2 failed for good, 1 recovered
    ended = now_ms()
    assert queue_status("q", rates=True, now=started)["rates_per_minute"] == dict.fromkeys(
        ("completed", "failed", "recovered"), 0.0), "the minute the run began in is still counting"
    status = queue_status("q", rates=True, now=ended + 60_000)
    minutes = status["last_5_minutes"]
    assert minute_starts(minutes)[-1] == ended // 60_000 * 60_000
    totals = {name: sum(entry[name] for entry in minutes) for name in ("completed", "failed", "retried", "recovered")}
    assert totals == {"completed": 5, "failed": 2, "retried": 0, "recovered": 1}
    assert status["rates_per_minute"] == {"completed": 1.0, "failed": 0.4, "recovered": 0.2}
    busy = [entry for entry in minutes if entry["completed"] or entry["failed"]]
    assert busy and all(entry["mean_run_ms"] is not None and entry["mean_wait_ms"] is not None for entry in busy)
    idle = [entry for entry, start in zip(minutes, minute_starts(minutes)) if start < started // 60_000 * 60_000]
    assert len(idle) >= 3 and all(entry["mean_run_ms"] is None and entry["completed"] == 0 for entry in idle)


def status_lines(*args: str) -> str:
    out = StringIO()
    call_command("echomq_status", *args, stdout=out)
    return out.getvalue()


def test_slots_held_by_threads_past_their_limit_are_shown_until_the_threads_end(echomq_settings, queue, redis_url):
    go, count = f"{queue.keys.prefix}:go", f"{queue.keys.prefix}:running"
    hung = queue.add("counted", {"url": redis_url, "running": count, "go": go, "seconds": 60},
                     opts=JobOptions(attempts=1, time_limit_ms=300))
    worker = Worker(queue.name, hostile_pool_jobs.counted, queue.client, WorkerOptions(prefix=queue.keys.prefix,
                                                                                       pool="threads",
                                                                                       lock_duration_ms=2000,
                                                                                       block_timeout_s=0.2))
    with running(worker):
        assert wait_until(lambda: queue_status("q")["abandoned_threads"], 15), "the worker showed its held slot"
        assert queue_status("q")["abandoned_threads"] == [{"worker": worker.worker_id, "job": hung}]
        [status] = json.loads(status_lines("--json"))
        assert status["abandoned_threads"] == [{"worker": worker.worker_id, "job": hung}]
        _header, line = status_lines().split("\n\n")[0].splitlines()
        assert line.endswith(f"; 1 worker slot(s) held by thread(s) running on past their time limit (job(s) {hung}): "
                             "no job starts in them until they end"), line
        queue.client.rpush(go, "go")  # the thread ends: its slot is free again
        assert wait_until(lambda: queue_status("q")["abandoned_threads"] == [], 15)
    assert queue.client.exists(queue.keys.abandoned) == 0


def test_held_slots_of_a_worker_that_stopped_writing_them_count_no_more(echomq_settings, queue):
    # As a worker that died leaves them (scored by when they lapse), and what another client wrote.
    now = now_ms()
    queue.client.zadd(queue.keys.abandoned, {"7 host:1:abc:def": now + 60_000, "8 host:2:abc:def": now - 1,
                                             "\x1b[2J host:3:abc:def": now + 60_000})
    assert queue_status("q")["abandoned_threads"] == [{"worker": "host:1:abc", "job": "7"}]
    assert "\x1b" not in status_lines()
