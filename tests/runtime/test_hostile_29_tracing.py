"""Tracing must never change what happens to a job: a provider or span processor that raises, a malformed `trace`."""

import json
import threading

import pytest
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from echomq_django.core import Retention, Worker, WorkerOptions, use_tracer_provider
from tests.helpers import running, wait_until


class Broken(SpanProcessor):
    """A span processor whose start or end raises (an exporter set up wrong, a bug in a vendor's processor)."""

    def __init__(self, where: str) -> None:
        self.where = where

    def on_start(self, span, parent_context=None) -> None:
        if self.where == "start":
            raise RuntimeError("processor broken at start")

    def on_end(self, span) -> None:
        if self.where == "end":
            raise RuntimeError("processor broken at end")


class RaisingProvider(TracerProvider):
    def get_tracer(self, *args, **kwargs):
        raise RuntimeError("provider broken")


@pytest.fixture(params=["start", "end", "get_tracer"])
def broken_tracing(request):
    if request.param == "get_tracer":
        provider = RaisingProvider()
    else:
        provider = TracerProvider()
        provider.add_span_processor(Broken(request.param))
    use_tracer_provider(provider)
    try:
        yield request.param
    finally:
        use_tracer_provider(None)


def test_a_broken_provider_neither_fails_an_add_nor_runs_a_job_twice(queue, broken_tracing):
    ran: list[str] = []
    lock = threading.Lock()

    def handler(job):
        with lock:
            ran.append(job.id)
        return "ok"

    # An add raised the provider's error: at "end" after the job was in Redis, so a caller that tries again
    # adds it twice; an attempt's end was lost, so the sweeper ran the job again (or, at "start", never once).
    ids = [queue.add("x", {"n": n}) for n in range(3)]
    worker = Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.1,
                                                                     keep_completed=Retention(), lock_duration_ms=2000,
                                                                     renew_interval_ms=200))
    with running(worker):
        assert wait_until(lambda: queue.counts()["completed"] == 3, 10), queue.counts()
    assert sorted(ran) == sorted(ids)  # each once: none left active for the sweeper to run again


def test_a_job_whose_trace_is_malformed_runs(queue):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    use_tracer_provider(provider)
    try:
        odd = [{"traceparent": "00-zz-yy-01"}, {"traceparent": "x" * 100_000, "tracestate": "=" * 10_000},
               ["traceparent"], "00-abc", 7, {"traceparent": 5},
               {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"}]
        ids = []
        for trace in odd:
            job_id = queue.add("x")
            opts = json.loads(queue.client.hget(queue.keys.job(job_id), "opts"))
            queue.client.hset(queue.keys.job(job_id), "opts", json.dumps({**opts, "trace": trace}))
            ids.append(job_id)
        Worker(queue.name, lambda job: "ok", queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.1,
                                                                         keep_completed=Retention())).run(burst=True)
        assert queue.counts()["completed"] == len(ids)
    finally:
        use_tracer_provider(None)
        provider.shutdown()
