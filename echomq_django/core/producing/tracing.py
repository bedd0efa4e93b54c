"""OpenTelemetry spans for jobs (the `otel` extra): the one module that touches opentelemetry.

Tracing is on when opentelemetry-api is installed and a tracer provider is set:
the one given to `use_tracer_provider`, else the global one (the SDK's, set by
the application; one set after the process's first add is used within
UNSET_RECHECK_S). Otherwise nothing here makes a span or stores anything in a
job, and the check costs a clock read per add (bench/otel_cost.py).

With it on:

- An add (`Queue.add`, `add_bulk`, a workflow, a schedule's tick, an outbox
  enqueue) is a PRODUCER span `send <queue>`, and each job it adds carries that
  span's W3C trace context in its opts (`trace`: `traceparent`, `tracestate`).
- Each attempt is a CONSUMER span `process <queue>`, made by the worker's slot
  around the attempt, so in the worker's process on either pool (an attempt a
  time limit or a dead child ended has one too). It is linked to the send span,
  and, with `child_of_send` (ECHOMQ's TRACE_AS_CHILD), in the send span's trace
  as its child; by default it starts a trace of its own.
- The handler runs with the process span as its current span: on the processes
  pool its context goes to the child with the job, so spans the job makes there
  are its children (exported by the child's own set-up of the SDK).
- Each durable step the handler takes (core/worker/durable.py) is an INTERNAL span
  `step <name>` there, a child of the process span (step_traced).

Tracing never changes what happens to a job: an error that the provider, a
span processor or an exporter raises is logged (the first one with its
traceback) and the add or the attempt goes on, untraced, and runs once.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any, TypeVar

from ..protocol.job import Job
from ..protocol.scripts import Finish

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed: tracing is off
    INSTALLED = False
else:
    INSTALLED = True

T = TypeVar("T")
logger = logging.getLogger("echomq.tracing")

# The attributes, after OpenTelemetry's messaging conventions; the attempt has no standard name.
SYSTEM, DESTINATION, MESSAGE_ID = "messaging.system", "messaging.destination.name", "messaging.message.id"
OPERATION_TYPE, OPERATION_NAME = "messaging.operation.type", "messaging.operation.name"
BATCH_COUNT = "messaging.batch.message_count"
ATTEMPT = "echomq.job.attempt"  # 1 for a job's first attempt
JOB_NAME = "echomq.job.name"
ERROR_TYPE = "error.type"
# A durable step's: its name, its kind (core/worker/durable.py's KINDS), and whether its record was found or it ran.
STEP_NAME, STEP_KIND, STEP_REPLAYED = "echomq.step.name", "echomq.step.kind", "echomq.step.replayed"

_propagator = TraceContextTextMapPropagator() if INSTALLED else None
# A process without a global provider asks for one again this often: one set later is used from then on.
UNSET_RECHECK_S = 1.0
_unset_until = 0.0
_provider: Any = None  # use_tracer_provider's; None: the global one
_tracer: tuple[Any, Any] = (None, None)  # (a provider, its tracer): one get_tracer per provider
_failed_once = False  # an error of OpenTelemetry's was logged with its traceback


def use_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Make echomq's spans with `provider` instead of the global tracer provider (None: the global one again)."""
    global _provider
    _provider = provider


def tracer() -> trace.Tracer | None:
    """echomq's tracer, or None when tracing is off (opentelemetry not installed, or no provider set)."""
    global _tracer, _unset_until
    if not INSTALLED:
        return None
    provider = _provider
    if provider is None:
        now = time.monotonic()
        if now < _unset_until:  # none was set a moment ago: get_tracer_provider() looks at os.environ, a µs an add
            return None
        provider = trace.get_tracer_provider()
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            _unset_until = now + UNSET_RECHECK_S
            return None
    elif isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None  # use_tracer_provider was given the API's stand-in
    cached = _tracer
    if cached[0] is not provider:
        try:
            cached = _tracer = (provider, provider.get_tracer("echomq_django"))
        except Exception:
            _failed("the tracer provider's get_tracer")
            return None
    tracer_: trace.Tracer = cached[1]
    return tracer_


