"""A job or a task sent to a queue outside ECHOMQ["QUEUES"] would never run: check and enqueue refuse it."""

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from demo_project.demo_app import tasks
from echomq_django import jobs
from echomq_django.core import Queue
from echomq_django.tasks_compat import InvalidTask, task_backends

BACKEND = "echomq_django.backends.EchoMQBackend"


@pytest.fixture
def registry(monkeypatch):
    """The @job registry as it is, restored after the test (the jobs a test registers do not linger)."""
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))


@pytest.fixture
def configured(settings, redis_url, prefix):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "demo": {},
                                                                                  "heavy": {"POOL": "processes"},
                                                                                  "api": {}}}


def make_report() -> str:
    return "report"


def job_check_errors(name: str) -> list[checks.CheckMessage]:
    return [message for message in checks.run_checks(tags=["echomq_jobs"]) if name in message.msg]


def test_a_job_on_an_unconfigured_queue_is_refused_at_enqueue(registry, configured, redis_client, prefix):
    reports = jobs.job(name="reports.make", queue="reports")(make_report)
    with pytest.raises(ImproperlyConfigured, match=r"@job reports\.make .*queue 'reports' is not in ECHOMQ"):
        reports.enqueue()
    with pytest.raises(ImproperlyConfigured):
        reports.enqueue_with(delay_ms=1000)
    assert Queue("reports", redis_client, prefix=prefix).counts()["wait"] == 0, "nothing was sent"


def test_the_check_names_the_job_and_its_queue(registry, configured, settings):
    jobs.job(name="reports.make", queue="reports")(make_report)
    [error] = job_check_errors("reports.make")
    assert error.id == "echomq.E013" and error.level == checks.ERROR
    assert "'reports'" in error.msg and "'reports'" in error.hint
    settings.ECHOMQ = {**settings.ECHOMQ, "QUEUES": {"default": {}, "demo": {}, "reports": {}}}
    assert job_check_errors("reports.make") == []


def test_the_demo_jobs_pass_the_check(configured, project_jobs_only):
    assert checks.run_checks(tags=["echomq_jobs"]) == []


def test_broken_settings_leave_the_job_check_to_the_settings_check(registry, settings):
    jobs.job(name="reports.make", queue="reports")(make_report)
    settings.ECHOMQ = {"QUEUES": "reports"}
    assert checks.run_checks(tags=["echomq_jobs"]) == []
    assert {message.id for message in checks.run_checks(tags=["echomq"])} == {"echomq.E001"}


@pytest.mark.django_db
def test_enqueue_with_a_delay_on_a_configured_queue(registry, configured, redis_client, prefix):
    mail = jobs.job(name="mail.send", queue="default")(make_report)
    job_id = mail.enqueue_with(args=(1,), kwargs={"to": "a"}, delay_ms=60_000)
    queue = Queue("default", redis_client, prefix=prefix)
    assert queue.get_state(job_id) == "delayed"
    assert queue.get_job(job_id).data == {"args": [1], "kwargs": {"to": "a"}}


@pytest.mark.django_db
def test_a_task_on_an_unconfigured_queue_is_refused_at_enqueue(configured, settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": []}}  # Django's "any queue"
    with pytest.raises(InvalidTask, match="queue 'reports' is not in ECHOMQ"):
        tasks.add.using(queue_name="reports").enqueue(1, 2)


def test_the_backend_check_refuses_queues_outside_echomq(configured, settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "reports"]}}
    [error] = task_backends["default"].check()
    assert error.id == "echomq.E014" and error.level == checks.ERROR and "'reports'" in error.msg
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "demo"]}}
    assert task_backends["default"].check() == []
