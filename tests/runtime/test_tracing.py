"""OpenTelemetry tracing (core/producing/tracing.py) on the threads pool: a send span per add, one per attempt.

The spans go to the SDK's in-memory exporter, through a provider given to
use_tracer_provider (the global one can be set once per process, and would
trace every later test of it); the processes pool is tests/system/test_tracing_processes.py.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from echomq_django.core import (
    Backoff,
    Beat,
    Chain,
    Group,
    JobOptions,
    Member,
    NewJob,
    Retention,
    Schedule,
    Worker,
    WorkerOptions,
    run_now,
    use_tracer_provider,
)
from echomq_django.core.producing import tracing
from tests.conftest import current_redis_url

# Every attribute of a process span but its id and attempt.
PROCESS = {"messaging.system": "echomq", "messaging.destination.name": "q", "messaging.operation.type": "process",
           "messaging.operation.name": "process"}
SEND = {"messaging.system": "echomq", "messaging.destination.name": "q", "messaging.operation.type": "send",
        "messaging.operation.name": "send"}


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


def handler(job):
    """Fails the first attempt of "flaky"; makes a span of its own in "inside" (tracing's current span)."""
    if job.name == "flaky" and job.attempts_made == 0:
        raise ValueError("first attempt fails")
    if job.name == "inside":
        with tracing.tracer().start_as_current_span("inside the job"):
            pass
    return job.id


def drain(queue, **options) -> None:
    Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.1,
                                                            keep_completed=Retention(), **options)).run(burst=True)


def spans_of(exporter, kind):
    return [span for span in exporter.get_finished_spans() if span.kind == kind]


def stored_trace(queue, job_id) -> dict | None:
    return json.loads(queue.client.hget(queue.keys.job(job_id), "opts")).get("trace")


def test_an_add_is_a_send_span_and_its_attempt_a_process_span_linked_to_it(queue, exporter):
    job_id = queue.add("ok", {"n": 1})
    [send] = spans_of(exporter, SpanKind.PRODUCER)
    assert send.name == "send q"
    assert dict(send.attributes) == {**SEND, "messaging.message.id": job_id}
    # The job carries the send span's context as W3C traceparent.
    assert stored_trace(queue, job_id)["traceparent"].startswith(
        f"00-{send.context.trace_id:032x}-{send.context.span_id:016x}-")
    drain(queue)
    [process] = spans_of(exporter, SpanKind.CONSUMER)
    assert process.name == "process q"
    assert dict(process.attributes) == {**PROCESS, "messaging.message.id": job_id, "echomq.job.attempt": 1,
                                        "echomq.job.name": "ok"}
    assert process.status.status_code == StatusCode.UNSET
    [link] = process.links
    assert (link.context.trace_id, link.context.span_id) == (send.context.trace_id, send.context.span_id)
    # By default, a trace of its own (linked only).
    assert process.parent is None and process.context.trace_id != send.context.trace_id


def test_with_trace_as_child_the_process_span_is_the_send_spans_child(queue, exporter):
    queue.add("ok")
    drain(queue, trace_as_child=True)
    [send] = spans_of(exporter, SpanKind.PRODUCER)
    [process] = spans_of(exporter, SpanKind.CONSUMER)
    assert process.parent.span_id == send.context.span_id
    assert process.context.trace_id == send.context.trace_id
    assert process.links[0].context.span_id == send.context.span_id


@pytest.mark.parametrize("time_limit_ms", [0, 60_000])  # with a limit, the handler runs on a thread of its own
def test_the_handler_runs_inside_its_process_span(queue, exporter, time_limit_ms):
    queue.add("inside")
    drain(queue, time_limit_ms=time_limit_ms)
    [process] = spans_of(exporter, SpanKind.CONSUMER)
    [inside] = spans_of(exporter, SpanKind.INTERNAL)
    assert inside.name == "inside the job"
    assert inside.parent.span_id == process.context.span_id


def test_a_retry_is_one_process_span_per_attempt_each_linked_to_the_one_send(queue, exporter):
    job_id = queue.add("flaky", opts=JobOptions(attempts=2, backoff=Backoff("fixed", 0)))
    drain(queue)
    assert queue.get_state(job_id) == "completed"
    [send] = spans_of(exporter, SpanKind.PRODUCER)
    first, second = sorted(spans_of(exporter, SpanKind.CONSUMER), key=lambda span: span.start_time)
    assert [first.attributes["echomq.job.attempt"], second.attributes["echomq.job.attempt"]] == [1, 2]
    assert first.status.status_code == StatusCode.ERROR
    assert first.status.description == "ValueError: first attempt fails"
    assert first.attributes["error.type"] == "builtins.ValueError"
    [event] = first.events
    assert event.name == "exception" and event.attributes["exception.type"] == "builtins.ValueError"
    assert "first attempt fails" in event.attributes["exception.stacktrace"]
    assert second.status.status_code == StatusCode.UNSET
    for process in (first, second):
        assert process.links[0].context.span_id == send.context.span_id
        assert process.attributes["messaging.message.id"] == job_id


