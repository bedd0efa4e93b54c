"""The job browser's durable parts, through real workers and the real scripts: a job's steps table (bounded,
escaped, a corrupt record shown as one), the parked state's list and counts, and the Send signal form."""

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from echomq_django import jobs
from echomq_django.core import read_steps
from echomq_django.durable import step, wait_for_signal
from echomq_django.testing import run_jobs
from tests.django.test_admin import HOSTILE, staff

pytestmark = pytest.mark.django_db(transaction=True)
SCRIPT = "<script>alert(1)</script>"


@pytest.fixture
def project(settings, redis_url, monkeypatch, echomq):
    """One queue, `default`, under this test's own prefix, and a registry of jobs restored afterwards."""
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": echomq.prefix, "QUEUES": {"default": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    return echomq


@pytest.fixture
def admin_client(project) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


@pytest.fixture
def approval(project):
    """A job function that parks until its signal "approved" and returns the payload's plan."""
    @jobs.job(name="ad.approval")
    def approve():
        step("prepare", lambda: "ready")
        return {"plan": wait_for_signal("approved")["plan"]}

    return approve


def job_url(job_id: str, view: str = "detail") -> str:
    return reverse(f"admin:echomq_job_{view}", args=["default", job_id])


def parked(project, approval) -> str:
    handle = approval.enqueue()
    run_jobs()
    assert project.queue().get_state(handle.id) == "parked"
    return handle.id


def signals_sent(project, job_id: str) -> int:
    queue = project.queue()
    return queue.client.hlen(queue.keys.signals(job_id))


def test_the_steps_table_shows_each_record_escaped_and_cut(project, admin_client):
    @jobs.job(name="ad.steps")
    def stepper():
        step("greet", lambda: SCRIPT)
        step("long", lambda: "x" * 5000)
        wait_for_signal("go")

    handle = stepper.enqueue()
    run_jobs()
    page = admin_client.get(job_url(handle.id)).content.decode()
    assert "Durable steps (3)" in page and "Showing" not in page
    assert "&quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;" in page and SCRIPT not in page  # as JSON, escaped
    assert "x" * 250 in page and "x" * 400 not in page, "a result is cut to a few hundred characters"
    assert "waiting for its signal, no deadline" in page


def test_a_corrupt_record_shows_as_one_and_the_page_stands(project, admin_client):
    @jobs.job(name="ad.one")
    def one():
        return step("only", lambda: 1)

    handle = one.enqueue()
    run_jobs()
    queue = project.queue()
    queue.client.hset(queue.keys.steps(handle.id), mapping={
        "broken": "{not json", "listed": "[1, 2]", "odd": '{"s": 5, "k": null, "at": "soon"}',
        "zz-early": '{"s":"done","k":"step","at":1,"r":0}'})
    response = admin_client.get(job_url(handle.id))
    page = response.content.decode()
    assert response.status_code == 200 and "Durable steps (5)" in page
    rows = re.findall(r'<tr><th scope="row">([a-z-]+)</th>\s*<td', page)
    assert rows[-5:] == ["zz-early", "only", "broken", "listed", "odd"], "by when, then by name; no time last"
    assert "unreadable record: not JSON" in page and "unreadable record: not a JSON object: [1, 2]" in page
    assert page.count("unreadable record") == 2  # "odd" is an object: shown with what it holds


def test_a_steps_key_of_another_type_is_named_on_the_page(project, admin_client):
    @jobs.job(name="ad.plain")
    def plain():
        return 1

    handle = plain.enqueue()
    run_jobs()
    queue = project.queue()
    queue.client.set(queue.keys.steps(handle.id), "a string")
    page = admin_client.get(job_url(handle.id)).content.decode()
    assert "The steps could not be read from Redis" in page and "Return value" in page


def test_the_steps_table_is_cut_at_200_and_says_of_how_many(project, admin_client):
    @jobs.job(name="ad.many")
    def many():
        return sum(step(f"s{n:03d}", lambda n=n: n) for n in range(250))

    handle = many.enqueue()
    run_jobs()
    assert handle.result == sum(range(250))
    page = admin_client.get(job_url(handle.id)).content.decode()
    assert "Showing 200 of 250 steps" in page
    assert len(re.findall(r'<tr><th scope="row">s[0-9]{3}</th>', page)) == 200


def test_a_read_of_large_records_stops_at_its_byte_budget(project, admin_client):
    @jobs.job(name="ad.large")
    def large():
        for n in range(6):
            step(f"big{n}", lambda: "y" * 900_000)

    handle = large.enqueue()
    run_jobs()
    read = read_steps(project.queue(), handle.id)
    assert read.total == 6 and len(read.steps) == 6
    unread = [record for record in read.steps if record.problem]
    assert len(unread) == 2 and "more than this page reads" in unread[0].problem  # four fit in READ_BUDGET_BYTES
    assert all(record.result == "y" * 900_000 for record in read.steps if not record.problem)
    page = admin_client.get(job_url(handle.id)).content.decode()
    assert page.count("more than this page reads at once") == 2 and len(page) < 100_000


def test_a_job_without_steps_shows_nothing_extra(project, admin_client):
    @jobs.job(name="ad.bare")
    def bare():
        return 1

    handle = bare.enqueue()
    run_jobs()
    page = admin_client.get(job_url(handle.id)).content.decode()
    assert "Durable steps" not in page and "Send a signal" not in page  # finished: no form either


