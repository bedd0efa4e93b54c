"""OpenTelemetry spans of the Django layer's durable steps: an atomic step and a fan-out (echomq_django.durable).

The spans go to the SDK's in-memory exporter (see tests/runtime/test_durable_tracing.py for the core's steps).
"""

import pytest
from django.contrib.auth.models import User
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from echomq_django import jobs
from echomq_django.core import use_tracer_provider
from echomq_django.core.producing import tracing
from echomq_django.durable import StepFailed, atomic_step, fan_out
from echomq_django.testing import run_jobs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def exporter():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        use_tracer_provider(None)
        provider.shutdown()


@pytest.fixture
def project(settings, redis_url, monkeypatch, echomq):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "QUEUES": {"default": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    return echomq


def step_spans(exporter, job_id: str) -> list:
    """The step spans of one job, in the order they started."""
    return sorted((span for span in exporter.get_finished_spans()
                   if span.kind == SpanKind.INTERNAL and span.attributes.get("messaging.message.id") == job_id),
                  key=lambda span: span.start_time)


def parent_process(exporter, span):
    [process] = [other for other in exporter.get_finished_spans()
                 if other.kind == SpanKind.CONSUMER and other.context.span_id == span.parent.span_id]
    return process


def test_an_atomic_step_is_replayed_when_its_row_was_committed_and_its_blocks_spans_are_its_children(
        project, exporter):
    @jobs.job(name="d.account", attempts=2, backoff=0)
    def account(username):
        with atomic_step("create") as created:
            with tracing.tracer().start_as_current_span("the insert"):
                created.result = User.objects.create(username=username).pk
        if jobs.current_job().attempts_made == 0:
            raise RuntimeError("after the commit")
        return created.result

    handle = account.enqueue("ada")
    run_jobs()
    assert handle.result == User.objects.get(username="ada").pk
    first, second = step_spans(exporter, handle.id)
    assert [(span.name, span.attributes["echomq.step.kind"], span.attributes["echomq.step.replayed"])
            for span in (first, second)] == [("step create", "atomic", False), ("step create", "atomic", True)]
    assert [parent_process(exporter, span).attributes["echomq.job.attempt"] for span in (first, second)] == [1, 2]
    inserts = [span for span in exporter.get_finished_spans() if span.name == "the insert"]
    assert sorted(span.parent.span_id for span in inserts) == sorted(span.context.span_id for span in (first, second))


def test_a_fan_outs_span_holds_its_workflows_send_and_a_failed_child_is_its_error(project, exporter):
    @jobs.job(name="d.bad", attempts=1)
    def bad(n):
        if n == 1:
            raise ValueError("no one")
        return n

    @jobs.job(name="d.caller")
    def caller():
        try:
            fan_out("all", [bad.s(n) for n in range(3)])
        except StepFailed as failed:
            return failed.reason
        return "no failure"

    handle = caller.enqueue()
    run_jobs()
    assert "no one" in handle.result
    parked, resumed = step_spans(exporter, handle.id)
    assert [(span.name, span.attributes["echomq.step.kind"]) for span in (parked, resumed)] == [
        ("step all", "fan-out"), ("step all", "fan-out")]
    # The first run added the workflow (its send span is the step's child) and parked: no error.
    assert parked.attributes["echomq.step.replayed"] is False and parked.status.status_code == StatusCode.UNSET
    [send] = [span for span in exporter.get_finished_spans()
              if span.kind == SpanKind.PRODUCER and span.parent is not None
              and span.parent.span_id == parked.context.span_id]
    assert send.attributes["messaging.batch.message_count"] >= 3
    # The run the failure resumed took the recorded outcome, and raised StepFailed (which the job caught).
    assert resumed.status.status_code == StatusCode.ERROR
    assert resumed.attributes["error.type"] == "echomq_django.core.errors.StepFailed"
