"""The transactional outbox (outbox/) on the test database and the real Redis, through the real scripts."""

import io
import json

import pytest
import redis
from django.contrib.auth.models import Permission, User
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import Client

from echomq_django import jobs, outbox
from echomq_django.core import Queue, now_ms
from echomq_django.outbox import OutboxJob, Relay
from tests.helpers import script_calls
from tests.redis_servers import redis_server

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit callbacks run only on a real commit

UNREACHABLE_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def record(*args, **kwargs):
    return args


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))


@pytest.fixture
def mail(registry):
    return jobs.job(name="mail.send", queue="q")(record)


@pytest.fixture
def with_outbox(settings, redis_url, prefix):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "OUTBOX": True, "ENQUEUE_TIMEOUT": 1,
                       "QUEUES": {"q": {}, "direct": {"OUTBOX": False}}}
    return settings


@pytest.fixture
def q(redis_client, prefix):
    return Queue("q", redis_client, prefix=prefix)


def test_a_job_enqueued_in_a_transaction_is_a_row_until_the_commit_then_in_redis_and_the_row_gone(
        with_outbox, mail, q):
    with transaction.atomic():
        job_id = mail.enqueue(7, to="a@example.com")
        row = OutboxJob.objects.get()
        assert (row.queue, row.job_id, row.name) == ("q", job_id, "mail.send")
        assert json.loads(row.data) == {"args": [7], "kwargs": {"to": "a@example.com"}}
        assert q.get_job(job_id) is None, "nothing reaches Redis before the commit"
    job = q.get_job(job_id)
    assert job is not None and job.data == {"args": [7], "kwargs": {"to": "a@example.com"}}
    assert not OutboxJob.objects.exists()


def test_a_rollback_sends_nothing_and_a_rolled_back_savepoint_only_its_own_jobs(with_outbox, mail, q):
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        mail.enqueue(1)
        1 / 0
    assert q.counts()["wait"] == 0 and not OutboxJob.objects.exists()
    with transaction.atomic():
        kept = mail.enqueue(2)
        with pytest.raises(ZeroDivisionError), transaction.atomic():
            mail.enqueue(3)
            1 / 0
        also_kept = mail.enqueue(4)
    assert sorted(q.get_jobs("wait")[i].id for i in range(2)) == sorted([kept, also_kept])
    assert q.counts()["wait"] == 2 and not OutboxJob.objects.exists()


def test_outside_a_transaction_or_with_the_queue_off_an_enqueue_goes_straight_to_redis(
        with_outbox, mail, registry, redis_client, prefix, q):
    assert q.get_job(mail.enqueue(1)) is not None
    direct = jobs.job(name="direct.send", queue="direct")(record)
    with transaction.atomic():
        job_id = direct.enqueue(1)
        assert Queue("direct", redis_client, prefix=prefix).get_job(job_id) is not None
    assert not OutboxJob.objects.exists()


def test_a_transactions_jobs_go_in_one_round_trip_per_queue_with_their_delays_counted_from_their_enqueue(
        with_outbox, mail, q):
    with transaction.atomic():
        ids = [mail.enqueue(n) for n in range(100)]
        delayed = mail.enqueue_with(args=(1,), delay_ms=60_000)
        enqueued_at = OutboxJob.objects.get(job_id=delayed).timestamp_ms
    assert q.counts()["wait"] == 100 and q.counts()["delayed"] == 1
    assert {job.id for job in q.get_jobs("wait", 0, 100)} == set(ids)
    assert q.client.zscore(q.keys.delayed, delayed) == enqueued_at + 60_000


def test_redis_away_at_the_commit_leaves_the_rows_and_the_commit_does_not_raise_then_the_relay_sends_them(
        with_outbox, mail, settings, redis_url, q):
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": UNREACHABLE_URL}
    with transaction.atomic():
        ids = [mail.enqueue(n) for n in range(3)]
    assert sorted(OutboxJob.objects.values_list("job_id", flat=True)) == sorted(ids)
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": redis_url}
    assert outbox.relay().sent == 0, "rows younger than RELAY_AFTER_S are their process's to send"
    assert outbox.relay(now=now_ms() + 6_000).sent == 3
    assert sorted(job.id for job in q.get_jobs("wait")) == sorted(ids)
    assert not OutboxJob.objects.exists()


