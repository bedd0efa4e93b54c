"""Durable steps (echomq_django.durable) through real workers and the real scripts: replay, sleep, signals, atomic
steps and fan-outs."""

import time

import pytest
from django.contrib.auth.models import User

from echomq_django import jobs
from echomq_django.durable import (
    DurableError,
    SignalRefused,
    SignalTimeout,
    StepFailed,
    atomic_step,
    fan_out,
    sleep,
    step,
    wait_for_signal,
)
from echomq_django.models import DurableStep
from echomq_django.testing import run_jobs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def project(settings, redis_url, monkeypatch, echomq):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": echomq.prefix, "QUEUES": {"default": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    return echomq


def test_a_recorded_step_is_replayed_not_run_again(project):
    calls = []

    def effect(tag):
        calls.append(tag)
        return {"tag": tag, "n": len(calls)}

    @jobs.job(name="d.flaky", attempts=3, backoff=0)
    def flaky():
        first = step("one", effect, "a")
        second = step("two", effect, "b")
        if jobs.current_job().attempts_made < 2:
            raise RuntimeError("after the steps")
        return [first, second]

    handle = flaky.enqueue()
    run_jobs()
    assert handle.result == [{"tag": "a", "n": 1}, {"tag": "b", "n": 2}]
    assert calls == ["a", "b"]  # three attempts, each step ran once
    steps = project.queue().client.hgetall(project.queue().keys.steps(handle.id))
    assert set(steps) == {"one", "two"} and all(text.startswith('{"s":"done","k":"step"') for text in steps.values())


def test_a_step_name_used_twice_fails_the_job_with_why(project):
    @jobs.job(name="d.twice", attempts=1)
    def twice():
        step("same", lambda: 1)
        step("same", lambda: 2)

    handle = twice.enqueue()
    run_jobs()
    assert "step name 'same' is used twice" in project.queue().get_job(handle.id).failed_reason
    with pytest.raises(DurableError, match="inside a job"):
        step("outside", lambda: 1)


def test_a_sleep_frees_the_slot_and_uses_no_attempt(project):
    @jobs.job(name="d.sleeper")
    def sleeper():
        before = step("before", time.time)
        sleep("nap", 0.5)
        return time.time() - before

    handle = sleeper.enqueue()
    run_jobs(run_delayed=False)
    queue = project.queue()
    assert queue.get_state(handle.id) == "delayed"
    deadline = time.monotonic() + 30
    while queue.get_state(handle.id) != "completed" and time.monotonic() < deadline:
        run_jobs(run_delayed=False)
        time.sleep(0.05)
    job = queue.get_job(handle.id)
    assert job.returnvalue >= 0.5 and job.attempts_made == 1


def test_a_signal_resumes_a_parked_job_with_its_payload(project):
    @jobs.job(name="d.approval")
    def approval():
        decision = wait_for_signal("approved")
        return {"plan": decision["plan"]}

    handle = approval.enqueue()
    run_jobs()
    queue = project.queue()
    assert queue.get_state(handle.id) == "parked" and queue.counts()["parked"] == 1
    assert queue.counts()["active"] == 0 and not queue.client.exists(queue.keys.lock(handle.id))
    assert handle.signal("approved", {"plan": "pro"}) is True
    assert queue.get_state(handle.id) == "wait"
    with pytest.raises(SignalRefused, match="sent to it before"):
        handle.signal("approved", {"plan": "free"})
    run_jobs()
    job = queue.get_job(handle.id)
    assert job.returnvalue == {"plan": "pro"} and job.attempts_made == 1


def test_a_signal_sent_before_the_wait_is_kept(project):
    @jobs.job(name="d.early")
    def early():
        return wait_for_signal("go")

    handle = early.enqueue()
    assert handle.signal("go", [1, 2]) is False  # kept: the job has not reached its wait
    run_jobs()
    assert handle.result == [1, 2]
    with pytest.raises(SignalRefused, match="finished"):
        handle.signal("other")


def test_a_wait_times_out_in_the_job(project):
    @jobs.job(name="d.patient")
    def patient():
        try:
            wait_for_signal("never", timeout=0.3)
        except SignalTimeout:
            return "timed out"
        return "signalled"

    handle = patient.enqueue()
    queue = project.queue()
    deadline = time.monotonic() + 30
    while queue.get_state(handle.id) != "completed" and time.monotonic() < deadline:
        run_jobs()
        time.sleep(0.05)
    assert handle.result == "timed out"
    with pytest.raises(SignalRefused):
        handle.signal("never")


def test_an_atomic_step_commits_once_and_replays_its_row(project):
    @jobs.job(name="d.account", attempts=2, backoff=0)
    def account(username):
        with atomic_step("create") as created:
            created.result = User.objects.create(username=username).pk
        if jobs.current_job().attempts_made == 0:
            raise RuntimeError("after the commit")
        return created.result

    handle = account.enqueue("ada")
    run_jobs()
    assert handle.result == User.objects.get(username="ada").pk
    assert User.objects.filter(username="ada").count() == 1
    assert DurableStep.objects.filter(job_id=handle.id, name="create").count() == 1


def test_a_fan_out_returns_its_childrens_results_in_order(project):
    @jobs.job(name="d.square")
    def square(n):
        return n * n

    @jobs.job(name="d.parent")
    def parent(count):
        sizes = step("sizes", lambda: list(range(count)))
        return fan_out("squares", [square.s(n) for n in sizes])

    handle = parent.enqueue(6)
    run_jobs()
    assert handle.result == [0, 1, 4, 9, 16, 25]


def test_a_fan_out_raises_step_failed_naming_the_child(project):
    @jobs.job(name="d.bad", attempts=1)
    def bad(n):
        if n == 2:
            raise ValueError("no two")
        return n

    @jobs.job(name="d.caller")
    def caller():
        try:
            fan_out("all", [bad.s(n) for n in range(4)])
        except StepFailed as failed:
            return [failed.child_id, failed.reason]
        return "no failure"

    handle = caller.enqueue()
    run_jobs()
    child, reason = handle.result
    assert project.queue().get_job(child).data["args"] == [2] and "no two" in reason


def test_a_durable_django_task_waits_for_its_signal(settings, redis_url, prefix, redis_client):
    from django.core.management import call_command

    from demo_project.demo_app import tasks
    from echomq_django.core import Queue

    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "demo": {}}}
    queue = Queue("default", redis_client, prefix=prefix)
    result = tasks.approve_order.enqueue(7)
    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0")
    assert queue.get_state(result.id) == "parked"
    assert queue.signal(result.id, "approved", {"by": "ops"}) is True
    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0")
    done = tasks.approve_order.get_result(result.id)
    assert done.return_value == {"order": 7, "total": 70, "approved_by": "ops"}


def test_the_sweeper_forgets_the_rows_of_jobs_gone_from_redis(project):
    from django.core.management import call_command

    from echomq_django.durable import forget_rows

    @jobs.job(name="d.rows")
    def rows(n):
        with atomic_step("only") as only:
            only.result = n
        return only.result

    kept, removed = rows.enqueue(1), rows.enqueue(2)
    run_jobs()
    assert DurableStep.objects.count() == 2
    project.queue().remove(removed.id)
    call_command("echomq_sweep", "--once", "--force", "-v", "0")
    assert list(DurableStep.objects.values_list("job_id", flat=True)) == [kept.id]
    assert forget_rows("default") == 0
