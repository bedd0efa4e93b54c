"""A job's own time limits (@job, @task) in its stored options; current_job() as where a job is stopped;
a cancelled task's result; what a child of the processes pool runs first."""

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from demo_project.demo_app import tasks
from echomq_django import backends, jobs
from echomq_django.core import JobCancelled, PayloadError, Queue, SoftTimeLimitExceeded, TimeLimitExceeded
from echomq_django.queues import get_queue
from echomq_django.tasks_compat import TaskResultStatus, task_backends

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def registry(monkeypatch):
    """The @job registry and the tasks seen with a time limit (for the checks) as they are, restored after the test."""
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    monkeypatch.setattr(backends, "_time_limited", dict(backends._time_limited))


@pytest.fixture
def default_queue(settings, redis_url, prefix, redis_client) -> Queue:
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "demo": {}}}
    settings.TASKS = {"default": {"BACKEND": "echomq_django.backends.EchoMQBackend", "QUEUES": [],
                                  "OPTIONS": {"ENQUEUE_ON_COMMIT": False}}}
    return Queue("default", redis_client, prefix=prefix)


def report(*args) -> str:
    return "report"


def test_job_limits_land_in_the_stored_options(registry, default_queue):
    limited = jobs.job(name="reports.limited", time_limit=2.5, soft_time_limit=0.5)(report)
    assert (limited.time_limit, limited.soft_time_limit) == (2.5, 0.5)
    job = default_queue.get_job(limited.enqueue(1))
    assert (job.opts.time_limit_ms, job.opts.soft_time_limit_ms) == (2500, 500)
    raw = json.loads(default_queue.client.hget(default_queue.keys.job(job.id), "opts"))
    assert (raw["timeLimit"], raw["softTimeLimit"]) == (2500, 500), "as the protocol stores them"
    delayed = default_queue.get_job(limited.enqueue_with(delay_ms=60_000))
    assert (delayed.opts.time_limit_ms, delayed.opts.delay_ms) == (2500, 60_000)


def test_a_job_without_limits_stores_none(registry, default_queue):
    plain = jobs.job(name="reports.plain")(report)
    job = default_queue.get_job(plain.enqueue())
    assert (job.opts.time_limit_ms, job.opts.soft_time_limit_ms) == (0, 0)
    assert "timeLimit" not in json.loads(default_queue.client.hget(default_queue.keys.job(job.id), "opts"))
    soft_only = jobs.job(name="reports.soft", soft_time_limit=3)(report)
    assert default_queue.get_job(soft_only.enqueue()).opts.soft_time_limit_ms == 3000


@pytest.mark.parametrize("limits, words", [
    ({"time_limit": 0}, "time_limit must be a positive number of seconds up to ten years, or None, not 0"),
    ({"time_limit": -2}, "not -2"),
    ({"time_limit": "30"}, "not '30'"),
    ({"time_limit": True}, "not True"),
    ({"time_limit": float("inf")}, "not inf"),
    ({"soft_time_limit": float("nan")}, "soft_time_limit must be a positive number"),
    ({"soft_time_limit": 10 * 365 * 86_400 + 1}, "up to ten years"),
    ({"time_limit": 5, "soft_time_limit": 5}, "must be shorter than the time limit"),
    ({"time_limit": 1, "soft_time_limit": 2}, "must be shorter than the time limit"),
])
def test_a_wrong_job_limit_fails_where_the_job_is_declared(registry, limits, words):
    with pytest.raises(PayloadError, match=words):
        jobs.job(name="reports.wrong", **limits)
    assert "reports.wrong" not in jobs.registered_jobs()


@pytest.mark.django_db
def test_task_limits_land_in_the_stored_options(registry, default_queue):
    backend = task_backends["default"]
    limited = backend.task_class(func=tasks.add.func, time_limit=60, soft_time_limit=59.5)
    result = limited.enqueue(1, 2)
    job = default_queue.get_job(result.id)
    assert (job.opts.time_limit_ms, job.opts.soft_time_limit_ms) == (60_000, 59_500)
    assert job.opts.attempts == 3, "the queue's, as for any option the task leaves out"
    moved = default_queue.get_job(limited.using(priority=5).enqueue(3, 4).id)
    assert (moved.opts.time_limit_ms, moved.opts.priority) == (60_000, 5), "using() keeps the limits"
    plain = default_queue.get_job(tasks.add.enqueue(1, 1).id)
    assert (plain.opts.time_limit_ms, plain.opts.soft_time_limit_ms) == (0, 0)


def test_current_job_is_none_outside_a_job():
    assert jobs.current_job() is None


class Gate:
    """Where a job waits for the test, as a running job waits for anything."""

    def __init__(self) -> None:
        self.started, self.go = threading.Event(), threading.Event()


gate = Gate()


def run_in_a_thread(default_queue, function, *, interrupt=None) -> dict:
    """Run a job of `function` through run_job on a thread; interrupt it, as the worker does, while it waits.

    What it returned ("value") or raised ("error").
    """
    global gate
    gate = Gate()
    registered = jobs.job(name="checks.current")(function)
    job = default_queue.get_job(registered.enqueue())
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = jobs.run_job(job)
        except BaseException as error:  # the test looks at what it was
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    assert gate.started.wait(5)
    if interrupt is not None:
        job.interrupt(interrupt)
    gate.go.set()
    thread.join(5)
    return outcome


def waits_then_checks():
    assert jobs.current_job() is not None, "nothing to raise yet"
    gate.started.set()
    gate.go.wait(5)
    jobs.current_job()
    return "ran on"