def test_parked_jobs_are_listed_counted_and_say_what_they_wait_for(project, admin_client, approval):
    @jobs.job(name="ad.patient")
    def patient():
        return wait_for_signal("reviewed", timeout=3600)

    forever = parked(project, approval)
    timed = patient.enqueue()
    run_jobs()
    listed = admin_client.get(reverse("admin:echomq_job_browse", args=["default", "parked"])).content.decode()
    assert "2 job(s) parked." in listed and "<th scope=\"col\">waiting for</th>" in listed
    assert f">{forever}</a>" in listed and f">{timed.id}</a>" in listed
    assert "<td>approved</td>" in listed and "<td>reviewed</td>" in listed and "<td>none</td>" in listed
    index = admin_client.get(reverse("admin:echomq_job_changelist")).content.decode()
    assert reverse("admin:echomq_job_browse", args=["default", "parked"]) in index
    dashboard = admin_client.get(reverse("admin:echomq_queue_changelist")).content.decode()
    assert f'href="{reverse("admin:echomq_job_browse", args=["default", "parked"])}">2</a>' in dashboard
    page = admin_client.get(job_url(forever)).content.decode()
    assert "waiting for signal</th><td>approved" in page and "deadline</th><td>none" in page
    assert 'value="approved"' in page, "the form suggests the signal the job waits for"


def test_the_signal_form_needs_its_permission_and_post(project, approval):
    job_id = parked(project, approval)
    viewer = staff("viewer", "view_job")
    assert "Send a signal" not in viewer.get(job_url(job_id)).content.decode()
    assert viewer.post(job_url(job_id, "signal"), {"name": "approved", "payload": "{}"}).status_code == 403
    signaller = staff("signaller", "view_job", "signal_job")
    assert "Send a signal" in signaller.get(job_url(job_id)).content.decode()
    assert signaller.get(job_url(job_id, "signal"), {"name": "approved", "payload": "{}"}).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="signaller"))
    assert strict.post(job_url(job_id, "signal"), {"name": "approved", "payload": "{}"}).status_code == 403
    assert signals_sent(project, job_id) == 0 and project.queue().get_state(job_id) == "parked"


def test_a_signal_from_the_admin_resumes_the_job_and_a_second_is_refused(project, approval):
    job_id = parked(project, approval)
    signaller = staff("signaller", "view_job", "signal_job")
    url = job_url(job_id, "signal")
    page = signaller.post(url, {"name": "approved", "payload": '{"plan": "pro"}'}, follow=True).content.decode()
    assert "it was parked waiting for it and is back in the queue" in page
    assert project.queue().get_state(job_id) == "wait"
    page = signaller.post(url, {"name": "approved", "payload": '{"plan": "free"}'}, follow=True).content.decode()
    assert "was sent no signal" in page and "a signal of that name was sent to it before" in page
    run_jobs()
    job = project.queue().get_job(job_id)
    assert project.queue().get_state(job_id) == "completed" and job.returnvalue == {"plan": "pro"}
    page = signaller.post(url, {"name": "other", "payload": "null"}, follow=True).content.decode()
    assert "has not finished can be sent a signal" in page  # finished: the state check says so


def test_a_signal_sent_before_the_wait_is_kept(project, approval):
    handle = approval.enqueue()
    signaller = staff("signaller", "view_job", "signal_job")
    page = signaller.post(job_url(handle.id, "signal"), {"name": "approved", "payload": '{"plan": "early"}'},
                          follow=True).content.decode()
    assert "it is kept until the job waits for it" in page and project.queue().get_state(handle.id) == "wait"
    run_jobs()
    assert handle.result == {"plan": "early"}


@pytest.mark.parametrize(("name", "payload", "says"), [
    ("approved", "{not json", "the payload is not JSON"),
    ("approved", "", "the payload is not JSON"),
    ("approved", "NaN", "the payload is not JSON"),
    ("no good", "null", "may hold only"),
    ("approved", '"' + "z" * (1024 * 1024) + '"', "the limit is"),
])
def test_a_signal_the_form_cannot_send_is_an_error_and_sends_nothing(project, approval, name, payload, says):
    job_id = parked(project, approval)
    signaller = staff("signaller", "view_job", "signal_job")
    page = signaller.post(job_url(job_id, "signal"), {"name": name, "payload": payload}, follow=True).content.decode()
    assert "was sent no signal" in page and says in page
    assert signals_sent(project, job_id) == 0 and project.queue().get_state(job_id) == "parked"


def test_a_hostile_signal_name_is_escaped_in_the_message(project, approval):
    job_id = parked(project, approval)
    page = staff("signaller", "view_job", "signal_job").post(
        job_url(job_id, "signal"), {"name": HOSTILE, "payload": "null"}, follow=True).content.decode()
    assert "was sent no signal" in page and HOSTILE not in page and "may hold only" in page


def test_a_parked_job_is_cancelled_from_its_page(project, admin_client, approval):
    job_id = parked(project, approval)
    assert 'value="Cancel"' in admin_client.get(job_url(job_id)).content.decode()
    page = admin_client.post(job_url(job_id, "cancel"), follow=True).content.decode()
    assert "was cancelled" in page and project.queue().get_state(job_id) == "failed"
    assert project.queue().counts()["parked"] == 0
