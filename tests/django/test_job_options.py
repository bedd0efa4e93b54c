"""The task options a Celery user reaches for on @job: priority, eta (issue 28)."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from echomq_django import jobs
from echomq_django.core import PayloadError, Queue, now_ms
from tests.helpers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queue(settings, redis_url, prefix, redis_client, monkeypatch) -> Queue:
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    return Queue("default", redis_client, prefix=prefix)


def test_priority_on_the_job_function_and_on_each_enqueue(queue):
    urgent = jobs.job(name="opts.urgent", priority=5)(lambda: None)
    first, second, third = urgent.enqueue(), urgent.enqueue_with(priority=-3), urgent.enqueue_with(priority=0)
    assert queue.get_job(first).opts.priority == 5 and queue.get_state(first) == "prioritized"
    assert queue.get_job(second).opts.priority == -3 and queue.get_state(third) == "wait"
    with pytest.raises(PayloadError, match="priority"):
        jobs.job(name="opts.loud", priority=101)(lambda: None)
    with pytest.raises(PayloadError, match="priority"):
        urgent.enqueue_with(priority=True and 1000)
    with pytest.raises(PayloadError, match="group cannot have a priority"):
        urgent.enqueue_with(group="tenant-a")
    assert queue.counts()["prioritized"] == 2 and queue.counts()["wait"] == 1, "the refused ones added nothing"


def test_eta_runs_at_a_time(queue):
    later = jobs.job(name="opts.later")(lambda: None)
    at = timezone.now() + timedelta(minutes=1)
    job_id = later.enqueue_with(eta=at)
    due = queue.client.zscore(queue.keys.delayed, job_id)
    assert queue.get_state(job_id) == "delayed" and abs(due - at.timestamp() * 1000) < 2
    assert queue.get_state(later.enqueue_with(eta=timezone.now() - timedelta(hours=1))) == "wait", "past: now"
    with pytest.raises(PayloadError, match="time zone"):
        later.enqueue_with(eta=datetime.now() + timedelta(minutes=1))  # naive, with USE_TZ
    with pytest.raises(PayloadError, match="delay_ms or eta"):
        later.enqueue_with(eta=at, delay_ms=1000)
    with pytest.raises(PayloadError, match="delay"):
        later.enqueue_with(eta=at + timedelta(days=365 * 11))
    assert queue.counts()["delayed"] == 1 and queue.counts()["wait"] == 1


def test_a_naive_eta_means_time_zone_without_use_tz(queue, settings):
    settings.USE_TZ, settings.TIME_ZONE = False, "America/New_York"
    later = jobs.job(name="opts.later")(lambda: None)
    at = datetime.now() + timedelta(minutes=5)  # naive: New York's wall clock, as Django reads it
    job_id = later.enqueue_with(eta=at)
    expected = timezone.make_aware(at).timestamp() * 1000
    assert abs(queue.client.zscore(queue.keys.delayed, job_id) - expected) < 2
    assert queue.client.zscore(queue.keys.delayed, job_id) > now_ms()


def test_expires_as_seconds_a_timedelta_or_a_datetime(queue):
    brief = jobs.job(name="opts.brief", expires=30)(lambda: None)
    created = now_ms()
    first = brief.enqueue()
    enqueued = now_ms()
    exp = int(queue.client.hget(queue.keys.job(first), "exp"))
    assert created + 30_000 <= exp <= enqueued + 30_000
    second = brief.enqueue_with(expires=timedelta(minutes=2))
    assert int(queue.client.hget(queue.keys.job(second), "exp")) - created >= 120_000
    at = timezone.now() + timedelta(hours=1)
    third = brief.enqueue_with(expires=at)
    assert abs(int(queue.client.hget(queue.keys.job(third), "exp")) - at.timestamp() * 1000) < 2
    assert queue.get_job(third).opts.expires_ms > 3_590_000


def test_bad_expiries_are_refused_and_add_nothing(queue):
    brief = jobs.job(name="opts.brief")(lambda: None)
    with pytest.raises(PayloadError, match="in the past"):
        brief.enqueue_with(expires=timezone.now() - timedelta(seconds=1))
    with pytest.raises(PayloadError, match="positive number of seconds"):
        brief.enqueue_with(expires=-5)
    with pytest.raises(PayloadError, match="positive number of seconds"):
        brief.enqueue_with(expires="soon")
    with pytest.raises(PayloadError, match="before it is due"):
        brief.enqueue_with(expires=10, delay_ms=20_000)
    with pytest.raises(PayloadError, match="a datetime goes to enqueue_with"):
        jobs.job(name="opts.fixed", expires=timezone.now())(lambda: None)
    with pytest.raises(PayloadError, match="positive number of seconds"):
        jobs.job(name="opts.never", expires=0)(lambda: None)
    assert sum(queue.counts().values()) == 0


def test_an_expired_job_fails_in_the_worker_and_shows_in_the_failed_list(queue):
    from django.core.management import call_command

    brief = jobs.job(name="opts.brief")(lambda: None)
    job_id = brief.enqueue_with(expires=0.05)
    assert wait_until(lambda: now_ms() > int(queue.client.hget(queue.keys.job(job_id), "exp")), 5)
    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0")
    assert queue.get_state(job_id) == "failed" and queue.get_job(job_id).failed_reason == "expired"


def test_the_failed_list_filters_the_expired(queue, client):
    from django.contrib.auth.models import User
    from django.core.management import call_command

    brief = jobs.job(name="opts.brief")(lambda: None)
    expired = brief.enqueue_with(expires=0.05, job_id="expired-job")
    boom = jobs.job(name="opts.boom", attempts=1)(_boom).enqueue_with(job_id="failing-job")
    assert wait_until(lambda: now_ms() > int(queue.client.hget(queue.keys.job(expired), "exp")), 5)
    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0")
    call_command("echomq_sweep", "--once", "-v", "0")  # copies the failed set to the admin's list
    client.force_login(User.objects.create_superuser("root", password="x"))
    page = client.get("/admin/echomq/failedjob/?why=expired").content.decode()
    assert expired in page and boom not in page
    other = client.get("/admin/echomq/failedjob/?why=other").content.decode()
    assert boom in other and expired not in other


def _boom():
    raise RuntimeError("boom")


def test_an_expiry_goes_through_the_outbox(queue, settings):
    from django.db import transaction

    settings.ECHOMQ = {**settings.ECHOMQ, "OUTBOX": True}
    brief = jobs.job(name="opts.brief")(lambda: None)
    with transaction.atomic():
        before = now_ms()
        job_id = brief.enqueue_with(expires=45)
        created = now_ms()
    exp = int(queue.client.hget(queue.keys.job(job_id), "exp"))
    assert before + 45_000 <= exp <= created + 45_000, "45 s from the enqueue, not from the commit's send"


def test_enqueue_returns_a_handle_that_waits_through_a_producers_short_timeout(queue, settings):
    """The producer's client gives up on a reply after ENQUEUE_TIMEOUT / 4: the wait's reads stay shorter."""
    from echomq_django.core import JobHandle

    settings.ECHOMQ = {**settings.ECHOMQ, "ENQUEUE_TIMEOUT": 0.4}
    double = jobs.job(name="opts.double")(lambda n: n * 2)
    handle = double.enqueue(21)
    assert isinstance(handle, JobHandle) and handle == queue.get_jobs("wait")[0].id
    with pytest.raises(TimeoutError):
        handle.wait(timeout=1.0)  # reads of at most 50 ms: no socket timeout, only the wait's own
    from django.core.management import call_command

    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0")
    assert handle.wait(timeout=10) == 42 and handle.result == 42


def test_result_ttl_per_queue_and_per_job(queue, settings):
    settings.ECHOMQ = {**settings.ECHOMQ, "QUEUES": {"default": {"RESULT_TTL": 60}}}
    plain = jobs.job(name="opts.plain")(lambda: None)
    brief = jobs.job(name="opts.brief", result_ttl=5)(lambda: None)
    assert queue.get_job(plain.enqueue()).opts.result_ttl_ms == 60_000
    assert queue.get_job(brief.enqueue()).opts.result_ttl_ms == 5_000
    with pytest.raises(PayloadError, match="positive number of seconds"):
        jobs.job(name="opts.bad", result_ttl=-1)(lambda: None)


def test_dedupe_on_the_job_function_and_per_enqueue(queue):
    welcome = jobs.job(name="opts.welcome", dedupe=lambda user_id: f"welcome-{user_id}")(lambda user_id: None)
    first = welcome.enqueue(7)
    assert welcome.enqueue(7) == first and welcome.enqueue(8) != first
    assert welcome.enqueue_with(args=(7,), dedupe="other") != first, "a key given at enqueue wins"
    unique = jobs.job(name="opts.unique", unique=True)(lambda *args, **kwargs: None)
    assert unique.enqueue(1, a=2) == unique.enqueue(1, a=2) != unique.enqueue(1, a=3)
    assert queue.counts()["wait"] == 5


def test_debounce_and_throttle_from_enqueue_with(queue):
    save = jobs.job(name="opts.save")(lambda doc: doc)
    first = save.enqueue_with(args=("v1",), dedupe="doc-1", debounce_ms=60_000)
    assert save.enqueue_with(args=("v2",), dedupe="doc-1", debounce_ms=60_000) == first
    assert queue.get_job(first).data["args"] == ["v2"] and queue.get_state(first) == "delayed"
    assert save.enqueue_with(args=("v3",), dedupe="doc-1", debounce_ms=60_000, debounce="keep") == first
    assert queue.get_job(first).data["args"] == ["v2"]
    ping = save.enqueue_with(args=("p",), dedupe="ping", dedupe_ttl_ms=60_000)
    assert save.enqueue_with(args=("p",), dedupe="ping", dedupe_ttl_ms=60_000) == ping


def test_bad_dedupe_options_are_refused_and_add_nothing(queue):
    save = jobs.job(name="opts.save")(lambda doc: doc)
    with pytest.raises(PayloadError, match="1 to 200 characters"):
        save.enqueue_with(dedupe="x" * 300)
    with pytest.raises(PayloadError, match="dedupe TTL"):
        save.enqueue_with(dedupe="k", dedupe_ttl_ms=-5)
    with pytest.raises(PayloadError, match='debounce is "replace" or "keep"'):
        save.enqueue_with(dedupe="k", debounce_ms=10, debounce="last")
    with pytest.raises(PayloadError, match="a dedupe key is text"):
        jobs.job(name="opts.keyed", dedupe=lambda: 42)(lambda: None).enqueue()
    with pytest.raises(PayloadError, match="dedupe or unique"):
        jobs.job(name="opts.both", dedupe="k", unique=True)(lambda: None)
    with pytest.raises(PayloadError, match="before its debounce window ends"):
        save.enqueue_with(dedupe="k", debounce_ms=60_000, expires=30)
    assert sum(queue.counts().values()) == 0


def test_the_admin_takes_generated_ids_in_its_urls(queue, client):
    from django.contrib.auth.models import User

    job_id = jobs.job(name="opts.page")(lambda: None).enqueue()
    assert job_id == "default.1"
    client.force_login(User.objects.create_superuser("root", password="x"))
    page = client.get(f"/admin/echomq/job/default/job/{job_id}/")
    assert page.status_code == 200 and "default.1" in page.content.decode()


def test_a_deduplicated_task_gives_the_result_of_the_job_that_runs(queue, settings):
    """EchoMQTask.deduplicated: a second enqueue adds nothing; its TaskResult names the job that runs."""
    from django.core.management import call_command
    from django.db import transaction

    from demo_project.demo_app import tasks
    from echomq_django.tasks_compat import InvalidTask, TaskResultStatus

    settings.TASKS = {"default": {"BACKEND": "echomq_django.backends.EchoMQBackend", "QUEUES": []}}
    keyed = tasks.add.using(queue_name="default").deduplicated("sum-once")
    first = keyed.enqueue(2, 3)
    with transaction.atomic():  # sent at the commit, and deduplicated then
        second = keyed.enqueue(4, 5)
    assert queue.counts()["wait"] == 1 and second.id != first.id
    assert keyed.get_result(second.id).id == first.id, "it names the job that holds the key"
    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0")
    done = keyed.get_result(second.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5
    with pytest.raises(InvalidTask, match="1 to 200 characters"):
        tasks.add.deduplicated("")
    with pytest.raises(InvalidTask, match="not both"):
        tasks.add.deduplicated("k", ttl_ms=5, debounce_ms=5)
