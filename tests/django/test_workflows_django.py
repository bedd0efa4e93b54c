"""Workflows in Django: `fn.s()` of @job functions and EchoMQ tasks, chain/group/chord, through echomq_worker."""

import asyncio

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import transaction

from demo_project.demo_app import tasks
from echomq_django import jobs
from echomq_django.core import PayloadError, Queue
from echomq_django.tasks_compat import TaskResultStatus
from echomq_django.workflows import Signature, WorkflowError, WorkflowResult, chain, chord, group, signature

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queues(settings, redis_url, prefix, redis_client, monkeypatch):
    """Queues `default` and `demo` on this test's prefix, and a registry that forgets this test's jobs."""
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "demo": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    return {name: Queue(name, redis_client, prefix=prefix) for name in ("default", "demo")}


def register():
    """The test's job functions: add, total, fail."""
    add = jobs.job(name="wf.add")(lambda *numbers: sum(numbers))
    total = jobs.job(name="wf.total", queue="demo")(lambda numbers, extra=0: sum(numbers) + extra)
    fail = jobs.job(name="wf.fail", attempts=1)(_fail)
    report = jobs.job(name="wf.report")(lambda job_id, error: f"{job_id}: {error}")
    return add, total, fail, report


def _fail(*args):
    raise RuntimeError("no")


def work(rounds: int = 4) -> None:
    for _ in range(rounds):
        for queue in ("default", "demo"):
            call_command("echomq_worker", "--queue", queue, "--burst", "-v", "0")


def test_chain_group_and_chord_of_job_functions(queues):
    add, total, _, _ = register()
    flow = chain(add.s(1, 2), add.s(10), chord(group(add.si(n) for n in range(5)), total.s(extra=100)))
    result = flow.enqueue()
    assert isinstance(result, WorkflowResult) and result.status == "waiting"
    work()
    assert result.status == "succeeded" and result.results() == 110
    assert result.wait(timeout=1) == 110


def test_a_failure_runs_on_error_and_fails_what_comes_after(queues):
    add, _, fail, report = register()
    result = chain(add.s(1), fail.s(), add.s(5), on_error=report.s()).enqueue()
    work()
    assert result.status == "failed"
    with pytest.raises(WorkflowError, match="RuntimeError: no"):
        result.wait(timeout=1)
    [reported] = [job for job in queues["default"].get_jobs("completed", 0, 10) if job.name == "wf.report"]
    assert reported.returnvalue.endswith("failed: RuntimeError: no")


def test_allow_failure_and_set_options(queues):
    add, total, fail, _ = register()
    result = chord([add.s(1).set(queue="demo", priority=5), fail.s().set(allow_failure=True)], total.si([7])).enqueue()
    assert queues["demo"].counts()["prioritized"] == 1
    work()
    assert result.results() == 7
    with pytest.raises(WorkflowError, match="unknown option"):
        add.s().set(colour="red")
    with pytest.raises(WorkflowError, match="allow_failure is True or False"):
        add.s().set(allow_failure="no")
    with pytest.raises(PayloadError, match="priority"):
        chain(add.s().set(priority=1000)).enqueue()


def test_tasks_are_steps_too_and_keep_their_task_result(queues):
    add, _, _, _ = register()
    result = chain(tasks.add.s(2, 3), add.s(10)).enqueue()
    work()
    assert result.results() == 15
    [task_job] = [job for job in queues["default"].get_jobs("completed", 0, 10) if job.name.endswith("tasks.add")]
    task_result = tasks.add.get_result(task_job.id)
    assert task_result.status == TaskResultStatus.SUCCESSFUL and task_result.return_value == 5


def test_bad_input_is_refused_and_nothing_is_added(queues):
    add, _, _, _ = register()
    with pytest.raises(WorkflowError, match="no job function named 'nope'"):
        signature("nope")
    with pytest.raises(PayloadError):
        chain(add.s(1), add.s({1, 2})).enqueue()
    with pytest.raises(WorkflowError, match="at least one member"):
        group([]).enqueue()
    with pytest.raises(ImproperlyConfigured, match="not in ECHOMQ"):
        chain(add.s(1), add.s(2).set(queue="elsewhere")).enqueue()
    with pytest.raises(WorkflowError, match="an @job function or an EchoMQ task"):
        Signature(print)
    assert all(sum(queue.counts().values()) == 0 for queue in queues.values())


def test_with_the_outbox_a_workflow_is_added_at_the_commit(queues, settings):
    settings.ECHOMQ = {**settings.ECHOMQ, "OUTBOX": True}
    add, _, _, _ = register()
    with transaction.atomic():
        result = chain(add.s(1), add.s(2)).enqueue()
        assert queues["default"].counts()["wait"] == 0 and result.status == "unknown"
    assert queues["default"].counts()["wait"] == 1
    with pytest.raises(RuntimeError), transaction.atomic():
        chain(add.s(1), add.s(2)).enqueue()
        raise RuntimeError("rolled back")
    assert queues["default"].counts()["wait"] == 1, "a rolled-back workflow is never added"


def test_aenqueue_and_await_results(queues):
    add, _, _, _ = register()

    result = asyncio.run(chain(add.s(1), add.s(2)).aenqueue())
    work()  # (echomq_worker records signals: on the main thread)
    assert asyncio.run(result.await_results(timeout=5)) == 3


def test_workflow_ttl_setting(queues, settings, redis_client):
    settings.ECHOMQ = {**settings.ECHOMQ, "WORKFLOW_TTL": 5}
    add, _, _, _ = register()
    result = chain(add.s(1)).enqueue()
    work(1)
    assert 0 < redis_client.pttl(queues["default"].keys.workflow(result.id)) <= 5000
