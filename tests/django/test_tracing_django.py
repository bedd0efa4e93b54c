"""OpenTelemetry tracing through the Django layer: TRACE_AS_CHILD reaches the worker, an outbox enqueue is a send.

The spans go to the SDK's in-memory exporter (see tests/runtime/test_tracing.py for the runtime's spans).
"""

import json

import pytest
from django.db import transaction
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from echomq_django import jobs
from echomq_django.core import Queue, use_tracer_provider
from echomq_django.outbox import OutboxJob
from echomq_django.queues import worker_options


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


@pytest.mark.parametrize("as_child", [False, True])
def test_trace_as_child_is_the_workers_option(echomq_settings, as_child):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "TRACE_AS_CHILD": as_child}
    assert worker_options("q").trace_as_child is as_child


@pytest.mark.django_db(transaction=True)  # the outbox sends on a real commit
def test_an_outbox_enqueue_is_a_send_span_whose_context_the_row_and_the_job_carry(
        settings, redis_url, prefix, redis_client, exporter, monkeypatch):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "OUTBOX": True, "QUEUES": {"q": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    mail = jobs.job(name="mail.send", queue="q")(lambda: None)
    with transaction.atomic():
        job_id = mail.enqueue()
        [send] = [span for span in exporter.get_finished_spans() if span.kind == SpanKind.PRODUCER]
        assert (send.name, send.attributes["messaging.message.id"]) == ("send q", job_id)
        traceparent = json.loads(OutboxJob.objects.get().opts)["trace"]["traceparent"]
        assert traceparent.startswith(f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}-")
    assert Queue("q", redis_client, prefix=prefix).get_job(job_id).trace == {"traceparent": traceparent}
