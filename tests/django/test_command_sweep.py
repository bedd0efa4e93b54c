"""`manage.py echomq_sweep`, through call_command and as a real process."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from tests.helpers import fetch, kill_lock, redis_now_ms, wait_until

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.django_db


def sweep_command(*args: str) -> str:
    out = StringIO()
    call_command("echomq_sweep", "--once", *args, stdout=out)
    return out.getvalue()


def stalled(queue) -> str:
    job_id = queue.add("work")
    fetch(queue)
    kill_lock(queue, job_id)
    return job_id


def test_once_marks_then_the_gate_holds_then_force_recovers(echomq_settings, queue):
    job_id = stalled(queue)
    assert "queue q: marked 1, recovered 0" in sweep_command()
    assert re.fullmatch(r"queue q: skipped: another sweep ran \d+\.\d s ago; use --force to sweep now\n",
                        sweep_command()), "--once says why it did nothing"
    assert sweep_command("-v", "0") == ""
    assert "recovered 1 to wait" in sweep_command("--force")
    assert queue.get_state(job_id) == "wait"


def hold_over(queue) -> bool:
    """Whether the hold a sweep opened has ended, on Redis's clock, and the gate it closed has opened."""
    hold_until = int(queue.client.hget(queue.keys.meta, "sweepHoldUntil") or 0)
    return redis_now_ms(queue) >= hold_until and not queue.client.exists(queue.keys.stalled_check)


def test_once_on_a_schedule_is_held_unless_its_interval_covers_the_period(echomq_settings, queue):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"q": {"LOCK_DURATION": 0.4}}}
    job_id = stalled(queue)
    assert "marked 1" in sweep_command("--interval", "0.2")
    time.sleep(0.7)  # the schedule's period: longer than the interval and half a lock
    held = sweep_command("--interval", "0.2")
    assert "held for" in held and "--interval set to the schedule's period" in held
    assert wait_until(lambda: hold_over(queue), 30), "the hold (one lock duration) ends"
    # 30 s: however long this machine took since the held sweep, it is within the interval and half a lock.
    assert "recovered 1" in sweep_command("--interval", "30"), "an interval that covers the period is no outage"
    assert queue.get_state(job_id) == "wait"


def test_a_skip_without_a_report_to_date_it_still_says_why(echomq_settings, queue):
    queue.client.set(queue.keys.stalled_check, "another host", px=30_000)  # a gate with no report beside it
    assert sweep_command() == "queue q: skipped: another sweep ran within its interval; use --force to sweep now\n"


def test_fractional_interval_is_the_gates_px(echomq_settings, queue):
    # 30.25 s, not 0.25: a gate of a quarter second could lapse while this machine stalls.
    sweep_command("--interval", "30.25")
    assert 30_000 < queue.client.pttl(queue.keys.stalled_check) <= 30_250, "the fraction of a second is kept"


def test_queue_option_sweeps_any_named_queue(echomq_settings, redis_client, prefix):
    from echomq_django.core import Queue

    other = Queue("not-configured", redis_client, prefix=prefix)
    stalled(other)
    output = sweep_command("--queue", "not-configured", "--queue", "q")
    assert [line.split(":")[0] for line in output.splitlines()] == ["queue not-configured", "queue q"]
    assert "queue not-configured: marked 1" in output and "queue q: marked 0" in output


def test_max_stalled_count_zero_fails_a_job_on_its_first_stall(echomq_settings, queue):
    job_id = stalled(queue)
    sweep_command("--max-stalled-count", "0")
    sweep_command("--max-stalled-count", "0", "--force")
    assert queue.get_state(job_id) == "failed"
    assert "max_stalled_count" in queue.get_job(job_id).failed_reason


def test_invalid_queue_name_is_a_command_error(echomq_settings):
    with pytest.raises(CommandError, match="may hold only"):
        sweep_command("--queue", "bad{name}")


@pytest.mark.parametrize("args", [["--interval", "0"], ["--interval", "soon"], ["--max-stalled-count", "-1"],
                                  ["--interval", "inf"], ["--interval", "nan"], ["--interval", "1e300"]])
def test_bad_option_values_are_refused(args):
    result = subprocess.run([sys.executable, "manage.py", "echomq_sweep", "--once", *args],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "invalid" in result.stderr


@pytest.mark.slow
def test_the_loop_marks_recovers_and_stops_on_sigterm(queue, subprocess_env):
    job_id = stalled(queue)
    env = subprocess_env
    process = subprocess.Popen(
        [sys.executable, "manage.py", "echomq_sweep", "--queue", "q", "--interval", "0.2"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert wait_until(lambda: queue.get_state(job_id) == "wait", 10)
    finally:
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=10)
    assert process.returncode == 0, stderr
    lines = stdout.splitlines()
    assert lines[0] == "sweeping q every 0.2 s", "it says at start what it sweeps and how often"
    assert lines[1].startswith("queue q: marked 1, recovered 0")
    assert any(line.startswith("queue q: marked 0, recovered 1") for line in lines)


@pytest.mark.django_db(transaction=True)  # the command closes connections between sweeps
def test_a_failing_mirror_is_logged_and_the_sweeps_go_on(echomq_settings, redis_client, prefix, monkeypatch, caplog):
    from echomq_django.core import Queue
    from echomq_django.management.commands import echomq_sweep
    from echomq_django.models import StalledJob

    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"broken": {}, "q": {}}}
    broken, healthy = (Queue(name, redis_client, prefix=prefix) for name in ("broken", "q"))
    stalled(broken)
    job_id = stalled(healthy)
    real_sync = echomq_sweep.sync_queue

    def sync_with_a_bug(queue):  # stands for any bug of the mirror: not Redis, not the database
        if queue.name == "broken":
            raise RuntimeError("a bug in the mirror")
        return real_sync(queue)

    monkeypatch.setattr(echomq_sweep, "sync_queue", sync_with_a_bug)
    output = sweep_command()
    assert "queue broken: marked 1" in output and "queue q: marked 1" in output
    assert list(StalledJob.objects.values_list("job_id", flat=True)) == [job_id], "q was still mirrored"
    [record] = [r for r in caplog.records if "a bug in the mirror" in r.getMessage() or r.exc_info]
    assert "broken" in record.getMessage() and record.levelname == "ERROR"


def test_the_start_up_error_hides_the_redis_password(echomq_settings):
    from tests.redis_servers import free_port

    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ,
                              "REDIS_URL": f"redis://user:s3cret@127.0.0.1:{free_port()}/0"}
    with pytest.raises(CommandError, match=r"cannot reach Redis at redis://user:\*\*\*@127") as raised:
        sweep_command()
    assert "s3cret" not in str(raised.value)


def test_the_loop_gives_back_the_signal_handlers_it_took(echomq_settings, queue, transactional_db):
    # transactional_db: the loop runs on a thread of its own, whose writes (the mirror) commit.
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)

    def stop_once_it_sweeps() -> None:  # the loop has its handlers by then: SIGINT stops the command
        if wait_until(lambda: queue.client.hexists(queue.keys.meta, "lastSweep"), 10):
            os.kill(os.getpid(), signal.SIGINT)

    stopping = threading.Thread(target=stop_once_it_sweeps)
    stopping.start()
    call_command("echomq_sweep", "--interval", "0.1", stdout=StringIO())
    stopping.join()
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
