"""`manage.py echomq_worker` and `manage.py echomq_status`, in-process and as real processes."""

import json
import signal
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from demo_project.demo_app import jobs as demo
from tests.helpers import kill_lock, sweep, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def run(command: str, *args: str) -> str:
    out = StringIO()
    call_command(command, *args, stdout=out)
    return out.getvalue()


def add(queue, function, *args):
    return queue.add(function.name, {"args": list(args), "kwargs": {}})


def test_burst_runs_registered_job_functions_and_exits(echomq_settings, queue):
    ids = [add(queue, demo.greet, who) for who in ("Ada", "Grace")]
    output = run("echomq_worker", "--queue", "q", "--burst")
    assert "demo_project.demo_app.jobs.greet" in output
    assert [queue.get_job(i).returnvalue for i in ids] == ["hello, Ada", "hello, Grace"]


@pytest.mark.django_db(transaction=True)  # job threads have connections of their own
def test_jobs_can_use_the_database(echomq_settings, queue):
    get_user_model().objects.create(username="someone")
    job_id = add(queue, demo.count_users)
    run("echomq_worker", "--queue", "q", "--burst")
    assert queue.get_job(job_id).returnvalue == 1


def test_an_unknown_job_name_fails_at_once_with_a_clear_reason(echomq_settings, queue):
    job_id = queue.add("os.system", {"args": ["echo owned"], "kwargs": {}})
    run("echomq_worker", "--queue", "q", "--burst")
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "failed"
    assert "no job function named 'os.system' is registered" in job.failed_reason
    assert job.attempts_made == 1, "no retries for a job nobody can run"


def test_malformed_arguments_fail_with_a_reason(echomq_settings, queue):
    job_id = queue.add(demo.greet.name, ["not", "a", "dict"])
    run("echomq_worker", "--queue", "q", "--burst")
    assert "is not {\"args\"" in queue.get_job(job_id).failed_reason


def test_max_jobs_and_concurrency(echomq_settings, queue):
    ids = [add(queue, demo.slow, 0.4) for _ in range(3)]
    run("echomq_worker", "--queue", "q", "--burst", "--concurrency", "3")
    jobs = [queue.get_job(job_id) for job_id in ids]
    # Side by side: each job started before any of them finished (as Redis stamped them).
    assert max(job.processed_on for job in jobs) < min(job.finished_on for job in jobs), "the jobs ran one by one"
    for _ in range(3):
        add(queue, demo.greet, "x")
    run("echomq_worker", "--queue", "q", "--max-jobs", "2")
    assert queue.counts()["wait"] == 1


def test_enqueue_through_a_job_function_uses_its_queue_and_options(echomq_settings, redis_client, prefix):
    from echomq_django.core import Queue

    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"q": {}, "demo": {}}}
    job_id = demo.flaky.enqueue()
    job = Queue("demo", redis_client, prefix=prefix).get_job(job_id)
    assert job.name == demo.flaky.name and job.data == {"args": [], "kwargs": {}}
    assert (job.opts.attempts, job.opts.backoff.delay_ms) == (3, 500)


def test_status_shows_counts_marks_and_the_last_sweep(echomq_settings, queue):
    add(queue, demo.greet, "x")
    queue.pause()
    sweep(queue, force=False)
    table = run("echomq_status")
    assert "q (paused)" in table and "s ago on" in table
    [status] = json.loads(run("echomq_status", "--json"))
    assert status["queue"] == "q" and status["paused"] is True
    assert status["counts"]["paused"] == 1 and status["counts"]["stalled"] == 0
    assert status["last_sweep"]["marked"] == 0 and status["last_sweep"]["skipped"] is False


def spawn_worker(env, *args):
    process = subprocess.Popen([sys.executable, "manage.py", "echomq_worker", "--queue", "q", *args],
                               cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline().startswith("worker on q")
    return process


@pytest.mark.slow
def test_first_sigterm_finishes_the_running_job(queue, subprocess_env):
    job_id = add(queue, demo.slow, 1.0)
    waiting = add(queue, demo.greet, "later")
    worker = spawn_worker(subprocess_env)
    assert wait_until(lambda: queue.get_state(job_id) == "active", 10)
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(15) == 0
    assert queue.get_state(job_id) == "completed"
    assert queue.get_state(waiting) == "wait"


@pytest.mark.slow
def test_second_sigterm_exits_at_once_and_the_sweeper_recovers(queue, subprocess_env):
    job_id = add(queue, demo.slow, 30)
    worker = spawn_worker(subprocess_env)
    assert wait_until(lambda: queue.get_state(job_id) == "active", 10)
    worker.send_signal(signal.SIGTERM)
    # Two SIGTERMs sent before the first is taken count as one: the second goes once it says so.
    assert any("stopping" in line for line in worker.stdout), "the worker ended without a word of its stop"
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0, "the second SIGTERM did not end the 30 s job's worker"
    kill_lock(queue, job_id)  # rather than waiting out the 30 s lock
    sweep(queue)
    assert sweep(queue).recovered == 1


def test_status_as_a_process_prints_json(queue, subprocess_env):
    add(queue, demo.greet, "x")
    result = subprocess.run([sys.executable, "manage.py", "echomq_status", "--queue", "q", "--json"],
                            cwd=ROOT, env=subprocess_env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)[0]["counts"]["wait"] == 1


def test_a_worker_that_can_no_longer_work_exits_non_zero(echomq_settings, prefix):
    """Its user may not load scripts (an ACL): the first fetch fails, and the command says so."""
    from django.core.management import CommandError

    from tests.redis_servers import redis_server

    with redis_server("--user", "default", "on", "nopass", "~*", "&*", "+@all", "-script") as url:
        echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "REDIS_URL": url}
        with pytest.raises(CommandError, match="worker of queue.* q stopped on an error"):
            call_command("echomq_worker", "--queue", "q", "--burst", "-v", "0")


