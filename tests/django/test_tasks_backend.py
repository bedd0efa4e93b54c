"""Django's Tasks framework on echomq: every flag the backend claims, through the real worker."""

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from demo_project.demo_app import tasks
from echomq_django.backends import EchoMQBackend
from echomq_django.core import PayloadError, Queue
from echomq_django.tasks_compat import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.helpers import kill_lock, sweep, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def default_queue(settings, redis_url, prefix, redis_client) -> Queue:
    """ECHOMQ and TASKS as the demo has them, on this test's own prefix."""
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "demo": {}}}
    return Queue("default", redis_client, prefix=prefix)


def work(*args: str) -> None:
    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0", *args)


def test_the_backend_claims_every_feature():
    backend = task_backends["default"]
    assert isinstance(backend, EchoMQBackend)
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority


def test_a_task_runs_and_its_result_is_readable(default_queue):
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY and default_queue.counts()["wait"] == 1
    assert tasks.add.get_result(result.id).status == TaskResultStatus.READY
    work()
    done = tasks.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
    assert (done.args, done.kwargs) == ([2, 3], {})
    assert len(done.worker_ids) == 1 and done.attempts == 1
    assert done.enqueued_at <= done.started_at <= done.last_attempted_at <= done.finished_at


def test_get_result_while_running_and_after(default_queue):
    from echomq_django.jobs import run_job
    from echomq_django.queues import make_worker

    result = tasks.slow_first_attempt.enqueue(3.0)  # running long enough to be read twice on a slow machine
    worker = make_worker("default", run_job, block_timeout_s=0.2)
    thread = threading.Thread(target=worker.run, kwargs={"burst": True}, daemon=True)
    thread.start()
    assert wait_until(lambda: result.task.get_result(result.id).status == TaskResultStatus.RUNNING, 5)
    running = tasks.slow_first_attempt.get_result(result.id)
    assert running.started_at is not None and running.finished_at is None
    with pytest.raises(ValueError, match="not finished"):
        running.return_value
    thread.join(30)
    running.refresh()
    assert running.status == TaskResultStatus.SUCCESSFUL and running.return_value == 1


def test_unknown_ids_raise_does_not_exist(default_queue):
    default_queue.add("x")  # a generated id: the queue's `id` key now exists
    for result_id in ("t0000", "bad:id", "id", "meta", "1"):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(result_id)


def test_failures_are_retried_and_every_error_is_recorded(default_queue):
    result = tasks.always_fails.enqueue("nope")
    work()
    failed = tasks.always_fails.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 3
    assert [error.exception_class_path for error in failed.errors] == ["builtins.ValueError"] * 3
    assert failed.errors[-1].exception_class is ValueError and "ValueError: nope" in failed.errors[-1].traceback
    with pytest.raises(ValueError, match="failed"):
        failed.return_value


def test_attempts_and_backoff_come_from_the_task(default_queue):
    result = tasks.always_fails.using(priority=0).enqueue("x")
    job = default_queue.get_job(result.id)
    assert job.opts.attempts == 3 and job.opts.backoff.kind == "fixed"
    assert default_queue.get_job(tasks.add.enqueue(1, 1).id).opts.attempts == 3, "the queue's default"


def test_async_tasks_run_on_an_event_loop(default_queue):
    result = tasks.double_later.enqueue(21)
    work()
    assert tasks.double_later.get_result(result.id).return_value == 42


def test_run_after_becomes_a_delayed_job(default_queue):
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)
    soon = tasks.add.using(run_after=timezone.now() + timedelta(milliseconds=300)).enqueue(3, 4)
    assert default_queue.counts()["delayed"] == 2
    time.sleep(0.35)
    work()
    assert tasks.add.get_result(soon.id).return_value == 7
    assert tasks.add.get_result(later.id).status == TaskResultStatus.READY
    assert default_queue.get_state(later.id) == "delayed"


def test_priorities_order_the_work(default_queue):
    ids = {priority: tasks.add.using(priority=priority).enqueue(priority, 0).id for priority in (-50, 0, 90, 10)}
    work("--concurrency", "1")
    fetched = [fields["jobId"] for _id, fields in default_queue.client.xrange(default_queue.keys.events)
               if fields["event"] == "active"]
    assert fetched == [ids[90], ids[10], ids[0], ids[-50]]


def test_an_enqueue_inside_a_transaction_waits_for_the_commit(default_queue):
    with transaction.atomic():
        result = tasks.add.enqueue(1, 2)
        delayed = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)
        assert default_queue.counts()["wait"] == 0 and default_queue.counts()["delayed"] == 0
    assert default_queue.get_state(result.id) == "wait"
    assert default_queue.get_state(delayed.id) == "delayed"


def test_a_rolled_back_enqueue_never_runs(default_queue):
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            result = tasks.add.enqueue(1, 2)
            tasks.add.using(run_after=timezone.now() + timedelta(seconds=1)).enqueue(1, 2)
            raise RuntimeError("roll back")
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result.id)
    counts = default_queue.counts()
    assert counts["wait"] == counts["delayed"] == 0


def test_enqueue_on_commit_can_be_switched_off(default_queue, settings):
    settings.TASKS = {"default": {"BACKEND": "echomq_django.backends.EchoMQBackend",
                                  "QUEUES": ["default", "demo"], "OPTIONS": {"ENQUEUE_ON_COMMIT": False}}}
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            result = tasks.add.enqueue(1, 2)
            raise RuntimeError("roll back")
    assert default_queue.get_state(result.id) == "wait", "sent at once, so the rollback does not undo it"


