"""OpenTelemetry spans of durable steps (core/worker/durable.py through tracing.step_traced), on the threads pool.

Each step a job takes is a span `step <name>`, a child of its attempt's process
span, saying whether the step's record was found (replayed) or the step ran.
The spans go to the SDK's in-memory exporter, as in tests/runtime/test_tracing.py;
on the processes pool, the child's go to a file (as in tests/system/test_tracing_processes.py).
"""

import json
import os

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from echomq_django.core import Backoff, JobOptions, Retention, Worker, WorkerOptions, durable, use_tracer_provider
from echomq_django.core.errors import Postponed, SignalTimeout
from echomq_django.core.producing import tracing
from tests.helpers import running, wait_until

pytestmark = pytest.mark.timeout(120)
SPANS_FILE_ENV = "ECHOMQ_TEST_STEP_SPANS_FILE"


@pytest.fixture
def exporter():
    """The spans echomq makes in this test, in memory; tracing is off again afterwards."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    try:
        yield exporter
    finally:
        use_tracer_provider(None)
        provider.shutdown()


def worker(queue, handler, **options) -> Worker:
    return Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.1,
                                                                   keep_completed=Retention(), **options))


def two_steps(job):
    """Two durable steps, then a failure in the job's first attempt only (module-level: a child imports it)."""
    first = durable.run_step(job, "one", str.upper, ("a",), {})
    second = durable.run_step(job, "two", str.upper, ("b",), {})
    if job.attempts_made == 0:
        raise ValueError("after the steps")
    return [first, second]


class FileExporter(SpanExporter):
    """Appends each span's name, parent, attributes and process to a file, one JSON object a line."""

    def export(self, spans) -> SpanExportResult:
        with open(os.environ[SPANS_FILE_ENV], "a") as file:
            for span in spans:
                file.write(json.dumps({"name": span.name, "parent": span.parent.span_id if span.parent else None,
                                       "attributes": dict(span.attributes), "pid": os.getpid()}) + "\n")
        return SpanExportResult.SUCCESS


