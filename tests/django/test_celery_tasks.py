"""echomq_django.celery: shared_task's options, bound tasks, Celery's results and calling API, on the real scripts."""

import statistics
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from echomq_django import jobs
from echomq_django.celery import AsyncResult, Celery, Task, shared_task, states
from echomq_django.celery.exceptions import ImproperlyConfigured, MaxRetriesExceededError, TaskRevokedError
from echomq_django.core import PayloadError, Queue
from echomq_django.jobs import run_job
from echomq_django.queues import make_worker
from echomq_django.testing import run_jobs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queues(settings, redis_url, prefix, redis_client, monkeypatch):
    """Queues `default` and `mail` on this test's prefix, and a registry that forgets this test's tasks."""
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "mail": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    return {name: Queue(name, redis_client, prefix=prefix) for name in ("default", "mail")}


class Flaky(Exception):
    pass


def test_delay_and_get_through_a_worker(queues):
    add = shared_task(name="c.add")(lambda x, y: x + y)
    result = add.delay(2, 3)
    assert isinstance(result, AsyncResult) and result.queue.name == "default"
    assert result.state == states.PENDING and result.status == "PENDING" and not result.ready()
    assert run_jobs() == 1
    assert result.get(timeout=5) == 5
    assert result.state == states.SUCCESS and result.ready() and result.successful() and not result.failed()
    assert result.result == result.info == 5 and result.traceback is None
    assert abs((result.date_done - datetime.now(UTC)).total_seconds()) < 60
    assert AsyncResult(result.id).get(timeout=5) == 5  # found by id alone, on its queue
    result.forget()
    assert queues["default"].get_job(result.id) is None


def test_apply_async_options(queues):
    seen = []

    @shared_task(bind=True, name="c.look")
    def look(self, value, **kwargs):
        seen.append((self.request.id, self.request.delivery_info["routing_key"], self.request.headers,
                     self.request.args, self.request.kwargs, self.request.retries, self.name, self.request.eta))
        return value

    result = look.apply_async((1,), {"k": 2}, queue="mail", countdown=30, priority=5, task_id="my-id",
                              headers={"tenant": "a"}, time_limit=10, soft_time_limit=5)
    assert result.id == "my-id" and queues["mail"].get_state("my-id") == "delayed"
    job = queues["mail"].get_job("my-id")
    assert job.opts.priority == 5 and job.opts.time_limit_ms == 10_000 and job.opts.soft_time_limit_ms == 5_000
    expired = look.apply_async((2,), expires=datetime.now(UTC) + timedelta(seconds=60),
                               eta=datetime.now(UTC) + timedelta(seconds=30))
    assert expired.queue.get_job(expired.id).opts.expires_ms > 0
    run_jobs()
    assert result.get(timeout=5) == 1
    [first, _] = sorted(seen, key=lambda row: row[0] != "my-id")
    assert first[:7] == ("my-id", "mail", {"tenant": "a"}, [1], {"k": 2}, 0, "c.look")
    assert first[7] is not None  # the countdown's eta, as ISO text
    with pytest.raises(PayloadError, match="cannot take serializer=: echomq stores JSON only"):
        look.apply_async((1,), serializer="pickle")
    with pytest.raises(PayloadError, match="cannot take colour="):
        look.apply_async((1,), colour="red")


def test_an_error_not_retried_fails_at_once_and_get_raises_it(queues):
    boom = shared_task(name="c.boom")(_raise_value_error)
    result = boom.delay()
    run_jobs()
    assert result.state == states.FAILURE and result.failed()
    job = queues["default"].get_job(result.id)
    assert job.attempts_made == 1  # Celery fails a task that raises at once; max_retries is for self.retry
    assert isinstance(result.result, ValueError) and str(result.result) == "bad value"
    with pytest.raises(ValueError, match="bad value"):
        result.get(timeout=5)
    assert isinstance(result.get(timeout=5, propagate=False), ValueError)
    assert "ValueError: bad value" in result.traceback


def _raise_value_error():
    raise ValueError("bad value")


def test_bound_retry_countdown_max_retries_and_exc(queues):
    calls = []

    @shared_task(bind=True, max_retries=2, name="c.retrying")
    def retrying(self):
        calls.append(self.request.retries)
        raise self.retry(exc=Flaky("still down"), countdown=0.01)

    result = retrying.delay()
    run_jobs()
    assert calls == [0, 1, 2]
    assert result.state == states.FAILURE
    assert type(result.result).__name__ == "Flaky" and isinstance(result.result, Flaky)
    job = result.queue.get_job(result.id)
    assert job.attempts_made == 3 and job.opts.attempts == 3

    @shared_task(bind=True, max_retries=1, name="c.noexc")
    def noexc(self):
        raise self.retry(countdown=0)

    failed = noexc.delay()
    run_jobs()
    with pytest.raises(MaxRetriesExceededError):
        failed.get(timeout=5)