def send_traced(queue: str, add: Callable[[str], list[str]], count: int = 1) -> list[str]:
    """`add(trace)` inside a send span on `queue` when tracing is on, else `add("")`; its ids.

    `trace` is the span's context as JSON text ("" for none), for the added jobs'
    opts (`with_trace`); `count` is how many jobs the add adds.
    """
    tracer_ = tracer()
    if tracer_ is None:
        return add("")
    attributes: dict[str, Any] = {SYSTEM: "echomq", DESTINATION: queue, OPERATION_TYPE: "send",
                                  OPERATION_NAME: "send"}
    if count != 1:
        attributes[BATCH_COUNT] = count
    with _span(tracer_, f"send {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes) as span:
        context = (_quietly("the send span's context", current_trace) or "") if span is not None else ""
        ids = add(context)
        if span is not None and len(ids) == 1:
            _quietly("a send span's attribute", lambda: span.set_attribute(MESSAGE_ID, ids[0]))
        return ids


def current_trace() -> str:
    """The current span's W3C context as the JSON text a job's opts carry; "" when there is none."""
    carrier = _carrier() if INSTALLED else {}
    return json.dumps(carrier, separators=(",", ":")) if carrier else ""


def with_trace(opts: str, trace_json: str) -> str:
    """A job's opts JSON text with `trace_json` (current_trace's) as its `trace`; as it is for ""."""
    if not trace_json:
        return opts
    return f'{opts[:-1]}{"," if opts.strip() != "{}" else ""}"trace":{trace_json}}}'


def process_traced(job: Job, run: Callable[[], Finish], *, child_of_send: bool = False) -> Finish:
    """`run()`, the attempt of `job`, inside a process span when tracing is on; its end.

    The span's context goes on the job (`running_trace`) for run_traced, where the handler runs.
    """
    tracer_ = tracer()
    if tracer_ is None:
        return run()
    sent = _extracted(job.trace)
    sent_span = trace.get_current_span(sent).get_span_context() if sent is not None else None
    links = [trace.Link(sent_span)] if sent_span is not None and sent_span.is_valid else []
    parent = sent if child_of_send and links else otel_context.Context()  # a trace of its own by default
    attributes: dict[str, Any] = {SYSTEM: "echomq", DESTINATION: job.queue, OPERATION_TYPE: "process",
                                  OPERATION_NAME: "process", MESSAGE_ID: job.id, ATTEMPT: job.attempts_made + 1,
                                  JOB_NAME: job.name}
    with _span(tracer_, f"process {job.queue}", context=parent, kind=trace.SpanKind.CONSUMER, links=links,
               attributes=attributes) as span:
        if span is not None:
            job.running_trace = _quietly("the process span's context", _carrier)
        finish = run()
        # Waiting its turn (RateLimited, Postponed) or on a durable sleep or signal is no failure.
        if span is not None and not (finish.completed or finish.rate_limited or finish.postponed or finish.parked):
            _quietly("a process span's error", lambda: _record_failure(span, finish))
        return finish


def _record_failure(span: Any, finish: Finish) -> None:
    kind = finish.error_class or "echomq.ended"
    span.set_attribute(ERROR_TYPE, kind)
    span.add_event("exception", {"exception.type": kind, "exception.message": finish.value,
                                 "exception.stacktrace": finish.stacktrace})
    span.set_status(trace.Status(trace.StatusCode.ERROR, finish.value))


@contextmanager
def step_traced(job: Job, name: str, kind: str) -> Iterator[Callable[[bool], None]]:
    """The body, the durable step `name` of `job`, inside a span `step <name>` when tracing is on.

    It yields `replayed(found)`, for the step to say, once it knows, whether
    its record was found (True) or it ran (False). A Suspended (a BaseException:
    the job sleeps or parks) ends the span as it is; an Exception is its error.
    """
    tracer_ = tracer()
    if tracer_ is None:
        yield _not_traced
        return
    attributes = {SYSTEM: "echomq", DESTINATION: job.queue, MESSAGE_ID: job.id, STEP_NAME: name, STEP_KIND: kind}
    with _span(tracer_, f"step {name}", kind=trace.SpanKind.INTERNAL, attributes=attributes,
               record_exception=False, set_status_on_exception=False) as span:
        if span is None:
            yield _not_traced
            return

        def replayed(found: bool) -> None:
            _quietly("a step span's attribute", lambda: span.set_attribute(STEP_REPLAYED, found))

        try:
            yield replayed
        except Exception as error:
            _quietly("a step span's error", partial(_record_step_error, span, error))
            raise


def _not_traced(found: bool) -> None:
    """step_traced's `replayed` when there is no span."""


def _record_step_error(span: Any, error: Exception) -> None:
    span.set_attribute(ERROR_TYPE, f"{type(error).__module__}.{type(error).__qualname__}")
    span.record_exception(error)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))


@contextmanager
def _span(tracer_: Any, name: str, **options: Any) -> Iterator[Any]:
    """A current span around the body, or None when OpenTelemetry raised starting it; its end's error is logged.

    The body runs once, and its own error goes on as it is, whatever the span does.
    """
    try:
        manager = tracer_.start_as_current_span(name, **options)
        span = manager.__enter__()
    except Exception:
        _failed(f"starting a span {name!r}")
        yield None
        return
    try:
        yield span
    except BaseException as error:
        try:
            manager.__exit__(type(error), error, error.__traceback__)
        except Exception as other:
            if other is not error:
                _failed(f"ending a span {name!r}")
        raise
    try:
        manager.__exit__(None, None, None)
    except Exception:
        _failed(f"ending a span {name!r}")


def _quietly(what: str, call: Callable[[], T]) -> T | None:
    """`call()`, or None when OpenTelemetry raised in it (logged)."""
    try:
        return call()
    except Exception:
        _failed(what)
        return None


def _failed(what: str) -> None:
    """Log an error OpenTelemetry raised: the first with its traceback, the others in a line each."""
    global _failed_once
    logger.warning("tracing: %s raised; going on untraced", what, exc_info=not _failed_once)
    _failed_once = True


def run_traced(job: Job, handler: Callable[[Job], T]) -> T:
    """`handler(job)`, with the job's process span (`running_trace`) as the current span, if it has one."""
    context = _extracted(job.running_trace) if job.running_trace else None
    if context is None:
        return handler(job)
    token = otel_context.attach(context)
    try:
        return handler(job)
    finally:
        otel_context.detach(token)


def _carrier() -> dict[str, str]:
    """The current span's W3C context: `traceparent`, and `tracestate` when it has one."""
    carrier: dict[str, str] = {}
    assert _propagator is not None
    _propagator.inject(carrier)
    return carrier


def _extracted(carrier: Mapping[str, str] | None) -> otel_context.Context | None:
    """The context a job's stored carrier holds; None without one (or without opentelemetry)."""
    if not carrier or not INSTALLED:
        return None
    assert _propagator is not None
    return _propagator.extract(carrier)