def child_init() -> None:
    """The child's own set-up of the SDK, as an application's child_init would do it."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileExporter()))
    trace.set_tracer_provider(provider)


def attempts(exporter) -> list:
    """The process spans, one per attempt, in the order the attempts started."""
    spans = [span for span in exporter.get_finished_spans() if span.kind == SpanKind.CONSUMER]
    return sorted(spans, key=lambda span: span.start_time)


def steps_of(exporter, process) -> list[tuple[str, str, bool | None]]:
    """The step spans under one process span, in order: (name, kind, replayed)."""
    spans = [span for span in exporter.get_finished_spans()
             if span.parent is not None and span.parent.span_id == process.context.span_id]
    return [(span.attributes["echomq.step.name"], span.attributes["echomq.step.kind"],
             span.attributes.get("echomq.step.replayed")) for span in sorted(spans, key=lambda span: span.start_time)]


def test_a_retried_jobs_steps_ran_in_its_first_attempt_and_are_replayed_in_the_second(queue, exporter):
    job_id = queue.add("two-steps", opts=JobOptions(attempts=2, backoff=Backoff("fixed", 0)))
    assert worker(queue, two_steps).run(burst=True) == 2
    assert queue.get_job(job_id).returnvalue == ["A", "B"]
    first, second = attempts(exporter)
    assert steps_of(exporter, first) == [("one", "step", False), ("two", "step", False)]
    assert steps_of(exporter, second) == [("one", "step", True), ("two", "step", True)]
    for span in exporter.get_finished_spans():
        if span.kind == SpanKind.INTERNAL:
            assert span.name == f"step {span.attributes['echomq.step.name']}"
            assert {key: span.attributes[key] for key in ("messaging.system", "messaging.destination.name",
                                                          "messaging.message.id")} == {
                "messaging.system": "echomq", "messaging.destination.name": "q", "messaging.message.id": job_id}
            assert span.status.status_code == StatusCode.UNSET


def test_on_the_processes_pool_the_child_makes_the_step_spans_under_the_workers_process_span(
        queue, exporter, tmp_path, monkeypatch):
    spans_file = tmp_path / "child-spans.jsonl"
    monkeypatch.setenv(SPANS_FILE_ENV, str(spans_file))  # the children inherit it
    job_id = queue.add("two-steps", opts=JobOptions(attempts=2, backoff=Backoff("fixed", 0)))
    assert worker(queue, two_steps, pool="processes", child_init=child_init).run(burst=True) == 2
    assert queue.get_job(job_id).returnvalue == ["A", "B"]
    first, second = attempts(exporter)
    steps = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert [(span["name"], span["parent"], span["attributes"]["echomq.step.replayed"]) for span in steps] == [
        ("step one", first.context.span_id, False), ("step two", first.context.span_id, False),
        ("step one", second.context.span_id, True), ("step two", second.context.span_id, True)]
    assert all(span["pid"] != os.getpid() and span["attributes"]["messaging.message.id"] == job_id for span in steps)


def test_a_step_that_raises_is_a_step_span_with_its_error(queue, exporter):
    def handler(job):
        return durable.run_step(job, "charge", lambda: 1 / 0, (), {})

    queue.add("failing", opts=JobOptions(attempts=1))
    worker(queue, handler).run(burst=True)
    [process] = attempts(exporter)
    [step] = [span for span in exporter.get_finished_spans() if span.kind == SpanKind.INTERNAL]
    assert step.parent.span_id == process.context.span_id
    assert step.attributes["echomq.step.replayed"] is False
    assert step.status.status_code == StatusCode.ERROR
    assert step.status.description == "ZeroDivisionError: division by zero"
    assert step.attributes["error.type"] == "builtins.ZeroDivisionError"
    [event] = step.events
    assert event.name == "exception" and event.attributes["exception.type"] == "ZeroDivisionError"


def test_a_sleep_and_a_signal_wait_end_their_spans_and_attempts_without_an_error(queue, exporter):
    def handler(job):
        durable.sleep_until(job, "nap", durable.now_ms() + 1000)  # recorded once: later runs keep the first end
        return durable.wait_signal(job, "go", None)

    job_id = queue.add("waits")
    with running(worker(queue, handler)):
        assert wait_until(lambda: queue.get_state(job_id) == "parked", 60), queue.get_state(job_id)
        assert queue.signal(job_id, "go", {"ok": True}) is True
        assert wait_until(lambda: queue.get_state(job_id) == "completed", 60), queue.get_state(job_id)
    assert queue.get_job(job_id).returnvalue == {"ok": True}
    # Asleep, parked, resumed: three runs of one attempt, each a process span, none failed.
    slept, parked, resumed = attempts(exporter)
    assert steps_of(exporter, slept) == [("nap", "sleep", False)]
    # The wait began here; its signal came later, and was recorded by the run that received it.
    assert steps_of(exporter, parked) == [("nap", "sleep", True), ("go", "signal", False)]
    assert steps_of(exporter, resumed) == [("nap", "sleep", True), ("go", "signal", False)]
    spans = exporter.get_finished_spans()
    assert [span.status.status_code for span in spans] == [StatusCode.UNSET] * len(spans)
    assert not [span for span in spans if span.events or "error.type" in span.attributes]


def test_a_signal_wait_past_its_deadline_is_a_step_span_with_its_timeout(queue, exporter):
    def handler(job):
        try:
            return durable.wait_signal(job, "go", 1)
        except SignalTimeout:
            return "timed out"

    job_id = queue.add("impatient")
    with running(worker(queue, handler)):
        assert wait_until(lambda: queue.get_state(job_id) == "completed", 60), queue.get_state(job_id)
    assert queue.get_job(job_id).returnvalue == "timed out"
    *_, last = attempts(exporter)
    [(name, kind, _)] = steps_of(exporter, last)
    [step] = [span for span in exporter.get_finished_spans()
              if span.parent is not None and span.parent.span_id == last.context.span_id]
    assert (name, kind) == ("go", "signal")
    assert step.status.status_code == StatusCode.ERROR
    assert step.attributes["error.type"] == "echomq_django.core.errors.SignalTimeout"


def test_a_postponed_attempt_is_no_failure_either(queue, exporter):
    def handler(job):
        if queue.client.set(f"{queue.keys.prefix}:postponed", 1, nx=True):  # the first run only
            raise Postponed(0, "its own rate")
        return "ran"

    job_id = queue.add("later")
    with running(worker(queue, handler)):
        assert wait_until(lambda: queue.get_state(job_id) == "completed", 60), queue.get_state(job_id)
    postponed, ran = attempts(exporter)
    assert (postponed.status.status_code, ran.status.status_code) == (StatusCode.UNSET, StatusCode.UNSET)
    assert "error.type" not in postponed.attributes and not postponed.events


def test_without_a_provider_a_step_makes_no_span_and_still_runs(queue):
    assert tracing.tracer() is None
    job_id = queue.add("plain")
    worker(queue, lambda job: durable.run_step(job, "one", lambda: 7, (), {})).run(burst=True)
    assert queue.get_job(job_id).returnvalue == 7
    with tracing.step_traced(queue.get_job(job_id), "one", "step") as replayed:
        assert replayed(True) is None
