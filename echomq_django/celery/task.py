"""Celery's tasks on echomq: `shared_task`, `Task` and `self.request` for `bind=True`.

    from echomq_django.celery import shared_task

    @shared_task(bind=True, max_retries=5, autoretry_for=(ConnectionError,), retry_backoff=True,
                 rate_limit="10/s")
    def fetch(self, url):
        ...
        if busy:
            raise self.retry(countdown=30)

A task is an @job function (jobs.JobFunction) with Celery's semantics: an
error it was not told to retry (autoretry_for, self.retry) fails it for good
at once; `max_retries` retries at most (3 by default, None: as many as echomq
allows); `self.retry()` waits `default_retry_delay` (180 s) unless told
otherwise; `retry_backoff` waits 1, 2, 4... s (or that many times a number),
at most `retry_backoff_max` (600 s), each wait drawn at random below that
(`retry_jitter`, on by default) so that jobs failing together come back apart.
"""

from __future__ import annotations

import contextvars
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..core import (
    MAX_ATTEMPTS,
    MAX_WAIT_S,
    Backoff,
    EchoMQError,
    InvalidNameError,
    Job,
    PayloadError,
    Postponed,
    Retry,
    fail_for_good,
    validate_job_name,
)
from ..jobs import JobFunction, check_function_options, current_job, register_function
from ..queues import get_queue
from ..signatures import ERRBACK_OF, IMMUTABLE_ERRBACK
from .exceptions import ImproperlyConfigured, MaxRetriesExceededError
from .result import UPDATE_STATE_KEY, AsyncResult, rebuilt_error

logger = logging.getLogger("echomq.celery")
_request: contextvars.ContextVar[Request | None] = contextvars.ContextVar("echomq_celery_request", default=None)
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(?:/\s*([smh]))?\s*")
_WINDOWS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000}
# The options of shared_task that echomq honours, and those of Celery's it refuses, with why.
TASK_OPTIONS = ("bind", "name", "queue", "priority", "max_retries", "default_retry_delay", "autoretry_for",
                "retry_backoff", "retry_backoff_max", "retry_jitter", "retry_kwargs", "rate_limit", "time_limit",
                "soft_time_limit", "expires", "ignore_result", "acks_late", "base", "track_started", "serializer",
                "typing")
REFUSED_OPTIONS = {
    "reject_on_worker_lost": "echomq always gives a lost worker's job back to the queue (the sweeper recovers it)",
    "acks_on_failure_or_timeout": "echomq records every end of a job; a failure is retried as its attempts say",
    "store_errors_even_if_ignored": "echomq keeps every failure with its job",
    "throws": "echomq logs every failure the same way",
    "trail": "echomq keeps no list of the jobs a job started",
    "send_events": "echomq writes the events of every job to its queue's stream",
    "resultrepr_maxsize": "the admin cuts what it shows",
    "lazy": "a task is registered when its module is imported",
    "shared": "every task is shared: there is one registry",
    "filter": "not supported",
}