def test_autoretry_for_with_retry_kwargs_and_hooks(queues):
    events = []

    class Hooked(Task):
        def on_retry(self, exc, task_id, args, kwargs, einfo):
            events.append(("retry", type(exc).__name__))

        def on_failure(self, exc, task_id, args, kwargs, einfo):
            events.append(("failure", type(exc).__name__))

        def on_success(self, retval, task_id, args, kwargs):
            events.append(("success", retval))

    attempts = []

    @shared_task(base=Hooked, autoretry_for=(Flaky,), retry_kwargs={"max_retries": 3, "countdown": 0},
                 name="c.auto")
    def auto():
        attempts.append(1)
        if len(attempts) < 3:
            raise Flaky("again")
        return "done"

    result = auto.delay()
    run_jobs()
    assert result.get(timeout=5) == "done" and len(attempts) == 3
    assert events == [("retry", "Flaky"), ("retry", "Flaky"), ("success", "done")]
    other = shared_task(base=Hooked, autoretry_for=(Flaky,), name="c.other")(_raise_value_error).delay()
    run_jobs()
    assert other.state == states.FAILURE and events[-1] == ("failure", "ValueError")


def test_update_state_is_read_as_state_and_info(queues):
    seen = {}

    @shared_task(bind=True, name="c.progress")
    def progress(self):
        self.update_state(state="PROGRESS", meta={"done": 3})
        seen["state"], seen["info"] = AsyncResult(self.request.id).state, AsyncResult(self.request.id).info
        return "ok"

    progress.delay()
    run_jobs()
    assert seen == {"state": "PROGRESS", "info": {"done": 3}}


def test_revoke_a_waiting_job_and_leave_a_running_one(queues):
    add = shared_task(name="c.add2")(lambda x, y: x + y)
    waiting = add.delay(1, 1)
    waiting.revoke()
    assert waiting.state == states.REVOKED and waiting.ready()
    assert isinstance(waiting.result, TaskRevokedError)
    with pytest.raises(TaskRevokedError):
        waiting.get(timeout=5)

    @shared_task(bind=True, name="c.self_revoke")
    def self_revoke(self):
        AsyncResult(self.request.id).revoke()  # running: left to finish without terminate
        return "finished"

    running = self_revoke.delay()
    run_jobs()
    assert running.get(timeout=5) == "finished"

    @shared_task(bind=True, name="c.terminated")
    def terminated(self):
        AsyncResult(self.request.id).revoke(terminate=True)
        return "finished"

    stopped = terminated.delay()
    run_jobs()
    assert stopped.state == states.REVOKED


def test_get_inside_a_job_is_refused(queues):
    add = shared_task(name="c.add3")(lambda x, y: x + y)

    @shared_task(name="c.waits")
    def waits():
        return add.delay(1, 2).get(timeout=1)

    result = waits.delay()
    run_jobs()
    with pytest.raises(RuntimeError, match="Never call result.get"):
        result.get(timeout=5)


def test_options_echomq_cannot_honour_are_refused_by_name(queues):
    with pytest.raises(ImproperlyConfigured, match="reject_on_worker_lost=: echomq always gives"):
        shared_task(reject_on_worker_lost=True)(lambda: None)
    with pytest.raises(ImproperlyConfigured, match="has no option colour="):
        shared_task(colour="red")(lambda: None)
    with pytest.raises(ImproperlyConfigured, match="JSON only"):
        shared_task(serializer="pickle")(lambda: None)
    with pytest.raises(PayloadError, match="rate_limit is"):
        shared_task(rate_limit="ten a second")(lambda: None)
    with pytest.raises(ImproperlyConfigured, match="retry_kwargs takes"):
        shared_task(retry_kwargs={"exc": 1})(lambda: None)
    accepted = shared_task(acks_late=True, track_started=True, name="c.accepted")(lambda: 1)
    assert accepted() == 1  # a direct call runs here


def test_a_direct_call_and_the_app_shim(queues):
    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.autodiscover_tasks()

    @app.task(bind=True, name="c.direct")
    def direct(self, x):
        return (self.request.called_directly, x)

    assert direct(4) == (True, 4)
    result = app.send_task("c.direct", args=[5])
    run_jobs()
    assert app.AsyncResult(result.id).get(timeout=5) == [False, 5]


def test_retries_of_many_jobs_spread_over_the_backoff(queues):
    """1,000 jobs failing at once with retry_backoff come back spread over [0, 60 s], not all at 60 s. (A backoff
    long beside the run: on a machine ten times slower the run's few seconds still change little.)"""

    @shared_task(autoretry_for=(Flaky,), retry_backoff=60, name="c.spread")
    def spread(n):
        raise Flaky("down")

    for n in range(1000):
        spread.delay(n)
    started = time.time() * 1000
    make_worker("default", run_job, concurrency=8).run(burst=True, max_jobs=1000)
    span = time.time() * 1000 - started
    due = [score for _, score in queues["default"].client.zrange(queues["default"].keys.delayed, 0, -1,
                                                                  withscores=True)]
    # (a retry drawn shorter than the run was made due again: it is not in `delayed`)
    assert len(due) >= 1000 - 1000 * span / 60_000 - 50
    waits = [score - started for score in due]
    # Full jitter over the first backoff (60 s): the waits fill [0, 60 s]; without it all would be 60 s.
    assert max(waits) <= 60_000 + span
    assert sum(1 for wait in waits if wait < 30_000) > 250 and sum(1 for wait in waits if wait > 30_000) > 250
    assert statistics.pstdev(waits) > 9000  # (60 s drawn evenly: about 17 s; all at 60 s: the run's length)
    assert not all(job.opts.backoff.jitter is False for job in queues["default"].get_jobs("delayed", 0, 1))