def test_a_row_sent_twice_adds_its_job_once_even_after_the_job_completed_and_was_trimmed(with_outbox, mail, q):
    with transaction.atomic():
        job_id = mail.enqueue(1)
        row = OutboxJob.objects.get()
    assert q.get_job(job_id) is not None
    assert q.remove(job_id)  # as retention trims a completed job
    row.save(force_insert=True)  # as if the process had died between the add and the delete
    assert outbox.send("default", [row]).sent == 1
    assert q.get_job(job_id) is None and q.counts()["wait"] == 0
    assert not OutboxJob.objects.exists()


def test_the_relay_leaves_rows_older_than_outbox_max_age_and_reports_them(with_outbox, mail, settings, q):
    settings.ECHOMQ = {**settings.ECHOMQ, "OUTBOX_MAX_AGE": 60}
    old = OutboxJob.objects.create(queue="q", job_id="told", name="mail.send", data="{}", opts='{"attempts": 3}',
                                   timestamp_ms=now_ms() - 61_000)
    assert outbox.relay().sent == 0
    assert q.get_job(old.job_id) is None
    assert outbox.outbox_state()["q"].stale == 1


def test_a_row_that_cannot_be_sent_as_it_is_keeps_why_is_not_sent_again_and_holds_up_no_other(
        with_outbox, mail, q):
    then = now_ms() - 10_000
    bad = OutboxJob.objects.create(queue="q", job_id="tbad", name="has space", data="{}", opts="{}",
                                   timestamp_ms=then)
    OutboxJob.objects.create(queue="q", job_id="tbad2", name="mail.send", data="{}", opts="{}", priority=10**9,
                             timestamp_ms=then)
    good = OutboxJob.objects.create(queue="q", job_id="tgood", name="mail.send", data="{}", opts='{"attempts": 1}',
                                    timestamp_ms=then)
    sent = outbox.relay()
    assert (sent.sent, sent.refused) == (1, 2)
    assert q.get_job(good.job_id) is not None
    bad.refresh_from_db()
    assert "job name" in bad.error
    assert outbox.relay(now=now_ms() + 60_000).refused == 0, "a refused row is not sent again"
    state = outbox.outbox_state()["q"]
    assert (state.rows, state.refused, state.stale) == (2, 2, 0)


def test_a_call_redis_refuses_leaves_its_rows_to_be_sent_again_once_redis_takes_them(with_outbox, mail, q):
    q.client.set(q.keys.sent, "a string where the script wants a sorted set")
    with transaction.atomic():
        job_id = mail.enqueue(1)
    row = OutboxJob.objects.get()
    assert row.error == "" and q.get_job(job_id) is None
    q.client.delete(q.keys.sent)
    assert outbox.relay(now=now_ms() + 6_000).sent == 1
    assert q.get_job(job_id) is not None and not OutboxJob.objects.exists()


def test_a_task_enqueued_in_a_transaction_goes_through_the_outbox(with_outbox, settings, redis_client, prefix):
    from demo_project.demo_app import tasks

    settings.ECHOMQ = {**settings.ECHOMQ, "QUEUES": {**settings.ECHOMQ["QUEUES"], "default": {}}}
    default = Queue("default", redis_client, prefix=prefix)
    with transaction.atomic():
        result = tasks.add.enqueue(2, 3)
        assert OutboxJob.objects.filter(job_id=result.id).exists()
        assert default.get_job(result.id) is None
    assert default.get_job(result.id) is not None and not OutboxJob.objects.exists()


def test_a_callers_id_enqueued_twice_in_one_transaction_is_one_row_and_one_job(with_outbox, mail, q):
    with transaction.atomic():
        assert mail.enqueue_with(args=(1,), job_id="welcome-42") == "welcome-42"
        assert mail.enqueue_with(args=(2,), job_id="welcome-42") == "welcome-42"
        assert OutboxJob.objects.count() == 1
    assert q.counts()["wait"] == 1 and q.get_job("welcome-42").data["args"] == [1]


def stranded(q, job_ids, age_s=10):
    """Rows left behind as if their process had died after the commit: `age_s` old."""
    then = now_ms() - age_s * 1000
    return [OutboxJob.objects.create(queue=q.name, job_id=job_id, name="mail.send", data='{"args": [], "kwargs": {}}',
                                     opts='{"attempts": 1}', timestamp_ms=then) for job_id in job_ids]