def test_a_bulk_add_is_one_send_span_whose_context_every_job_carries(queue, exporter):
    ids = queue.add_bulk([NewJob("ok", n) for n in range(3)])
    [send] = spans_of(exporter, SpanKind.PRODUCER)
    assert send.attributes["messaging.batch.message_count"] == 3
    assert "messaging.message.id" not in send.attributes
    assert len({stored_trace(queue, job_id)["traceparent"] for job_id in ids}) == 1
    drain(queue, concurrency=3)
    processes = spans_of(exporter, SpanKind.CONSUMER)
    assert sorted(span.attributes["messaging.message.id"] for span in processes) == sorted(ids)
    assert {span.links[0].context.span_id for span in processes} == {send.context.span_id}


def test_a_workflow_is_one_send_span_linked_from_every_members_attempt(queue, exporter):
    def step(name):
        return Member(queue, name, None, JobOptions(attempts=1))

    workflow = Chain(step("ok"), Group(step("ok"), step("inside"))).enqueue()
    [send] = spans_of(exporter, SpanKind.PRODUCER)
    assert send.name == "send q" and send.attributes["messaging.batch.message_count"] == 3
    for _ in range(3):  # a chain's next step is ready once the one before ended
        drain(queue)
    assert workflow.status == "succeeded"
    processes = spans_of(exporter, SpanKind.CONSUMER)
    assert len(processes) == 3
    assert {span.links[0].context.span_id for span in processes} == {send.context.span_id}


def test_a_schedules_tick_and_a_run_now_are_send_spans(queue, exporter):
    schedule = Schedule("tick", "q", "ok", None, every_ms=1000)
    beat = Beat(queue.client, lambda: [schedule], prefix=queue.keys.prefix, scripts=queue.scripts)
    beat.reload()
    [firing] = beat.fire_due(1_800_000_000_000)
    assert firing.outcome == "fired"
    now = run_now(queue.scripts, schedule, "by-hand", prefix=queue.keys.prefix)
    sends = sorted(spans_of(exporter, SpanKind.PRODUCER), key=lambda span: span.start_time)
    assert [span.attributes["messaging.message.id"] for span in sends] == [firing.job_id, now.job_id]
    drain(queue)
    processes = spans_of(exporter, SpanKind.CONSUMER)
    links = {span.attributes["messaging.message.id"]: span.links[0].context.span_id for span in processes}
    assert links == {firing.job_id: sends[0].context.span_id, now.job_id: sends[1].context.span_id}


def test_without_a_provider_nothing_is_traced_or_stored(queue):
    assert tracing.tracer() is None  # the API's stand-in provider: tracing is off
    job_id = queue.add("ok", opts=JobOptions(attempts=2))
    assert queue.client.hget(queue.keys.job(job_id), "opts") == '{"attempts":2}'
    drain(queue)
    assert queue.get_job(job_id).trace is None
    assert queue.get_state(job_id) == "completed"


def test_without_opentelemetry_installed_jobs_run_and_nothing_is_imported(queue):
    """A process where opentelemetry cannot be imported (None in sys.modules: as if not installed)."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["opentelemetry"] = None
        from echomq_django.core import Queue, Worker, WorkerOptions, connect
        from echomq_django.core.producing import tracing
        assert not tracing.INSTALLED and tracing.tracer() is None
        client = connect({current_redis_url()!r})
        queue = Queue("q", client, prefix={queue.keys.prefix!r})
        job_id = queue.add("ok")
        options = WorkerOptions(prefix={queue.keys.prefix!r}, block_timeout_s=0.1)
        Worker("q", lambda job: job.id, client, options).run(burst=True)
        assert queue.get_state(job_id) == "completed", queue.get_state(job_id)
        assert client.hget(queue.keys.job(job_id), "opts") == '{{"attempts":3}}'
        assert not [name for name in sys.modules if name.startswith("opentelemetry.")]
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_global_tracer_provider_turns_tracing_on_even_when_set_after_an_add(queue):
    """In a process of its own: the global provider can be set once per process."""
    script = textwrap.dedent(f"""
        import time
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from echomq_django.core import Queue, connect
        from echomq_django.core.producing import tracing
        queue = Queue("q", connect({current_redis_url()!r}), prefix={queue.keys.prefix!r})
        queue.add("before")
        assert tracing.tracer() is None
        exporter, provider = InMemorySpanExporter(), TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        deadline = time.monotonic() + 10 * tracing.UNSET_RECHECK_S  # asked for again within UNSET_RECHECK_S
        while tracing.tracer() is None:
            assert time.monotonic() < deadline, "the provider set is not used"
            time.sleep(0.05)
        job_id = queue.add("after")
        [send] = exporter.get_finished_spans()
        assert send.name == "send q" and send.attributes["messaging.message.id"] == job_id
        assert queue.get_job(job_id).trace["traceparent"].startswith(f"00-{{send.context.trace_id:032x}}-")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