@pytest.mark.django_db
def test_current_job_raises_the_cancel_at_every_check(registry, default_queue):
    def cancelled_twice():
        try:
            waits_then_checks()
        except JobCancelled:
            pass
        jobs.current_job()  # still cancelled: a job cannot swallow it
        return "ran on"

    outcome = run_in_a_thread(default_queue, cancelled_twice, interrupt=JobCancelled("cancelled: by a test"))
    assert isinstance(outcome.get("error"), JobCancelled) and "by a test" in str(outcome["error"])


@pytest.mark.django_db
def test_current_job_raises_the_soft_limit_once(registry, default_queue):
    def cleans_up():
        try:
            waits_then_checks()
        except SoftTimeLimitExceeded:
            return "cleaned up", jobs.current_job() is not None
        return "not stopped"

    outcome = run_in_a_thread(default_queue, cleans_up, interrupt=SoftTimeLimitExceeded("soft limit"))
    assert outcome == {"value": ("cleaned up", True)}, "raised once, then the job goes on"


@pytest.mark.django_db
def test_current_job_raises_past_the_hard_limit(registry, default_queue):
    outcome = run_in_a_thread(default_queue, waits_then_checks, interrupt=TimeLimitExceeded("over"))
    assert isinstance(outcome.get("error"), TimeLimitExceeded)
    assert run_in_a_thread(default_queue, waits_then_checks) == {"value": "ran on"}, "nothing to raise: it goes on"


@pytest.mark.django_db
@pytest.mark.parametrize("reason, text", [("", "cancelled"), ("the user asked", "cancelled: the user asked")])
def test_a_cancelled_task_result_is_failed_with_the_cancel_as_its_error(default_queue, reason, text):
    result = tasks.add.enqueue(1, 2)
    assert get_queue(tasks.add.queue_name).cancel(result.id, reason)
    cancelled = tasks.add.get_result(result.id)
    assert cancelled.status == TaskResultStatus.FAILED and cancelled.finished_at is not None
    [error] = cancelled.errors
    assert error.exception_class_path == "echomq_django.core.errors.JobCancelled"
    assert error.exception_class is JobCancelled
    assert error.traceback == f"echomq_django.core.errors.JobCancelled: {text}\n"
    assert cancelled.worker_ids == [] and cancelled.attempts == 0, "it never ran"
    with pytest.raises(ValueError):
        cancelled.return_value


@pytest.mark.django_db
def test_a_failed_task_that_was_not_cancelled_has_only_its_own_errors(default_queue):
    result = tasks.add.enqueue(1, 2)
    default_queue.client.hset(default_queue.keys.job(result.id), "cxl", "cancelled: x")
    assert tasks.add.get_result(result.id).errors == [], "not failed (waiting): no error, whatever the flag"


def child_process(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "demo_project.settings", **env}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=60)


def test_child_setup_is_importable_before_django_and_sets_it_up():
    code = """
import sys
from echomq_django import child
assert not any(name == "django" or name.startswith("django.") for name in sys.modules), "Django before setup"
child.setup()
from django.apps import apps
from django.db import connections
from echomq_django.jobs import registered_jobs
assert apps.ready
assert "demo_project.demo_app.jobs.greet" in registered_jobs(), "the installed apps' jobs modules"
assert all(connection.connection is None for connection in connections.all()), "no connection left open"
print("ok")
"""
    result = child_process(code)
    assert result.returncode == 0 and result.stdout == "ok\n", result.stderr


def test_a_child_shows_the_job_lines_as_the_command_does():
    code = """
import functools, logging, pickle
from echomq_django import child
init = pickle.loads(pickle.dumps(functools.partial(child.setup, verbosity=1)))  # as the pool sends it
init()
logging.getLogger("echomq.worker").info("job 1 of queue q started")
logging.getLogger("echomq.worker").debug("not at verbosity 1")
logging.getLogger("echomq.worker").warning("a warning")
"""
    result = child_process(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "job 1 of queue q started\n" and "a warning" in result.stderr
    quiet = child_process(code.replace("verbosity=1", "verbosity=0"))
    assert quiet.stdout == "" and "a warning" in quiet.stderr


CANCEL = "echomq_django.core.errors.JobCancelled: cancelled: why\n"
OWN = "Traceback ...\necho...JobCancelled: cancelled: why\n"


@pytest.mark.parametrize("classes, traces, expected", [
    # cancelled before it ran, after a failed attempt: that error, then the cancel
    (["builtins.ValueError"], ["Traceback ...\nValueError: x\n"], ["Traceback ...\nValueError: x\n", CANCEL]),
    # stopped by the worker (a killed child): its attempt's JobCancelled, given the reason
    (["echomq_django.core.errors.JobCancelled"], [""], [CANCEL]),
    # a thread that raised it at a check: its own traceback, which gives the reason, is kept
    (["echomq_django.core.errors.JobCancelled"], [OWN], [OWN]),
])
def test_a_cancelled_task_has_one_cancel_error_last(classes, traces, expected):
    from echomq_django.backends import task_result_of
    from echomq_django.core import Job, JobOptions

    job = Job(queue="default", id="t1", name=tasks.add.module_path, data={"args": [], "kwargs": {}, "task": {}},
              opts=JobOptions(), error_classes=classes, stacktrace=traces, cancel_reason="cancelled: why",
              failed_reason="cancelled: why")
    errors = task_result_of(job, tasks.add, TaskResultStatus.FAILED).errors
    assert [error.traceback for error in errors] == expected
    assert errors[-1].exception_class is JobCancelled