def test_non_json_arguments_are_refused_at_enqueue(default_queue):
    with pytest.raises(TypeError) as refused:  # as Django's backends do
        tasks.add.enqueue({1, 2}, 3)
    assert isinstance(refused.value, PayloadError), "and still a PayloadError, as before"
    with pytest.raises(TypeError, match="the limit is"):
        tasks.add.enqueue("x" * 600_000, 0)  # refused at enqueue, not when the commit sends it
    assert default_queue.counts()["wait"] == 0


def test_a_non_json_return_value_fails_the_task(default_queue):
    result = tasks.returns_a_set.enqueue()
    work()
    failed = tasks.returns_a_set.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    # Django's own words, as its ImmediateBackend gives them (its test_complex_return_value checks them).
    assert default_queue.get_job(result.id).failed_reason == "TypeError: Unsupported type: <class 'set'>"
    assert failed.errors[-1].exception_class is TypeError
    assert failed.errors[-1].traceback.endswith("TypeError: Unsupported type: <class 'set'>\n")
    assert len(failed.errors) == 1, "not run again: another attempt would return the same"


@pytest.mark.parametrize("path, reason", [
    ("os.system", "not inside an installed app"),
    ("demo_project.demo_app.jobs.greet", "is not a Django Task"),
    ("demo_project.demo_app.tasks.nothing_here", "cannot import"),
    ("demo_project.demo_app.gone.task", "ModuleNotFoundError: No module named 'demo_project.demo_app.gone'"),
])
def test_the_worker_runs_only_task_objects_of_installed_apps(default_queue, path, reason):
    job_id = default_queue.add(path, {"args": ["echo owned"], "kwargs": {},
                                      "task": {"backend": "default", "priority": 0}})
    work()
    job = default_queue.get_job(job_id)
    assert default_queue.get_state(job_id) == "failed" and reason in job.failed_reason
    assert job.attempts_made == 1, "not retried"


def test_signals_are_sent(default_queue):
    seen = []

    def record(sender, task_result, **kwargs):
        seen.append((kwargs["signal"], task_result.status))

    for signal in (task_enqueued, task_started, task_finished):
        signal.connect(record)
    try:
        with transaction.atomic():
            result = tasks.add.enqueue(1, 1)
            assert seen == [], "enqueued is sent once the job is really sent"
        work()
    finally:
        for signal in (task_enqueued, task_started, task_finished):
            signal.disconnect(record)
    assert seen == [(task_enqueued, TaskResultStatus.READY), (task_started, TaskResultStatus.RUNNING),
                    (task_finished, TaskResultStatus.SUCCESSFUL)]
    assert tasks.add.get_result(result.id).is_finished


def test_the_backend_checks_its_configuration(settings):
    settings.TASKS = {"default": {"BACKEND": "echomq_django.backends.EchoMQBackend",
                                  "QUEUES": ["default", "bad:queue", "elsewhere"],
                                  "OPTIONS": {"ENQUEUE_ON_COMMIT": "yes", "DATABASE": "nope", "COLOUR": 1}}}
    ids = {message.id for message in task_backends["default"].check()}
    assert ids == {"echomq.E010", "echomq.E014", "echomq.W011", "echomq.E011", "echomq.E012"}


def test_manage_py_check_runs_the_backend_checks(tmp_path):
    """Nothing else imports the Tasks framework before the check registry is read: the app's ready() does."""
    (tmp_path / "unserved_settings.py").write_text(
        "from demo_project.settings import *  # noqa: F403\n"
        "TASKS = {'default': {'BACKEND': 'echomq_django.backends.EchoMQBackend', 'QUEUES': ['default', 'unserved']}}\n")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "unserved_settings",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    checked = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=60)
    assert checked.returncode == 1 and "echomq.E014" in checked.stderr, checked.stderr


def test_invalid_task_options_are_refused():
    with pytest.raises(InvalidTask, match="attempts"):
        tasks.add.using(priority=0).__class__(func=tasks.add.func, attempts=0)


@pytest.mark.slow
def test_a_task_killed_mid_run_is_recovered_with_its_attempt_recorded(default_queue, subprocess_env):
    result = tasks.slow_first_attempt.enqueue(30)
    worker = subprocess.Popen([sys.executable, "manage.py", "echomq_worker", "--queue", "default", "-v", "0"],
                              cwd=ROOT, env=subprocess_env)
    try:
        assert wait_until(lambda: tasks.slow_first_attempt.get_result(result.id).status
                          == TaskResultStatus.RUNNING, 15)
        worker.kill()  # SIGKILL in the middle of the task
        worker.wait(5)
    finally:
        if worker.poll() is None:
            worker.kill()
    kill_lock(default_queue, result.id)  # the 30 s lock lapses
    sweep(default_queue)
    assert sweep(default_queue).recovered == 1
    recovered = tasks.slow_first_attempt.get_result(result.id)
    assert recovered.status == TaskResultStatus.READY and recovered.attempts == 1
    work()
    done = tasks.slow_first_attempt.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == 2, "TaskContext.attempt counts the attempt the stall used"
    assert len(done.worker_ids) == 2 and done.worker_ids[0] != done.worker_ids[1]
    assert default_queue.get_job(result.id).stall_count == 1
