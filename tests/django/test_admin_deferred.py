"""The `deferred` state (workflow steps waiting for their inputs) wherever the admin and the commands list states."""

import io
import re

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from echomq_django.core import COUNTED, Chain, JobOptions, Member, Plan

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser_client(echomq_settings) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


@pytest.fixture
def deferred_step(queue) -> str:
    plan = Plan.of(Chain(*(Member(queue, "work", {"n": n}, JobOptions(attempts=1)) for n in range(2))))
    plan.add()
    assert queue.get_state(plan.steps[1].id) == "deferred"
    return plan.steps[1].id


def test_the_dashboard_has_a_header_over_every_count(superuser_client, queue, deferred_step):
    page = superuser_client.get(reverse("admin:echomq_queue_changelist")).content.decode()
    table = page[page.index('<table class="echomq-queues">'):]
    head, body = table.split("</thead>", 1)
    headers = re.findall(r'<th class="num">([^<]*)</th>', head)
    row = body.split("</tr>", 1)[0]
    counts = re.findall(r'<td class="num"[ >]', row)  # the states' counts, then the workers'
    assert headers[-1] == "workers"
    assert len(headers) == len(counts) == len(COUNTED) + 1, (
        f"{len(headers)} headers over {len(counts)} counts: each count after `delayed` sits under the wrong header")
    assert "deferred" in headers
    deferred = reverse("admin:echomq_job_browse", args=["q", "deferred"])
    assert f'href="{deferred}">1</a>' in row


def test_a_deferred_step_is_browsable_and_can_be_cancelled(superuser_client, queue, deferred_step):
    page = superuser_client.get(reverse("admin:echomq_job_browse", args=["q", "deferred"]))
    assert page.status_code == 200 and deferred_step in page.content.decode()
    detail = superuser_client.get(reverse("admin:echomq_job_detail", args=["q", deferred_step]))
    assert detail.status_code == 200
    cancel = reverse("admin:echomq_job_cancel", args=["q", deferred_step])
    assert cancel in detail.content.decode(), "a job that has not finished can be cancelled from its page"


def test_echomq_status_counts_deferred(echomq_settings, queue, deferred_step):
    out = io.StringIO()
    call_command("echomq_status", stdout=out)
    header, row = out.getvalue().splitlines()[:2]
    assert "deferred" in header.split()
    assert row.split()[1 + header.split().index("deferred") - 1] == "1"
