"""System checks (`manage.py check`): the ECHOMQ setting, the queues @job functions send to, and time limits.

The Tasks backend checks its own TASKS entry (EchoMQBackend.check, run by Django's Tasks checks).
"""

from typing import Any

from django.conf import settings
from django.core import checks
from django.db import DatabaseError

from . import routes
from .conf import get_settings, settings_problems, settings_readable, unserved_queue
from .core import OWN_CONNECTIONS_ENV, own_connections_wanted
from .jobs import discover_jobs, registered_jobs
from .outbox import outbox_in_use, outbox_state
from .schedules import schedules_problems
from .settings_values import Problem, short_token_problem, threads_time_limit_warning


def as_check(problem: Problem) -> checks.CheckMessage:
    """A settings problem as the system check reports it."""
    return (checks.Warning if problem.warning else checks.Error)(problem.message, hint=problem.hint, id=problem.id)


@checks.register("echomq")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report every problem of the ECHOMQ setting, each with its id and a hint."""
    return [as_check(problem) for problem in settings_problems()]


@checks.register("echomq")
def check_own_connections(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ECHOMQ_OWN_CONNECTIONS: refused at a command's start, and a web process's every enqueue; reported here."""
    try:
        own_connections_wanted()
    except ValueError as error:
        return [checks.Error(str(error), hint=f"Set {OWN_CONNECTIONS_ENV} to 1 or 0, or unset it.",
                             id="echomq.E024")]
    return []


@checks.register("echomq")
def check_metrics_token(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn of a short METRICS_TOKEN under DEBUG (echomq.W015); refuse it in production (echomq.E023)."""
    if not settings_readable():
        return []
    problem = short_token_problem(get_settings().metrics_token, debug=settings.DEBUG)
    return [as_check(problem)] if problem else []


# A tag of its own: this check imports every app's jobs.py, which checks of the setting alone need not do.
@checks.register("echomq_jobs")
def check_job_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse each @job whose queue is not in ECHOMQ["QUEUES"]: its jobs would never run."""
    if not settings_readable():
        return []  # check_settings reports why
    discover_jobs()  # as echomq_worker does, so every @job is registered
    return [
        checks.Error(f"@job {name}: {problem}, and its enqueue raises ImproperlyConfigured.", id="echomq.E013",
                     hint=f"Add {queue!r} to ECHOMQ['QUEUES'], or give the @job a configured queue.")
        for name, function in sorted(registered_jobs().items())
        if (problem := unserved_queue(queue := _queue_of(function)))
    ]


def _queue_of(function: Any) -> str:
    """The queue a function's jobs go to without a call's own: its route's, for one without a queue of its own
    (a router function that cannot answer without arguments leaves it its own)."""
    try:
        return function.destination(None, None)[0]
    except Exception:
        return function.queue


@checks.register("echomq")
def check_task_routes(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """ECHOMQ["TASK_ROUTES"]: every queue a route names is configured, every router's path imports (echomq.E025)."""
    if not settings_readable():
        return []
    errors = []
    for router in get_settings().task_routes:
        if isinstance(router, dict):
            errors += [checks.Error(f"ECHOMQ['TASK_ROUTES'] sends {pattern!r} to {problem}.", id="echomq.E025",
                                    hint="Add the queue to ECHOMQ['QUEUES'], or route the tasks to one that is.")
                       for pattern, found in router.items() if (problem := unserved_queue(found.get("queue", "")))
                       and found.get("queue")]
            continue
        try:
            routes.router_function(router)
        except (ImportError, AttributeError, TypeError, ValueError) as error:
            errors.append(checks.Error(f"ECHOMQ['TASK_ROUTES']: the router {router!r} cannot be used ({error}).",
                                       id="echomq.E025", hint="Give the dotted path of a function, "
                                       "router(name, args, kwargs, options, task=None)."))
    return errors


@checks.register("echomq_jobs")
def check_time_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Warn (echomq.W017) of each @job, and each @task on an echomq backend, whose hard time limit would apply
    on a queue that runs on threads: a thread cannot be killed.

    The queues' own TIME_LIMIT is checked with the setting (check_settings). The
    @task functions seen are those of the modules imported by then (by a
    jobs.py, a urls.py...): a check does not import modules that Django itself
    does not, since an app's tasks.py may well fail outside the project it serves.
    """
    from .backends import time_limited_tasks  # the Tasks framework, only here

    if not settings_readable():
        return []
    discover_jobs()
    limited = [(f"@job {name} has a time_limit of {function.time_limit:g} s", function.queue)
               for name, function in sorted(registered_jobs().items()) if function.time_limit is not None]
    limited += [(f"task {task.module_path} has a time_limit of {task.time_limit:g} s", task.queue_name)
                for task in time_limited_tasks()]
    queues = get_settings().queues
    return [
        checks.Warning(problem.message, hint=problem.hint, id=problem.id)
        for what, queue in limited
        if queue in queues and queues[queue].pool == "threads"  # an unconfigured queue is E013's or E014's
        for problem in [threads_time_limit_warning(what, queue)]
    ]


# A tag of its own, like echomq_jobs: reading a schedule imports its task's module.
@checks.register("echomq_schedules")
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report every problem of ECHOMQ["SCHEDULES"]: a bad cron, an unknown task, arguments that are not JSON..."""
    discover_jobs()
    return [as_check(problem) for problem in schedules_problems()]


@checks.register("echomq", deploy=True)
def check_outbox(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report outbox rows never to be sent: older than OUTBOX_MAX_AGE (W018), or unsendable as they are (W019)."""
    if not settings_readable() or not outbox_in_use():
        return []
    try:
        state = outbox_state()
    except DatabaseError as error:  # not migrated yet, or the database is away: not this check's to say
        return [checks.Warning(f"The outbox could not be read: {error}.", hint="Run manage.py migrate.",
                               id="echomq.W018")]
    found = []
    for queue, rows in state.items():
        if rows.stale:
            found.append(checks.Warning(
                f"Queue {queue!r} has {rows.stale} outbox row(s) older than ECHOMQ['OUTBOX_MAX_AGE']; they are "
                "not sent, as the record that keeps a job from being added twice may be gone.",
                hint="Look at them in the admin (Outbox jobs): delete them, then enqueue again what must still run "
                     "(a job id of your own is not added while its old row is there). "
                     "Is a relay (echomq_sweep or echomq_relay) running?", id="echomq.W018"))
        if rows.refused:
            found.append(checks.Warning(
                f"Queue {queue!r} has {rows.refused} outbox row(s) that cannot be sent as they are (edited by hand?); "
                "they are not sent again.",
                hint="The admin's Outbox jobs page shows each one's error.", id="echomq.W019"))
    return found
