"""The job and the child's set-up of tests/system/test_tracing_processes.py, imported by the pool's children.

The child sets up the OpenTelemetry SDK of its own, as an application's child_init
would, with an exporter that appends each span to a file (one JSON object a line)
that the test reads: the process spans are the worker's, the job's own span the child's.
"""

import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

SPANS_FILE_ENV = "ECHOMQ_TEST_SPANS_FILE"


class FileExporter(SpanExporter):
    """Appends each span's name, ids, parent and process to a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans) -> SpanExportResult:
        with open(self.path, "a") as file:
            for span in spans:
                file.write(json.dumps({"name": span.name, "trace_id": span.context.trace_id,
                                       "span_id": span.context.span_id,
                                       "parent": span.parent.span_id if span.parent else None,
                                       "pid": os.getpid()}) + "\n")
        return SpanExportResult.SUCCESS


def child_init() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ[SPANS_FILE_ENV])))
    trace.set_tracer_provider(provider)


def handler(job):
    """Fails the first attempt of "flaky"; otherwise makes a span of its own and returns its pid."""
    if job.name == "flaky" and job.attempts_made == 0:
        raise ValueError("first attempt fails")
    with trace.get_tracer("tests").start_as_current_span("inside the job"):
        return os.getpid()