def test_echomq_relay_once_and_the_sweepers_pass_send_what_their_processes_did_not(with_outbox, q):
    stranded(q, ["ta", "tb"])
    out = io.StringIO()
    call_command("echomq_relay", "--once", stdout=out)
    assert "outbox: sent 2, refused 0, left to retry 0" in out.getvalue()
    assert {job.id for job in q.get_jobs("wait")} == {"ta", "tb"}
    stranded(q, ["tc"])
    call_command("echomq_sweep", "--once", "--queue", "q", stdout=io.StringIO())
    assert q.get_job("tc") is not None and not OutboxJob.objects.exists()
    stranded(q, ["td"])
    call_command("echomq_sweep", "--once", "--queue", "q", "--no-relay", stdout=io.StringIO())
    assert q.get_job("td") is None and OutboxJob.objects.count() == 1


def test_echomq_relay_after_0_sends_every_row_now_and_a_negative_after_is_refused(with_outbox, q):
    stranded(q, ["tnow"], age_s=0)  # a row of this very millisecond: "relay everything now" includes it
    out = io.StringIO()
    call_command("echomq_relay", "--once", "--after", "0", stdout=out)
    assert "outbox: sent 1, refused 0, left to retry 0" in out.getvalue()
    assert q.get_job("tnow") is not None and not OutboxJob.objects.exists()
    for after in ("-1", "nan", "inf"):
        with pytest.raises(CommandError, match="--after"):
            call_command("echomq_relay", "--once", "--after", after, stdout=io.StringIO())


def test_the_relay_sends_at_most_send_jobs_per_call_jobs_in_a_script_call_and_one_timestamp_to_a_call(
        with_outbox, settings, prefix):
    with redis_server() as url:  # of the test's own: its command counts are this relay's alone
        settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": url}
        client = redis.Redis.from_url(url, decode_responses=True, encoding_errors="replace")
        queue = Queue("q", client, prefix=prefix)
        rows = stranded(queue, [f"r{n}" for n in range(2 * outbox.SEND_JOBS_PER_CALL + 50)])
        rows += stranded(queue, ["s0", "s1", "s2"], age_s=5)
        before = script_calls(client)
        call_command("echomq_relay", "--once", stdout=io.StringIO())
        assert script_calls(client) - before == 3 + 1, "250 rows of one timestamp in 100, 100 and 50; 3 of another"
        assert queue.counts()["wait"] == len(rows) and not OutboxJob.objects.exists()


def test_status_prometheus_and_the_deploy_check_show_the_rows_not_yet_sent(with_outbox, settings, q):
    settings.ECHOMQ = {**settings.ECHOMQ, "OUTBOX_MAX_AGE": 60, "METRICS_TOKEN": "t" * 30}
    stranded(q, ["fresh"], age_s=10)
    stranded(q, ["stale"], age_s=120)
    out = io.StringIO()
    call_command("echomq_status", "--json", stdout=out)
    [status] = [s for s in json.loads(out.getvalue()) if s["queue"] == "q"]
    assert status["outbox"]["rows"] == 2 and status["outbox"]["stale"] == 1
    assert 119 <= status["outbox"]["oldest_age_s"] < 200
    out = io.StringIO()
    call_command("echomq_status", stdout=out)
    assert "outbox: 2 job(s) not yet in Redis" in out.getvalue() and "1 stale" in out.getvalue()
    text = Client().get("/echomq/metrics/", headers={"Authorization": "Bearer " + "t" * 30}).content.decode()
    assert 'echomq_outbox_rows{queue="q"} 2.0' in text and 'echomq_outbox_rows{queue="direct"} 0.0' in text
    found = [message for message in checks.run_checks(include_deployment_checks=True) if message.id == "echomq.W018"]
    assert len(found) == 1 and "'q' has 1 outbox row(s) older than" in found[0].msg


