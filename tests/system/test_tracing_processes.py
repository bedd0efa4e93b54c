"""OpenTelemetry tracing on the processes pool: the worker makes each attempt's process span, and the
job's own spans in the child (exported by the child's SDK) are its children.

The worker runs on a thread of the test process, its children are real spawned
processes (tests/system/tracing_jobs.py); the worker's spans go to the SDK's
in-memory exporter, the child's to a file.
"""

import json
import os

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from echomq_django.core import Backoff, JobOptions, Retention, Worker, WorkerOptions, use_tracer_provider
from tests.system import tracing_jobs

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


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


def test_each_attempt_in_a_child_is_a_process_span_and_the_jobs_spans_are_its_children(
        queue, exporter, tmp_path, monkeypatch):
    spans_file = tmp_path / "child-spans.jsonl"
    monkeypatch.setenv(tracing_jobs.SPANS_FILE_ENV, str(spans_file))  # the children inherit it
    ok = queue.add("ok")
    flaky = queue.add("flaky", opts=JobOptions(attempts=2, backoff=Backoff("fixed", 0)))
    options = WorkerOptions(prefix=queue.keys.prefix, pool="processes", child_init=tracing_jobs.child_init,
                            block_timeout_s=0.2, keep_completed=Retention())
    Worker(queue.name, tracing_jobs.handler, queue.client, options).run(burst=True)
    assert (queue.get_state(ok), queue.get_state(flaky)) == ("completed", "completed")

    sends = {span.attributes["messaging.message.id"]: span for span in exporter.get_finished_spans()
             if span.kind == SpanKind.PRODUCER}
    processes = sorted((span for span in exporter.get_finished_spans() if span.kind == SpanKind.CONSUMER),
                       key=lambda span: span.start_time)
    assert [(span.attributes["messaging.message.id"], span.attributes["echomq.job.attempt"], span.status.status_code)
            for span in processes] == [(ok, 1, StatusCode.UNSET), (flaky, 1, StatusCode.ERROR),
                                       (flaky, 2, StatusCode.UNSET)]
    for span in processes:
        assert span.name == "process q" and span.attributes["messaging.system"] == "echomq"
        assert span.links[0].context.span_id == sends[span.attributes["messaging.message.id"]].context.span_id

    # The job's own span, made in the child, is a child of its attempt's process span (flaky's first
    # attempt raised before making one).
    inside = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert [span["name"] for span in inside] == ["inside the job", "inside the job"]
    assert [(span["trace_id"], span["parent"]) for span in inside] == [
        (processes[0].context.trace_id, processes[0].context.span_id),
        (processes[2].context.trace_id, processes[2].context.span_id)]
    assert all(span["pid"] != os.getpid() for span in inside)