def run_failing(command: str, *args: str) -> tuple[str, str]:
    """Run a command that must end with a CommandError; its output and the error's message."""
    from django.core.management import CommandError

    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command(command, *args, stdout=out)
    return out.getvalue(), str(raised.value)


@pytest.mark.parametrize("broken_key", ["wait", "failed", "meta"])
def test_status_reports_a_broken_queue_prints_the_others_and_fails(echomq_settings, queue, redis_client, prefix,
                                                                    broken_key):
    from echomq_django.core import Queue

    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"broken": {}, "q": {}}}
    broken = Queue("broken", redis_client, prefix=prefix)
    redis_client.set(getattr(broken.keys, broken_key), "x")
    queue.add("work")
    table, error = run_failing("echomq_status")
    assert "broken" in error
    [broken_line, healthy_line] = table.split("\n\n")[0].splitlines()[1:]
    assert broken_line.startswith("broken") and ("WRONGTYPE" in broken_line or "wrong type" in broken_line)
    assert healthy_line.split()[:2] == ["q", "1"]
    document, _ = run_failing("echomq_status", "--json")
    by_queue = {status["queue"]: status for status in json.loads(document)}
    assert by_queue["broken"]["error"] and "error" not in by_queue["q"]
    assert by_queue["q"]["counts"]["wait"] == 1


@pytest.mark.parametrize("last_sweep", ["not json", '{"marked": 1}', '{"finished_at_ms": "soon", "host": 5}',
                                        '{"finished_at_ms": 1e400}'])
def test_status_survives_a_last_sweep_report_it_cannot_read(echomq_settings, queue, last_sweep):
    queue.client.hset(queue.keys.meta, "lastSweep", last_sweep)
    assert run("echomq_status").splitlines()[1].startswith("q")
    assert json.loads(run("echomq_status", "--json"))[0]["queue"] == "q"


CONSOLE_LOGGING = """
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"echomq": {"handlers": ["console"], "level": "INFO"}},
}
"""


def worker_output(env, tmp_path, logging_setting: str, *args: str) -> tuple[str, str]:
    """Run a burst worker on q under the demo's settings with `logging_setting` for LOGGING: (stdout, stderr)."""
    (tmp_path / "project_settings.py").write_text(
        f"from demo_project.settings import *  # noqa: F403\n{logging_setting}\n")
    env = {**env, "DJANGO_SETTINGS_MODULE": "project_settings", "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "manage.py", "echomq_worker", "--queue", "q", "--burst", *args],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr


def progress(queue) -> tuple[list[str], str, str]:
    """Enqueue a job that completes and one that fails twice: the progress lines a worker must print."""
    from echomq_django.core import JobOptions

    done = add(queue, demo.greet, "Ada")
    doomed = queue.add(demo.doomed.name, {"args": ["bad input"], "kwargs": {}}, opts=JobOptions(attempts=2))
    return [f"job {done} of queue q started: {demo.greet.name}, attempt 1 of 3",
            f"job {done} of queue q completed in ",
            f"job {doomed} of queue q started: {demo.doomed.name}, attempt 1 of 2",
            f"job {doomed} of queue q failed, retrying now: ValueError: bad input (attempt 1)",
            f"job {doomed} of queue q started: {demo.doomed.name}, attempt 2 of 2",
            f"job {doomed} of queue q failed, for good: ValueError: bad input (attempt 2)"], done, doomed


def test_a_project_without_logging_settings_sees_each_job_start_complete_and_fail(queue, subprocess_env, tmp_path):
    expected, _, _ = progress(queue)
    out, err = worker_output(subprocess_env, tmp_path, "LOGGING = {}")
    lines = [line for line in out.splitlines() if line.startswith("job ")]
    assert len(lines) == len(expected) and all(line.startswith(start) for line, start in zip(lines, expected)), out
    assert "job " not in err


def test_verbosity_0_silences_the_progress(queue, subprocess_env, tmp_path):
    progress(queue)
    out, err = worker_output(subprocess_env, tmp_path, "LOGGING = {}", "-v", "0")
    assert out == "" and err == ""


def test_logging_settings_for_echomq_get_the_lines_once(queue, subprocess_env, tmp_path):
    expected, _, _ = progress(queue)
    out, err = worker_output(subprocess_env, tmp_path, CONSOLE_LOGGING)
    lines = [line for line in (out + err).splitlines() if line.startswith("job ")]
    assert len(lines) == len(expected) and all(line.startswith(start) for line, start in zip(lines, expected)), \
        (out, err)
    assert all(line in err for line in lines), "through the project's own handler (stderr), not the command's"
