"""The admin's workflow page: the tree of steps with their states and results, linked both ways; Cancel."""

import pytest
from django.contrib.auth.models import Permission, User
from django.urls import reverse

from echomq_django import jobs
from echomq_django.core import Queue
from echomq_django.workflows import chain, chord, group

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def setup(settings, redis_url, prefix, redis_client, monkeypatch):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    shout = jobs.job(name="wf.shout")(lambda *parts: "<script>alert(1)</script>")
    return Queue("default", redis_client, prefix=prefix), shout


def user(client, *codenames):
    person = User.objects.create_user("op", password="x", is_staff=True)
    person.user_permissions.add(*Permission.objects.filter(content_type__app_label="echomq", codename__in=codenames))
    client.force_login(person)
    return person


def test_the_page_shows_the_tree_and_escapes_results(client, setup):
    queue, shout = setup
    result = chord(group(shout.s(n) for n in range(3)), shout.s()).enqueue()
    from django.core.management import call_command
    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0")
    user(client, "view_job")
    page = client.get(reverse("admin:echomq_workflow_detail", args=["default", result.id]))
    text = page.content.decode()
    assert page.status_code == 200 and "succeeded" in text
    assert text.count("wf.shout") == 4 and "<strong>chord</strong>" in text and "<strong>group</strong>" in text
    assert "<script>alert(1)" not in text and "&lt;script&gt;" in text
    member = f"{result.id}-0"
    job_page = client.get(reverse("admin:echomq_job_detail", args=["default", member])).content.decode()
    assert reverse("admin:echomq_workflow_detail", args=["default", result.id]) in job_page
    listing = client.get(reverse("admin:echomq_job_browse", args=["default", "completed"])).content.decode()
    assert reverse("admin:echomq_workflow_detail", args=["default", result.id]) in listing


def test_cancel_needs_the_permission_a_post_and_a_confirmation(client, setup):
    queue, shout = setup
    result = chain(shout.s(1), shout.s(2), shout.s(3)).enqueue()
    url = reverse("admin:echomq_workflow_cancel", args=["default", result.id])
    user(client, "view_job")
    assert client.post(url, {"post": "yes"}).status_code == 403
    assert result.status == "waiting"
    Permission.objects.get(codename="cancel_job").user_set.add(User.objects.get(username="op"))
    assert client.get(url).status_code == 405
    asked = client.post(url)
    assert asked.status_code == 200 and "Cancel every step" in asked.content.decode() and result.status == "waiting"
    done = client.post(url, {"post": "yes"})
    assert done.status_code == 302 and result.status == "failed"
    assert queue.counts()["failed"] == 3 and queue.counts()["deferred"] == 0


def test_a_missing_workflow_and_a_bad_id(client, setup):
    user(client, "view_job")
    assert client.get(reverse("admin:echomq_workflow_detail", args=["default", "wnope"])).status_code == 404
    assert client.get("/admin/echomq/job/default/workflow/bad%20id/").status_code == 404
    assert client.get(reverse("admin:echomq_workflow_detail", args=["nope", "w1"])).status_code == 404


def test_a_record_whose_tree_another_client_nested_5000_deep_shows_and_cancels(client, setup):
    queue, shout = setup
    result = chain(shout.s(1), shout.s(2), shout.s(3)).enqueue()
    queue.client.hset(queue.keys.workflow(result.id), "tree", "[" * 5000 + "]" * 5000)
    user(client, "view_job", "cancel_job")
    page = client.get(reverse("admin:echomq_workflow_detail", args=["default", result.id]))
    text = page.content.decode()
    assert page.status_code == 200 and "shape cannot be read" in text and "Cancel the workflow" in text
    done = client.post(reverse("admin:echomq_workflow_cancel", args=["default", result.id]), {"post": "yes"})
    assert done.status_code == 302 and result.status == "failed"
    assert queue.counts()["failed"] == 3 and queue.counts()["deferred"] == 0


def test_a_celery_link_shows_as_a_linked_node_with_its_callbacks(client, setup):
    """apply_async(link=, link_error=) is a small workflow: its page shows the job, its callback under "link",
    its error callback under "on error", each escaped and linked to its job page."""
    from django.core.management import call_command

    _queue, shout = setup
    result = shout.apply_async(("<b>",), link=shout.s(), link_error=shout.si("<i>"))
    call_command("echomq_worker", "--queue", "default", "--burst", "-v", "0")
    assert result.get(timeout=5) == "<script>alert(1)</script>"
    workflow = result.queue.get_job(result.id).workflow_id
    user(client, "view_job")
    text = client.get(reverse("admin:echomq_workflow_detail", args=["default", workflow])).content.decode()
    assert "<strong>linked</strong>" in text and "link: " in text and "on error: " in text
    assert reverse("admin:echomq_job_detail", args=["default", result.id]) in text
    assert "<script>alert(1)" not in text and "&lt;script&gt;" in text