def test_a_tasks_rate_limit_holds_across_workers_without_using_attempts(queues):
    """rate_limit="20/s": two workers of 4 threads each start the task's jobs 50 ms apart; a job held
    back waits in `delayed` with its attempts untouched, and the queue's other jobs do not wait for it."""
    starts = []

    @shared_task(rate_limit="20/s", max_retries=0, name="c.limited")
    def limited(n):
        starts.append(time.time())

    free = shared_task(name="c.free")(lambda: "free")
    results = [limited.delay(n) for n in range(12)]
    other = free.delay()
    deadline = time.monotonic() + 60

    def drain():
        while time.monotonic() < deadline and not all(r.ready() for r in results):
            # (a burst ends when nothing is due: the held jobs come due one by one, each to a new burst)
            make_worker("default", run_job, concurrency=4).run(burst=True)
            time.sleep(0.01)

    threads = [threading.Thread(target=drain) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result.successful() for result in results) and other.get(timeout=5) == "free"
    # The script spaces the starts 50 ms apart on Redis's clock; a thread may begin its function a little late, so
    # the span is the bound (unlimited, 8 threads start these 12 jobs within a few ms).
    assert len(starts) == 12 and max(starts) - min(starts) >= 0.5, sorted(starts)
    assert all(queues["default"].get_job(result.id).attempts_made == 1 for result in results)


def test_a_rate_limit_backlog_longer_than_a_day_waits_and_loses_nothing(queues):
    """(Found by a hostile run: a hold past a day was refused, and the job failed.) 27 jobs at 1 an hour: one runs,
    the others wait in delayed, up to 26 hours ahead, with no attempt used."""

    @shared_task(name="c.hourly", rate_limit="1/h", max_retries=0)
    def hourly(n):
        return n

    results = [hourly.delay(n) for n in range(27)]
    make_worker("default", run_job, concurrency=4).run(burst=True)
    rows = [(queues["default"].get_state(r.id), queues["default"].get_job(r.id).attempts_made) for r in results]
    assert sorted(rows) == [("completed", 1)] + [("delayed", 0)] * 26
    latest = max(score for _, score in queues["default"].client.zrange(queues["default"].keys.delayed, 0, -1,
                                                                        withscores=True))
    assert latest - time.time() * 1000 > 25 * 3_600_000


def test_long_retry_countdowns_and_bad_retry_arguments(queues):
    @shared_task(bind=True, name="c.long_retry", default_retry_delay=3 * 86400)
    def long_retry(self):
        raise self.retry()

    @shared_task(bind=True, name="c.bad_retry")
    def bad_retry(self, how):
        if how == "nan":
            raise self.retry(countdown=float("nan"))
        if how == "naive":
            raise self.retry(eta=datetime.now())
        raise self.retry(exc="not an exception")

    waiting = long_retry.delay()
    bad = [bad_retry.delay(how) for how in ("nan", "naive", "exc")]
    run_jobs(run_delayed=False)
    assert waiting.state == states.RETRY
    assert [type(result.result).__name__ for result in bad] == ["ImproperlyConfigured"] * 3
    with pytest.raises(ImproperlyConfigured, match="default_retry_delay"):
        shared_task(default_retry_delay=float("inf"))(lambda: None)
    with pytest.raises(ImproperlyConfigured, match="autoretry_for is a tuple"):
        shared_task(autoretry_for=ValueError)(lambda: None)
    with pytest.raises(ImproperlyConfigured, match="cannot be named"):
        shared_task(name="a b")(lambda: None)


def test_a_retry_past_the_jobs_attempts_fails_as_max_retries_exceeded(queues):
    @shared_task(bind=True, max_retries=1, name="c.past")
    def past(self):
        raise self.retry(countdown=0, max_retries=10)  # more than the job was added with: its own ceiling holds

    result = past.delay()
    run_jobs()
    assert isinstance(result.result, MaxRetriesExceededError)


def test_results_of_crafted_records(queues):
    from echomq_django.core import InvalidNameError

    with pytest.raises(InvalidNameError):
        AsyncResult("wait")
    boom = shared_task(name="c.crafted")(_raise_value_error).delay()
    run_jobs()
    queues["default"].client.hset(queues["default"].keys.job(boom.id), "errc", '[{"a": 1}]')
    assert type(boom.result).__name__ == "ValueError"
    queues["default"].client.hset(queues["default"].keys.job(boom.id), "errc", '["os.system"]')
    assert type(boom.result).__name__ == "ValueError", "nothing is imported or called because a record names it"