def test_the_dashboard_shows_a_queues_outbox_and_links_its_rows_for_those_allowed(with_outbox, q):
    stranded(q, ["tx"])
    OutboxJob.objects.filter(job_id="tx").update(error="<script>alert(1)</script>")
    admin = User.objects.create_superuser("admin", "a@example.com", "pw")
    client = Client()
    client.force_login(admin)
    page = client.get("/admin/echomq/queue/").content.decode()
    assert "outbox: 1 job(s) not yet in Redis" in page and "1 refused: never sent" in page
    assert "/admin/echomq/outboxjob/?queue=q" in page
    rows = client.get("/admin/echomq/outboxjob/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rows and "<script>alert(1)" not in rows
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_queue"))
    client.force_login(viewer)
    page = client.get("/admin/echomq/queue/").content.decode()
    assert "outbox: 1 job(s)" in page and "/admin/echomq/outboxjob/" not in page
    assert client.get("/admin/echomq/outboxjob/").status_code == 403


def test_in_a_test_case_transaction_capture_on_commit_callbacks_sends_the_rows(with_outbox, mail, q):
    from django.test import TestCase

    with transaction.atomic():  # as Django's TestCase wraps each test
        with TestCase.captureOnCommitCallbacks(execute=True):
            with transaction.atomic():
                job_id = mail.enqueue(1)
        assert q.get_job(job_id) is not None and not OutboxJob.objects.exists()


def test_a_batch_of_rows_redis_refuses_holds_up_no_other_queues_rows_behind_it(with_outbox, settings, redis_client,
                                                                                prefix, q):
    settings.ECHOMQ = {**settings.ECHOMQ, "QUEUES": {**settings.ECHOMQ["QUEUES"], "b": {}}}
    q.client.set(q.keys.sent, "a string where the script wants a sorted set")  # every call of queue q fails
    then = now_ms() - 20_000
    OutboxJob.objects.bulk_create([OutboxJob(queue="q", job_id=f"ta{n}", name="mail.send", data="{}", opts="{}",
                                             timestamp_ms=then) for n in range(outbox.RELAY_BATCH)])
    OutboxJob.objects.create(queue="b", job_id="tb", name="mail.send", data="{}", opts="{}", timestamp_ms=then + 1)
    sent = Relay().run_once()
    assert Queue("b", redis_client, prefix=prefix).get_job("tb") is not None, "queue b's row waits behind q's"
    assert (sent.sent, sent.unsent) == (1, outbox.RELAY_BATCH)
    assert OutboxJob.objects.filter(queue="q").count() == outbox.RELAY_BATCH


def test_rows_left_when_the_outbox_is_turned_off_are_still_relayed_and_reported(with_outbox, settings, q):
    stranded(q, ["tleft"])
    stranded(q, ["tstale"], age_s=120)
    settings.ECHOMQ = {**settings.ECHOMQ, "OUTBOX": False, "OUTBOX_MAX_AGE": 60}
    out = io.StringIO()
    call_command("echomq_status", stdout=out)
    assert "outbox: 2 job(s) not yet in Redis" in out.getvalue()
    found = [message for message in checks.run_checks(include_deployment_checks=True) if message.id == "echomq.W018"]
    assert len(found) == 1 and "'q' has 1 outbox row(s) older than" in found[0].msg
    call_command("echomq_sweep", "--once", "--queue", "q", stdout=io.StringIO())
    assert q.get_job("tleft") is not None
    assert list(OutboxJob.objects.values_list("job_id", flat=True)) == ["tstale"]


def test_a_relay_waiting_on_redis_fails_no_commit_of_the_database(with_outbox, settings, q):
    import socket
    import threading

    from django.contrib.auth.models import Group
    from django.db import connections

    from tests.helpers import wait_until

    silent = socket.socket()  # a Redis that takes connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    silent.settimeout(30)
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{silent.getsockname()[1]}/0",
                       "ENQUEUE_TIMEOUT": 4, "QUEUES": {"q": {}, "r": {}, "s": {}}}
    for name in ("q", "r", "s"):  # a relay pass that waits out ENQUEUE_TIMEOUT for each queue
        OutboxJob.objects.create(queue=name, job_id="tx", name="mail.send", data="{}", opts="{}",
                                 timestamp_ms=now_ms() - 10_000)
    accepted, passes = [], []

    def relay():
        try:
            passes.append(Relay().run_once())
        finally:
            connections.close_all()

    relayer = threading.Thread(target=relay)
    relayer.start()
    try:
        accepted.append(silent.accept()[0])  # the relay is sending now
        with transaction.atomic():  # a request's commit meanwhile
            Group.objects.create(name="committed while the relay waits")
    finally:
        relayer.join(60)
        for connection in accepted:
            connection.close()
        silent.close()
    assert wait_until(lambda: passes, 1) and passes[0].unsent == 3
    assert OutboxJob.objects.count() == 3


def test_a_callers_id_enqueued_again_in_a_later_transaction_once_its_job_was_removed_is_added_again(
        with_outbox, mail, q):
    with transaction.atomic():
        mail.enqueue_with(args=(1,), job_id="report-7")
    assert q.remove("report-7")  # it completed and retention trimmed it
    with transaction.atomic():
        assert mail.enqueue_with(args=(2,), job_id="report-7") == "report-7"
    job = q.get_job("report-7")
    assert job is not None and job.data["args"] == [2], "a new enqueue, as one without the outbox adds it again"
    assert not OutboxJob.objects.exists()
