"""Job functions: `@job` registers a function that `echomq_worker` can run.

    # myapp/jobs.py  (imported by echomq_worker in every installed app)
    from echomq_django.jobs import job

    @job(queue="mail", attempts=5)
    def send_welcome(user_id):
        ...

    send_welcome.enqueue(42)          # from a view, a signal, anywhere
    send_welcome.enqueue_with(args=(42,), delay_ms=60_000)   # in a minute

    @job(queue="reports", time_limit=300, soft_time_limit=280)   # seconds; override the queue's
    def build_report(report_id):
        ...

The queue must be in ECHOMQ["QUEUES"]: enqueue refuses any other (no worker
would serve it), and `manage.py check` names each @job that uses one (echomq.E013).
The job's data is {"args": [...], "kwargs": {...}} as JSON. A worker runs only
functions registered this way, looked up by the job's name. (Jobs of Django's
Tasks framework are the one other kind: see backends.py, and task_results.py,
which imports a task's module only from inside an installed app.)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections

from . import outbox, registry
from .calling import MAP_JOB, CeleryCalls
from .conf import get_settings, unserved_queue
from .core import (
    Backoff,
    Dedupe,
    EchoMQError,
    Job,
    JobHandle,
    JobOptions,
    Member,
    NewJob,
    PayloadError,
    UnrecoverableError,
    delay_until,
    fail_for_good,
    now_ms,
)
from .discovery import discover_jobs as discover_jobs  # public here too: echomq_django.jobs.discover_jobs
from .job_options import expiry_ms, naive_zone, time_limits_ms
from .queues import get_queue
from .registry import current_job as current_job  # public here: echomq_django.jobs.current_job
from .registry import register_function as register_function
from .registry import registered_jobs as registered_jobs
from .routes import route
from .workflows import Signature

# The name of the steps of an admin's bulk action run by the queue's workers (bulk_steps.py registers it).
BULK_STEP_JOB = "echomq.bulk-run"
# The package's own jobs, by name: each is called with the Job (bulk_steps.py registers the bulk action's step).
_builtin: dict[str, Callable[[Job], Any]] = {}


@dataclass
class JobFunction(CeleryCalls):
    """A registered job function; call it directly, or `enqueue` it (or, in Celery's words, `delay` it)."""

    func: Callable[..., Any]
    name: str
    queue: str = "default"
    attempts: int | None = None  # None: the queue's ATTEMPTS
    backoff: Backoff | None = None  # None: the queue's BACKOFF
    time_limit: float | None = None  # seconds; None: the queue's TIME_LIMIT
    soft_time_limit: float | None = None  # seconds; None: the queue's SOFT_TIME_LIMIT
    group: str = ""  # every job's group, unless enqueue_with gives one ("": none)
    priority: int = 0  # every job's priority (MIN_PRIORITY..MAX_PRIORITY, higher first), unless enqueue_with gives one
    expires: float | timedelta | None = None  # seconds after it is added past which a job never starts
    # Set: only these exceptions are retried (while attempts are left); any other fails the job for good.
    autoretry_for: tuple[type[BaseException], ...] = ()
    result_ttl: float | None = None  # seconds a completed job (its result) is kept at most; None: the queue's
    # Deduplication of every job (enqueue_with can give each its own): a key, or a callable of the job's
    # arguments that returns one; `unique` keys on the function and its arguments. See dedupe_for.
    dedupe: str | Callable[..., str] | None = None
    unique: bool = False
    dedupe_ttl_ms: int = 0
    debounce_ms: int = 0
    debounce: str = "replace"
    routed: bool = False  # no queue of its own: ECHOMQ["TASK_ROUTES"] may give one, else `queue` ("default")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def invoke(self, job_record: Job, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """Run the function for a worker: a workflow's inputs before the job's own arguments."""
        try:
            return self.func(*job_record.workflow_args, *args, **kwargs)
        except BaseException as error:
            # With autoretry_for, another error fails for good (echomq's own errors keep their meaning).
            if self.autoretry_for and not isinstance(error, (*self.autoretry_for, EchoMQError)):
                fail_for_good(error)
            raise

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A workflow signature (echomq_django.workflows): the previous step's result comes before these."""
        return Signature(self, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: the previous step's result is not passed."""
        return Signature(self, args, kwargs, immutable=True)

    def workflow_member(self, signature: Signature) -> Member:
        """The job a signature of this function adds to a workflow, with its options over the function's."""
        options = signature.options
        queue_name, priority = self.destination(options.get("queue"), options.get("priority"), signature.args,
                                                signature.kwargs)
        if problem := unserved_queue(queue_name):
            raise ImproperlyConfigured(f"@job {self.name} cannot be added to a workflow: {problem}.")
        queue = get_queue(queue_name)
        limits = time_limits_ms(options.get("time_limit", self.time_limit),
                                options.get("soft_time_limit", self.soft_time_limit))
        opts = queue.default_opts.overridden(
            attempts=options.get("attempts", self.attempts), backoff=self.backoff,
            delay_ms=options.get("delay_ms", 0), priority=priority,
            time_limit_ms=limits["time_limit_ms"], soft_time_limit_ms=limits["soft_time_limit_ms"],
            group=options.get("group", self.group))
        return Member(queue, self.name, job_data(signature.args, signature.kwargs, options.get("headers")), opts,
                      immutable=signature.immutable, allow_failure=bool(options.get("allow_failure", False)),
                      job_id=options.get("task_id"))

    def destination(self, queue: str | None, priority: int | None, args: Any = (),
                    kwargs: Any = None) -> tuple[str, int]:
        """The queue and priority of one of its jobs: the call's, else a route's (a function without a queue of its
        own, ECHOMQ["TASK_ROUTES"]), else its own."""
        if queue is None and self.routed and (found := route(get_settings().task_routes, self.name, args, kwargs,
                                                             self)):
            queue = found.get("queue")
            priority = found.get("priority") if priority is None else priority
        return queue or self.queue, self.priority if priority is None else priority

    def enqueue(self, *args: Any, **kwargs: Any) -> JobHandle:
        """Add a job that runs this function with these JSON arguments; its id, a JobHandle (a str with `.status`,
        `.result`, `.wait(timeout)` and `await .await_result(timeout)`)."""
        return self.enqueue_with(args=args, kwargs=kwargs)

    def enqueue_with(self, *, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None,
                     delay_ms: int = 0, eta: datetime | None = None, job_id: str | None = None,
                     group: str | None = None, priority: int | None = None,
                     expires: float | timedelta | datetime | None = None, dedupe: str | None = None,
                     dedupe_ttl_ms: int | None = None, debounce_ms: int | None = None,
                     debounce: str | None = None, queue: str | None = None, time_limit: float | None = None,
                     soft_time_limit: float | None = None, headers: dict[str, Any] | None = None) -> JobHandle:
        """`enqueue` with a delay (`delay_ms`, or `eta`: an aware datetime to run at; a past one runs now), a job id
        of the caller's choosing, a group, a priority or an expiry (the job function's by default).

        `expires` (seconds, a timedelta, or a datetime): a job not started by then never starts; it fails
        with the reason "expired". Retries and recoveries past it fail so too.

        `dedupe` (a key): while a job added with it is waiting, delayed or running, this adds nothing and
        returns that job's id; `dedupe_ttl_ms` holds the key that long whatever the job does (a throttle);
        `debounce_ms` makes the job wait that window, and an enqueue within it pushes the start back and
        replaces its arguments (`debounce="keep"`: keeps the first ones).

        Inside a transaction on a queue with the outbox (ECHOMQ["OUTBOX"]), the
        job is written in that transaction and sent after the commit (echomq_django/outbox/).

        A group (a tenant, a user: the id alphabet) takes turns with the queue's
        other groups, and the queue's GROUP_MAX_ACTIVE caps its running jobs.

        `queue` sends this job to another queue (a route of ECHOMQ["TASK_ROUTES"]
        otherwise, for a function without a queue of its own); `time_limit` and
        `soft_time_limit` (seconds) override the function's for this job;
        `headers` (a JSON dict) travel with it (a bound task reads them as `self.request.headers`).

        Raises ImproperlyConfigured when the queue is not in ECHOMQ["QUEUES"].
        """
        queue_name, priority = self.destination(queue, priority, args, kwargs)
        if problem := unserved_queue(queue_name):
            raise ImproperlyConfigured(f"@job {self.name} cannot be enqueued: {problem}.")
        timestamp = now_ms()  # the job's creation: its delay and expiry count from it
        if eta is not None:
            if delay_ms:
                raise PayloadError("give a job delay_ms or eta, not both")
            delay_ms = delay_until(eta, timestamp, naive_zone())
        target = get_queue(queue_name)
        opts = target.default_opts.overridden(attempts=self.attempts, backoff=self.backoff, delay_ms=delay_ms,
                                             priority=priority,
                                             expires_ms=expiry_ms(self.expires if expires is None else expires,
                                                                  timestamp),
                                             result_ttl_ms=None if self.result_ttl is None else expiry_ms(
                                                 self.result_ttl, 0),
                                             **time_limits_ms(self.time_limit if time_limit is None else time_limit,
                                                              self.soft_time_limit if soft_time_limit is None
                                                              else soft_time_limit),
                                             group=self.group if group is None else group)
        deduplicated = self.dedupe_for(args, kwargs or {}, dedupe, dedupe_ttl_ms, debounce_ms, debounce)
        job_id = outbox.enqueue(target, NewJob(self.name, job_data(args, kwargs, headers), opts, job_id,
                                               deduplicated), timestamp_ms=timestamp)
        return JobHandle(job_id, target)


    def dedupe_for(self, args: tuple[Any, ...], kwargs: dict[str, Any], key: str | None = None,
                   ttl_ms: int | None = None, debounce_ms: int | None = None,
                   debounce: str | None = None) -> Dedupe | None:
        """The deduplication of one enqueue: its own key and modes over the function's; None for none."""
        if key is None:
            if callable(self.dedupe):
                key = self.dedupe(*args, **kwargs)
            elif self.dedupe is not None:
                key = self.dedupe
            elif self.unique:
                arguments = json.dumps([list(args), kwargs], sort_keys=True, separators=(",", ":"), default=str)
                key = f"{self.name}:{hashlib.sha256(arguments.encode()).hexdigest()[:32]}"
        if key is None:
            return None
        mode = self.debounce if debounce is None else debounce
        if mode not in ("replace", "keep"):
            raise PayloadError(f"debounce is \"replace\" or \"keep\", not {mode!r}")
        return Dedupe(key, ttl_ms=self.dedupe_ttl_ms if ttl_ms is None else ttl_ms,
                      debounce_ms=self.debounce_ms if debounce_ms is None else debounce_ms, keep_first=mode == "keep")


def job(func: Callable[..., Any] | None = None, *, name: str | None = None, queue: str | None = None,
        attempts: int | None = None, backoff: Backoff | None = None,
        time_limit: float | None = None, soft_time_limit: float | None = None, group: str = "",
        priority: int = 0, expires: float | timedelta | None = None,
        autoretry_for: tuple[type[BaseException], ...] = (), retry_backoff: bool | float | Backoff = False,
        max_retries: int | None = None, result_ttl: float | None = None,
        dedupe: str | Callable[..., str] | None = None, unique: bool = False, dedupe_ttl_ms: int = 0,
        debounce_ms: int = 0, debounce: str = "replace") -> Any:
    """Register `func` as a job function (usable bare, `@job`, or with options, `@job(...)`).

    `attempts`, `backoff` and the time limits (seconds, fractions allowed)
    default to the queue's settings (ATTEMPTS, BACKOFF, TIME_LIMIT, SOFT_TIME_LIMIT).
    At `soft_time_limit` SoftTimeLimitExceeded is raised in the job; at
    `time_limit` the attempt fails (on the processes pool its child is killed).
    `group` puts every job of the function in that group, and `priority`
    (MIN_PRIORITY..MAX_PRIORITY, higher runs first) gives them that priority
    (enqueue_with can give each job its own of either). `expires` (seconds, or a
    timedelta): a job not started that long after it was added never starts.

    As Celery's: `autoretry_for` (exception classes) retries only those, and
    fails the job for good on any other; `max_retries=N` is `attempts=N + 1`;
    `retry_backoff` True waits 1 s, 2 s, 4 s... between attempts, a number
    of seconds starts there, a Backoff is used as it is (it takes the place
    of `backoff`). Inside a job, `raise Retry(countdown=, reason=)` (or
    `current_job().retry(...)`) ends the attempt and runs the job again.
    `result_ttl` (seconds): a completed job, its result, is kept that long at
    most (the queue's RESULT_TTL by default; its KEEP_COMPLETED may trim sooner).
    `dedupe` (a key, or a callable of the job's arguments returning one) or
    `unique=True` (the function and its arguments), with `dedupe_ttl_ms` or
    `debounce_ms` / `debounce`: see enqueue_with.
    """

    # Wrong values fail at import (PayloadError), not at the first enqueue.
    check_function_options(priority=priority, group=group, expires=expires, time_limit=time_limit,
                           soft_time_limit=soft_time_limit)
    attempts, backoff = _celery_retries(attempts, backoff, retry_backoff, max_retries)
    if result_ttl is not None:
        expiry_ms(result_ttl, 0)  # a positive duration, as an expiry
    if isinstance(dedupe, str) or dedupe_ttl_ms or debounce_ms or debounce != "replace":
        Dedupe(dedupe if isinstance(dedupe, str) else "check", ttl_ms=dedupe_ttl_ms, debounce_ms=debounce_ms,
               keep_first=debounce == "keep")
    if dedupe is not None and unique:
        raise PayloadError("give a @job dedupe or unique=True, not both")
    autoretry_for = tuple(autoretry_for)
    if not all(isinstance(kind, type) and issubclass(kind, BaseException) for kind in autoretry_for):
        raise PayloadError(f"autoretry_for is a tuple of exception classes, not {autoretry_for!r}")

    def register(target: Callable[..., Any]) -> JobFunction:
        job_name = name or f"{target.__module__}.{target.__qualname__}"
        return register_function(JobFunction(
            target, job_name, queue or "default", attempts, backoff, time_limit, soft_time_limit, group, priority,
            expires, autoretry_for, result_ttl, dedupe, unique, dedupe_ttl_ms, debounce_ms, debounce,
            routed=queue is None))

    return register(func) if func is not None else register


def check_function_options(*, priority: int = 0, group: str = "", expires: Any = None, time_limit: Any = None,
                           soft_time_limit: Any = None, what: str = "@job", call: str = "enqueue_with") -> None:
    """The options every job of a function gets, checked when it is registered (PayloadError): its priority and
    group, its expiry (a duration: a datetime belongs to one call, `call`), its time limits."""
    if group or priority:
        JobOptions(group=group, priority=priority)
    if isinstance(expires, datetime):
        raise PayloadError(f"{what}(expires=) is a duration (seconds, a timedelta); a datetime goes to {call}")
    expiry_ms(expires, 0)
    time_limits_ms(time_limit, soft_time_limit)


def job_data(args: Any, kwargs: Any, headers: Any = None) -> dict[str, Any]:
    """A job's data: its JSON arguments, and the headers of the call when it gave some (PayloadError if not a
    dict: a job's data is checked as JSON when it is encoded)."""
    data: dict[str, Any] = {"args": list(args), "kwargs": dict(kwargs or {})}
    if headers:
        if not isinstance(headers, dict):
            raise PayloadError(f"headers are a dict, not {headers!r}")
        data["headers"] = headers
    return data


def _celery_retries(attempts: int | None, backoff: Backoff | None, retry_backoff: bool | float | Backoff,
                    max_retries: int | None) -> tuple[int | None, Backoff | None]:
    """@job's attempts and backoff, from Celery's names for them where given (PayloadError for both at once)."""
    if max_retries is not None:
        if attempts is not None:
            raise PayloadError("give a @job attempts or max_retries (attempts = max_retries + 1), not both")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise PayloadError(f"max_retries is a whole number from 0, not {max_retries!r}")
        attempts = max_retries + 1  # (JobOptions holds it to MAX_ATTEMPTS below)
    if retry_backoff is not False:
        if backoff is not None:
            raise PayloadError("give a @job backoff or retry_backoff, not both")
        if isinstance(retry_backoff, Backoff):
            backoff = retry_backoff
        elif retry_backoff is True:
            backoff = Backoff("exponential", 1000)
        elif isinstance(retry_backoff, (int, float)) and not isinstance(retry_backoff, bool) and retry_backoff > 0:
            backoff = Backoff("exponential", round(retry_backoff * 1000))
        else:
            raise PayloadError(f"retry_backoff is True, a number of seconds or a Backoff, not {retry_backoff!r}")
    if attempts is not None:
        JobOptions(attempts=attempts)
    return attempts, backoff


def _run_map(job_record: Job) -> Any:
    from .calling import run_map

    return run_map(job_record, registry.registry_now())


_builtin[MAP_JOB] = _run_map


def register_builtin(name: str, handler: Callable[[Job], Any]) -> None:
    """Register one of the package's own jobs: `handler(job)` runs it (its module calls this at import)."""
    _builtin[name] = handler


def run_job(job_record: Job) -> Any:
    """The worker's handler: run the @job function (or Django Task) the job names.

    Database connections are closed before and after, as Django does around a
    request and Celery around a task: those that are unusable or older than
    CONN_MAX_AGE (with the default 0, every one), in the worker's threads and in
    the processes pool's children alike (a child closes what it inherited when
    it starts: child.setup).
    """
    close_old_connections()
    token = registry.running.set(job_record)
    try:
        return _dispatch(job_record)
    finally:
        registry.running.reset(token)
        close_old_connections()


def _dispatch(job_record: Job) -> Any:
    # The Tasks framework only when it is used.
    from .backends import run_task_job
    from .task_results import is_task_job

    if is_task_job(job_record):
        return run_task_job(job_record)
    if (builtin := _builtin.get(job_record.name)) is not None:
        return builtin(job_record)
    if job_record.name == BULK_STEP_JOB:
        raise UnrecoverableError(
            f"job {job_record.id} is a step of an admin's bulk action, and this worker's settings do not install "
            "the admin (django.contrib.admin and echomq_django in INSTALLED_APPS) that runs it")
    function = registry.registry_now().get(job_record.name)
    if function is None:
        raise UnrecoverableError(
            f"no job function named {job_record.name!r} is registered in this worker "
            "(is the module with its @job imported, e.g. an app's jobs.py?)")
    payload = job_record.data
    args = payload.get("args", []) if isinstance(payload, dict) else None
    kwargs = payload.get("kwargs", {}) if isinstance(payload, dict) else None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise UnrecoverableError(
            f"job {job_record.id} has data that is not {{\"args\": [...], \"kwargs\": {{...}}}}")
    return function.invoke(job_record, args, kwargs)
