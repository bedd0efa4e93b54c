"""Groups through the Django layer: @job functions and the Tasks framework put their jobs in groups that take turns."""

import pytest
from django.core.management import call_command

from demo_project.demo_app import tasks
from echomq_django import jobs
from echomq_django.core import PayloadError, Queue
from echomq_django.tasks_compat import InvalidTask, TaskResultStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def default_queue(settings, redis_url, prefix, redis_client) -> Queue:
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix,
                       "QUEUES": {"default": {"GROUP_MAX_ACTIVE": 1}, "demo": {}}}
    return Queue("default", redis_client, prefix=prefix)


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))


def group_of(queue: Queue, job_id: str) -> str | None:
    return queue.client.hget(queue.keys.job(job_id), "grp")


def mail(to: str) -> str:
    return to


def test_a_job_function_has_a_group_and_enqueue_with_gives_each_job_its_own(default_queue, registry):
    send = jobs.job(name="mail.send", queue="default", group="smtp")(mail)
    assert group_of(default_queue, send.enqueue("a@example.com")) == "smtp"
    assert group_of(default_queue, send.enqueue_with(args=("b@example.com",), group="tenant-7")) == "tenant-7"
    plain = jobs.job(name="mail.plain", queue="default")(mail)
    assert group_of(default_queue, plain.enqueue("c@example.com")) is None
    assert default_queue.counts()["wait"] == 3


@pytest.mark.parametrize("group", ["a:b", "x" * 200])
def test_a_bad_group_fails_at_the_decorator_or_the_enqueue(default_queue, registry, group):
    with pytest.raises(PayloadError):
        jobs.job(name="mail.bad", queue="default", group=group)(mail)
    send = jobs.job(name="mail.ok", queue="default")(mail)
    with pytest.raises(PayloadError):
        send.enqueue_with(args=("a@example.com",), group=group)
    assert default_queue.counts()["wait"] == 0, "bad input adds nothing"


def test_an_empty_group_is_no_group(default_queue, registry):
    send = jobs.job(name="mail.grouped", queue="default", group="smtp")(mail)
    assert group_of(default_queue, send.enqueue_with(args=("a@example.com",), group="")) is None


def test_a_task_in_a_group_takes_its_turn_and_its_result_reads_as_any_other(default_queue):
    results = [tasks.add.in_group("tenant-1").enqueue(n, n) for n in range(3)]
    other = tasks.add.in_group("tenant-2").enqueue(10, 10)
    assert [group_of(default_queue, result.id) for result in [*results, other]] == ["tenant-1"] * 3 + ["tenant-2"]
    assert tasks.add.get_result(other.id).status == TaskResultStatus.READY
    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0")
    # In the stream's own order: starts of one fetch share a millisecond.
    starts = [fields["jobId"] for _id, fields in default_queue.client.xrange(default_queue.keys.events)
              if fields["event"] == "active"]
    assert starts.index(other.id) <= 1, "tenant-2 did not wait for tenant-1's backlog"
    assert tasks.add.get_result(other.id).return_value == 20


def test_a_task_group_is_checked_when_the_task_is_made(default_queue):
    with pytest.raises(InvalidTask, match="may hold only"):
        tasks.add.in_group("no spaces")
    with pytest.raises(InvalidTask, match="cannot have a priority"):
        tasks.add.using(priority=5).in_group("tenant-1")