def parse_rate(rate: Any) -> tuple[int, int] | None:
    """Celery's rate_limit ("10/s", "100/m", "1000/h", a number per second) as (starts, window ms); None for none."""
    if rate is None or rate == 0 or rate == "":
        return None
    if isinstance(rate, (int, float)) and not isinstance(rate, bool):
        rate = str(rate)
    match = _RATE.fullmatch(rate) if isinstance(rate, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise PayloadError(f"rate_limit is \"<n>/s\", \"<n>/m\", \"<n>/h\" or a number per second, not {rate!r}")
    count, unit = float(match.group(1)), match.group(2) or "s"
    window_ms = _WINDOWS_MS[unit]
    if not count.is_integer():  # "0.5/s": one start per 2 s
        window_ms, count = round(window_ms / count), 1.0
    if count > 1_000_000:
        raise PayloadError(f"rate_limit allows at most 1,000,000 starts per window, not {rate!r}")
    return int(count), window_ms


class Request:
    """`self.request` of a bound task: the running job as Celery names its parts."""

    def __init__(self, job: Job | None = None, task: Any = None) -> None:
        self.called_directly = job is None
        self.is_eager = False
        self.task = getattr(task, "name", None)
        self.id = self.correlation_id = job.id if job else None
        self.retries = job.attempts_made if job else 0
        data = job.data if job and isinstance(job.data, dict) else {}
        self.args = list(data.get("args", [])) if job else []
        self.kwargs = dict(data.get("kwargs", {})) if job else {}
        self.headers = {key: value for key, value in _headers(job).items()
                        if key not in (IMMUTABLE_ERRBACK, ERRBACK_OF)}
        self.eta = self.expires = None
        if job is not None and job.opts.delay_ms:
            self.eta = _moment(job.timestamp + job.opts.delay_ms)
        if job is not None and job.opts.expires_ms:
            self.expires = _moment(job.timestamp + job.opts.expires_ms)
        self.delivery_info = {"routing_key": job.queue if job else None, "exchange": "",
                              "priority": job.opts.priority if job else None,
                              "redelivered": bool(job and job.attempts_made)}
        self.root_id = (job.workflow_id or job.id) if job else None
        self.parent_id = job.workflow_id if job else None  # a workflow step's: its workflow's id
        self.group = None
        self.hostname = job.worker_id if job else None
        self.timelimit = ((job.opts.time_limit_ms / 1000 or None, job.opts.soft_time_limit_ms / 1000 or None)
                          if job else (None, None))
        self.job = job

    def __repr__(self) -> str:
        return f"<Request {self.task} {self.id} retries={self.retries}>"


def _headers(job: Job | None) -> dict[str, Any]:
    """The headers a job was sent with (apply_async's, and echomq's own for error callbacks); {} for none."""
    headers = job.data.get("headers") if job is not None and isinstance(job.data, dict) else None
    return headers if isinstance(headers, dict) else {}


def _moment(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


@dataclass(eq=False)
class Task(JobFunction):
    """A Celery-style task: an @job function with Celery's options, hooks and `self.request`.

    Subclass it for hooks (`on_success`, `on_failure`, `on_retry`, `after_return`) and pass it as
    `shared_task(base=...)`; `self.request` works in a bound task (`bind=True`) and in the hooks.
    """

    bind: bool = False
    hears_failures = True  # (signatures.py: an immutable error callback still hears which job failed)
    max_retries: int | None = 3
    default_retry_delay: float = 180
    rate_limit: str | None = None
    ignore_result: bool = False
    rate: tuple[int, int] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task here and now, as Celery's `task(...)` does (`self.request.called_directly` is True)."""
        return self.func(self, *args, **kwargs) if self.bind else self.func(*args, **kwargs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self(*args, **kwargs)

    @property
    def request(self) -> Request:
        """The running job (Request), or a Request with `called_directly` outside a job."""
        request = _request.get()
        return request if request is not None and request.task == self.name else Request(None, self)

    def AsyncResult(self, task_id: str) -> AsyncResult:  # noqa: N802  (Celery's name)
        return AsyncResult(task_id)

    def retry(self, args: Any = None, kwargs: Any = None, exc: BaseException | None = None, throw: bool = True,
              eta: datetime | None = None, countdown: float | None = None, max_retries: int | None = None,
              **options: Any) -> Retry:
        """End this attempt and run the job again after `countdown` seconds (or at `eta`; default_retry_delay by
        default): raises Retry, as Celery's does. With the retries spent (`max_retries`, the task's by default),
        it raises `exc`, or MaxRetriesExceededError, as the job's final failure."""
        given = [name for name, value in (("args", args), ("kwargs", kwargs)) if value is not None] + list(options)
        if given:
            raise ImproperlyConfigured(f"self.retry() cannot take {', '.join(given)}: echomq runs the job again "
                                       "with its own arguments and options")
        if not throw:
            raise ImproperlyConfigured("self.retry(throw=False) cannot be: the retry is the attempt's end")
        if exc is not None and not isinstance(exc, BaseException):
            raise ImproperlyConfigured(f"self.retry(exc=) takes an exception, not {exc!r}")
        if eta is not None and (not isinstance(eta, datetime) or eta.tzinfo is None):
            raise ImproperlyConfigured(f"self.retry(eta=) takes an aware datetime, not {eta!r}")
        if countdown is not None and not _seconds(countdown):
            raise ImproperlyConfigured(f"self.retry(countdown=) takes seconds from 0 to {MAX_WAIT_S}, "
                                       f"not {countdown!r}")
        request = self.request
        if request.called_directly:
            raise exc if exc is not None else MaxRetriesExceededError(f"{self.name} retried outside a job")
        limit = self.max_retries if max_retries is None else max_retries
        if request.job is not None:  # the attempts were fixed when the job was added: a retry past them cannot be
            limit = request.job.opts.attempts - 1 if limit is None else min(limit, request.job.opts.attempts - 1)
        if limit is not None and request.retries >= limit:
            if exc is not None:
                raise fail_for_good(exc)
            raise fail_for_good(MaxRetriesExceededError(
                f"Can't retry {self.name}[{request.id}] args:{request.args} kwargs:{request.kwargs}"))
        if eta is not None:
            countdown = min(max((eta - datetime.now(UTC)).total_seconds(), 0), MAX_WAIT_S)
        elif countdown is None:
            countdown = self.default_retry_delay
        raise Retry(countdown=countdown, reason=f"{type(exc).__name__}: {exc}" if exc is not None else "")

    def update_state(self, task_id: str | None = None, state: str | None = None, meta: Any = None,
                     **_: Any) -> None:
        """Report a state and its meta while the job runs (its progress): AsyncResult.state and .info show them."""
        job = current_job()
        if job is None or (task_id is not None and task_id != job.id):
            raise ImproperlyConfigured("update_state sets the state of the running job only (echomq has no result "
                                       "backend to write another task's state to)")
        job.update_progress({UPDATE_STATE_KEY: state or "PROGRESS", "meta": meta})

    # Celery's hooks: override them in a base class. Their own errors are logged, not raised.
    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        pass

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        pass

    def on_retry(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        pass

    def after_return(self, status: str, retval: Any, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        pass

    def invoke(self, job_record: Job, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run the task for a worker: its own rate limit first, then the function with Celery's semantics."""
        if self.rate is not None:
            wait_ms = get_queue(job_record.queue, long_running=True).task_rate_wait(
                self.name, *self.rate, job_record.id)
            if wait_ms > 0:
                raise Postponed(wait_ms / 1000, f"rate limit {self.rate_limit} of {self.name}")
        inputs = list(job_record.workflow_args)
        headers = _headers(job_record)
        if job_record.inputs_mode == "2" and len(inputs) == 2:  # an error callback: Celery's (request, exc, tb)
            watched = headers.get(ERRBACK_OF)
            if watched is not None and str(inputs[0]) != watched:  # Celery never sends a task after a failed one
                logger.info("job %s: error callback %s not called: job %s never ran (job %s before it failed)",
                            job_record.id, self.name, watched, inputs[0])
                return None
            failed = Request(None, None)
            failed.id = failed.correlation_id = str(inputs[0])
            immutable = headers.get(IMMUTABLE_ERRBACK) is True
            inputs = [] if immutable else [failed, rebuilt_error(str(inputs[1])), None]
        token = _request.set(Request(job_record, self))
        try:
            value = self.func(*([self] if self.bind else []), *inputs, *args, **kwargs)
        except BaseException as error:
            self._ended(job_record, error, args, kwargs)
            raise
        finally:
            _request.reset(token)
        self._hook(self.on_success, value, job_record.id, args, kwargs)
        self._hook(self.after_return, "SUCCESS", value, job_record.id, args, kwargs, None)
        return None if self.ignore_result and job_record.workflow_id is None else value

    def _ended(self, job_record: Job, error: BaseException, args: Any, kwargs: Any) -> None:
        """A failed attempt: retried (autoretry_for, self.retry) while attempts last, else failed for good."""
        retried = isinstance(error, Retry) or (isinstance(error, self.autoretry_for) and not isinstance(
            error, EchoMQError) and job_record.attempts_made + 1 < job_record.opts.attempts)
        if not retried and not isinstance(error, (EchoMQError, *self.autoretry_for)):
            fail_for_good(error)
        if retried and not getattr(error, "echomq_final", False):
            self._hook(self.on_retry, error, job_record.id, args, kwargs, None)
        else:
            self._hook(self.on_failure, error, job_record.id, args, kwargs, None)
            self._hook(self.after_return, "FAILURE", error, job_record.id, args, kwargs, None)

    def _hook(self, hook: Callable[..., Any], *arguments: Any) -> None:
        try:
            hook(*arguments)
        except Exception:
            logger.exception("the %s hook of task %s raised", hook.__name__, self.name)


def shared_task(*args: Any, **options: Any) -> Any:
    """Register a function as a Celery-style task (bare, `@shared_task`, or with options, `@shared_task(...)`).

    Options: bind, name, queue, priority, max_retries, default_retry_delay,
    autoretry_for, retry_backoff, retry_backoff_max, retry_jitter, retry_kwargs,
    rate_limit, time_limit, soft_time_limit, expires, ignore_result, acks_late,
    base. Any other is refused by name (ImproperlyConfigured).
    """
    if args and callable(args[0]) and len(args) == 1 and not options:
        return _task_from(args[0], {})
    if args:
        raise ImproperlyConfigured("shared_task takes the function alone, or options by name")
    return lambda func: _task_from(func, options)


task = shared_task


def _task_from(func: Callable[..., Any], options: dict[str, Any]) -> Task:
    for key in options:
        if key in REFUSED_OPTIONS:
            raise ImproperlyConfigured(f"shared_task cannot take {key}=: {REFUSED_OPTIONS[key]}")
        if key not in TASK_OPTIONS:
            raise ImproperlyConfigured(f"shared_task has no option {key}=; it takes {', '.join(TASK_OPTIONS)}")
    if options.get("serializer", "json") != "json":
        raise ImproperlyConfigured(f"shared_task cannot take serializer={options['serializer']!r}: echomq stores "
                                   "JSON only (never pickle)")
    base = options.get("base", Task)
    if not (isinstance(base, type) and issubclass(base, Task)):
        raise ImproperlyConfigured(f"base is a subclass of echomq_django.celery.Task, not {base!r}")
    autoretry_for = options.get("autoretry_for", ())
    if not isinstance(autoretry_for, (tuple, list)) or not all(
            isinstance(kind, type) and issubclass(kind, BaseException) for kind in autoretry_for):
        raise ImproperlyConfigured(f"autoretry_for is a tuple of exception classes, not {autoretry_for!r}")
    autoretry_for = tuple(autoretry_for)
    if not isinstance(options.get("retry_kwargs") or {}, dict):
        raise ImproperlyConfigured(f"retry_kwargs is a dict, not {options['retry_kwargs']!r}")
    retry_kwargs = dict(options.get("retry_kwargs") or {})
    if unknown := set(retry_kwargs) - {"max_retries", "countdown"}:
        raise ImproperlyConfigured(f"retry_kwargs takes max_retries and countdown, not {', '.join(sorted(unknown))}")
    max_retries = retry_kwargs.get("max_retries", options.get("max_retries", 3))
    if max_retries is not None and (isinstance(max_retries, bool) or not isinstance(max_retries, int)
                                    or not 0 <= max_retries < MAX_ATTEMPTS):
        raise ImproperlyConfigured(f"max_retries is a whole number from 0, or None, not {max_retries!r}")
    delay = retry_kwargs.get("countdown", options.get("default_retry_delay", 180))
    backoff = _backoff(options, delay)
    rate = parse_rate(options.get("rate_limit"))
    expires = options.get("expires")
    name = options.get("name") or f"{func.__module__}.{func.__qualname__}"
    try:
        validate_job_name(name)
    except (InvalidNameError, TypeError) as error:
        raise ImproperlyConfigured(f"shared_task cannot be named {name!r}: {error}") from None
    created = base(func, name, options.get("queue") or "default", attempts=(
        MAX_ATTEMPTS if max_retries is None else max_retries + 1), backoff=backoff,
        time_limit=options.get("time_limit"), soft_time_limit=options.get("soft_time_limit"),
        priority=options.get("priority") or 0, expires=expires, autoretry_for=autoretry_for,
        routed=not options.get("queue"), bind=bool(options.get("bind", False)), max_retries=max_retries,
        default_retry_delay=delay, rate_limit=options.get("rate_limit"),
        ignore_result=bool(options.get("ignore_result", False)), rate=rate)
    _check(created)
    registered: Task = register_function(created)
    return registered


def _backoff(options: dict[str, Any], delay: Any) -> Backoff:
    """The wait before a retry: exponential with retry_backoff (capped, jittered), else default_retry_delay."""
    factor = options.get("retry_backoff", False)
    if not _seconds(delay):
        raise ImproperlyConfigured(f"default_retry_delay (or retry_kwargs' countdown) is seconds from 0 to "
                                   f"{MAX_WAIT_S}, not {delay!r}")
    if factor is False or factor is None or factor == 0:
        return Backoff("fixed", round(delay * 1000))
    factor = 1 if factor is True else factor
    maximum = options.get("retry_backoff_max", 600)
    for value, what in ((factor, "retry_backoff"), (maximum, "retry_backoff_max")):
        if not _seconds(value) or value == 0:
            raise ImproperlyConfigured(f"{what} is a positive number of seconds up to {MAX_WAIT_S}, not {value!r}")
    return Backoff("exponential", round(factor * 1000), max_ms=round(maximum * 1000),
                   jitter=bool(options.get("retry_jitter", True)))


def _seconds(value: Any) -> bool:
    """Whether `value` is a number of seconds a job may wait: from 0 to MAX_WAIT_S (nan and inf are not)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 <= value <= MAX_WAIT_S


def _check(created: Task) -> None:
    """What @job checks at import, for a task (ImproperlyConfigured): its priority, expiry and time limits."""
    try:
        check_function_options(priority=created.priority, expires=created.expires, time_limit=created.time_limit,
                               soft_time_limit=created.soft_time_limit, what="shared_task",
                               call="apply_async(expires=...)")
    except PayloadError as error:
        raise ImproperlyConfigured(f"shared_task {created.name}: {error}") from None
