"""Workflows through the transactional outbox (outbox/workflows.py): a row of the transaction, added once."""


import pytest
from django.core.management import call_command
from django.db import transaction

from echomq_django import jobs, outbox
from echomq_django.core import Queue, now_ms
from echomq_django.outbox import OutboxJob, OutboxWorkflow
from echomq_django.outbox import workflows as outbox_workflows
from echomq_django.workflows import WorkflowError, WorkflowResult, chain, chord, group

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit callbacks run only on a real commit

UNREACHABLE_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1


@pytest.fixture
def queues(settings, redis_url, prefix, redis_client, monkeypatch):
    """Queues `default` and `demo` with the outbox on, on this test's prefix; a registry that forgets its jobs."""
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "OUTBOX": True, "ENQUEUE_TIMEOUT": 1,
                       "QUEUES": {"default": {}, "demo": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    return {name: Queue(name, redis_client, prefix=prefix) for name in ("default", "demo")}


def register():
    """The test's job functions: add (on default), total (on demo), report (an error handler)."""
    add = jobs.job(name="wf.add")(lambda *numbers: sum(numbers))
    total = jobs.job(name="wf.total", queue="demo")(lambda numbers, extra=0: sum(numbers) + extra)
    report = jobs.job(name="wf.report")(lambda job_id, error: f"{job_id}: {error}")
    return add, total, report


def work(rounds: int = 4) -> None:
    for _ in range(rounds):
        for queue in ("default", "demo"):
            call_command("echomq_worker", "--queue", queue, "--burst", "-v", "0")


def relay(now: int | None = None) -> outbox.Sent:
    """A relay's pass over the workflow rows, batch after batch, `now` 6 s on (past RELAY_AFTER_S) unless given."""
    now = now_ms() + 6_000 if now is None else now
    total, past = outbox.Sent(), None
    while True:
        sent, past = outbox_workflows.relay_batch(now=now, past=past)
        total += sent
        if past is None:
            return total


def jobs_in_redis(queues) -> int:
    return sum(sum(queue.counts().values()) for queue in queues.values())


def each_ran_once(queues, workflow_id: str, numbers: range) -> None:
    for number in numbers:
        found = [queue.get_job(f"{workflow_id}-{number}") for queue in queues.values()]
        [job] = [job for job in found if job is not None]
        assert job.attempts_started == 1, (job.id, job.attempts_started)


def test_a_workflow_enqueued_in_a_transaction_is_one_row_with_its_id_until_the_commit_then_added(queues):
    add, total, report = register()
    with transaction.atomic():
        result = chain(add.s(1, 2), chord([add.s(10), add.si(20)], total.s(extra=100)), on_error=report.s()).enqueue()
        row = OutboxWorkflow.objects.get()
        assert (row.queue, row.workflow_id, row.jobs) == ("default", result.id, 5)
        assert jobs_in_redis(queues) == 0 and result.status == "unknown", "nothing reaches Redis before the commit"
        assert not OutboxJob.objects.exists()
    assert result.status == "waiting" and not OutboxWorkflow.objects.exists()
    assert queues["default"].get_job(f"{result.id}-0") is not None, "the id given in the transaction is the one added"
    work()
    assert result.results() == 3 + 10 + 20 + 100
    each_ran_once(queues, result.id, range(1, 5))  # job 0, the error handler (planned first), is never needed


def test_a_rollback_writes_and_adds_nothing_and_outside_a_transaction_a_workflow_goes_straight_to_redis(queues):
    add, _, _ = register()
    with pytest.raises(RuntimeError), transaction.atomic():
        chain(add.s(1), add.s(2)).enqueue()
        raise RuntimeError("rolled back")
    assert not OutboxWorkflow.objects.exists() and jobs_in_redis(queues) == 0
    result = chain(add.s(1), add.s(2)).enqueue()
    assert result.status == "waiting" and not OutboxWorkflow.objects.exists()


def test_redis_away_at_the_commit_leaves_the_row_the_commit_does_not_raise_and_the_relay_adds_it_once(
        queues, settings, redis_url):
    add, total, report = register()
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": UNREACHABLE_URL}
    with transaction.atomic():  # the commit never raises for Redis
        result = chord(group(add.s(n) for n in range(3)), total.s(), on_error=report.s()).enqueue()
    assert OutboxWorkflow.objects.get().workflow_id == result.id
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": redis_url}
    result = WorkflowResult(queues["default"], result.id)  # its handle on the Redis that is back
    assert relay(now=now_ms()).sent == 0, "a row younger than RELAY_AFTER_S is its process's to send"
    assert relay().sent == 1 and not OutboxWorkflow.objects.exists()
    work()
    assert result.results() == 3
    each_ran_once(queues, result.id, range(1, 5))  # job 0, the error handler, is never needed


def test_a_row_sent_twice_adds_its_workflow_once_even_after_its_jobs_ran_and_were_trimmed(queues, settings):
    add, total, _ = register()
    with transaction.atomic():
        result = chain(add.s(1), chord([add.s(2), add.s(3).set(queue="demo")], total.s())).enqueue()
        row = OutboxWorkflow.objects.get()
    work()
    assert result.results() == 3 + 4
    for number in range(4):  # as retention trims completed jobs
        assert any(queue.remove(f"{result.id}-{number}") for queue in queues.values())
    row.save(force_insert=True)  # as if the process had died between the add and the delete
    assert relay().sent == 1 and not OutboxWorkflow.objects.exists()
    assert jobs_in_redis(queues) == 0 and result.status == "succeeded", "nothing added, nothing run again"
    # Each call's record outlives every row that may still be sent, not only the 30 s of a direct add.
    records = [key for queue in queues.values()
               for key in queue.client.scan_iter(queue.keys.add_record(result.id + ".*"))]
    max_age_ms = settings.ECHOMQ.get("OUTBOX_MAX_AGE", 86_400) * 1000
    assert len(records) == 3 and all(queues["default"].client.pttl(key) > max_age_ms for key in records), records


def test_a_relay_that_adds_a_row_and_fails_to_delete_it_adds_nothing_the_second_time(queues, settings, redis_url):
    add, _, _ = register()
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": UNREACHABLE_URL}
    with transaction.atomic():
        result = group(add.s(n) for n in range(300)).enqueue()  # more than one addWorkflow call
        row = OutboxWorkflow.objects.get()
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": redis_url}
    result = WorkflowResult(queues["default"], result.id)
    assert relay().sent == 1
    work(1)
    assert result.results() == list(range(300))
    for number in range(300):
        queues["default"].remove(f"{result.id}-{number}")
    row.save(force_insert=True)  # the relay's delete lost (it was killed, or its database failed)
    assert relay().sent == 1 and jobs_in_redis(queues) == 0 and result.status == "succeeded"


def test_a_workflow_too_large_for_a_row_is_refused_in_the_transaction_and_nothing_is_written(queues):
    add, _, _ = register()
    big = "x" * 500_000  # under MAX_PAYLOAD_BYTES per job; 40 of them are more than a row holds
    with transaction.atomic():
        with pytest.raises(WorkflowError, match="more than the 16,777,216 a row holds"):
            group(add.si(big) for _ in range(40)).enqueue()
        assert not OutboxWorkflow.objects.exists()
    assert jobs_in_redis(queues) == 0 and not OutboxWorkflow.objects.exists()


def test_a_row_that_cannot_be_planned_as_it_is_keeps_why_is_not_sent_again_and_holds_up_no_other(
        queues, settings, redis_url):
    add, _, _ = register()
    then = now_ms() - 10_000
    one_job = '["job","default","wf.add",{},{"attempts":1},false,false]'
    bad = {"wbad0": ("not json", "default", 60_000),
           "wbad1": (one_job.replace("wf.add", "has space"), "default", 60_000),
           "w bad": (one_job, "default", 60_000), "wbad3": (one_job, "demo", 60_000),
           "wbad4": (f'["chain",[{one_job}],null]', "default", 0)}
    for workflow_id, (canvas, queue, ttl_ms) in bad.items():  # rows edited by hand: the table is anyone's
        OutboxWorkflow.objects.create(queue=queue, workflow_id=workflow_id, canvas=canvas, ttl_ms=ttl_ms,
                                      timestamp_ms=then)
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": UNREACHABLE_URL}
    with transaction.atomic():
        result = chain(add.s(1), add.s(2)).enqueue()
    OutboxWorkflow.objects.filter(workflow_id=result.id).update(timestamp_ms=then + 1)  # behind the bad ones
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": redis_url}
    result = WorkflowResult(queues["default"], result.id)
    sent = relay()
    assert (sent.sent, sent.refused, sent.unsent) == (1, 5, 0) and result.status == "waiting"
    errors = dict(OutboxWorkflow.objects.values_list("workflow_id", "error"))
    assert "not a workflow as enqueue writes it" in errors["wbad0"] and "has space" in errors["wbad1"]
    assert "w bad" in errors["w bad"] and "not on its queue 'demo'" in errors["wbad3"]
    assert "TTL" in errors["wbad4"]
    assert relay().refused == 0, "a refused row is not tried again"
    state = outbox.outbox_state()["default"]
    assert (state.rows, state.refused) == (4, 4)


def test_the_admin_lists_workflow_rows_and_shows_the_start_of_a_long_canvas_escaped(queues):
    from django.contrib.auth.models import User
    from django.test import Client

    from echomq_django.admin.outbox import CANVAS_SHOWN

    canvas = '["job","default","<script>alert(1)</script>",' + '"x" ' * 100_000 + "]"
    row = OutboxWorkflow.objects.create(queue="default", workflow_id="wlong", canvas=canvas, ttl_ms=1,
                                        timestamp_ms=now_ms(), jobs=1)
    client = Client()
    client.force_login(User.objects.create_superuser("admin", "a@example.com", "pw"))
    listing = client.get("/admin/echomq/outboxworkflow/").content.decode()
    assert "wlong" in listing
    page = client.get(f"/admin/echomq/outboxworkflow/{row.pk}/change/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert f"({len(canvas):,} characters in all)" in page and len(page) < CANVAS_SHOWN + 50_000
    client.force_login(User.objects.create_user("viewer", password="pw", is_staff=True))
    assert client.get("/admin/echomq/outboxworkflow/").status_code == 403
