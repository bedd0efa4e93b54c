"""echomq_django.testing: run_jobs and the echomq fixture, as a project's tests use them."""

import pytest

from echomq_django import jobs
from echomq_django.celery import shared_task
from echomq_django.testing import EchoMQFixture, JobsLeft, run_jobs  # (the `echomq` fixture: tests/conftest.py)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def project(settings, redis_url, monkeypatch):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "QUEUES": {"default": {}, "mail": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))


def test_run_jobs_runs_what_jobs_enqueue_and_delayed_retries(project, echomq):
    assert isinstance(echomq, EchoMQFixture) and echomq.prefix.startswith("test-")
    send = shared_task(name="t.send", queue="mail")(lambda text: text.upper())

    @shared_task(bind=True, max_retries=2, name="t.flaky")
    def flaky(self, text):
        if self.request.retries == 0:
            raise self.retry(countdown=3600)  # an hour's backoff, made due at once by run_jobs
        return send.delay(text).id

    first = flaky.delay("hi")
    assert echomq.run_jobs() == 3  # the first attempt, its retry, and the job the retry enqueued
    sent = first.get(timeout=5)
    assert echomq.queue("mail").get_job(sent).returnvalue == "HI"
    later = send.apply_async(("later",), countdown=3600)
    assert run_jobs(run_delayed=False) == 0 and later.state == "PENDING"
    echomq.clean()
    assert echomq.queue("mail").counts()["completed"] == 0


def test_run_jobs_gives_up_on_jobs_that_never_end(project, echomq):
    @shared_task(name="t.forever")
    def forever():
        forever.delay()

    forever.delay()
    with pytest.raises(JobsLeft, match="still to run after 0.5 s"):
        run_jobs(timeout=0.5)
