"""Reading a schedule's options, from ECHOMQ["SCHEDULES"] or a Schedule row (the model reads its rows here).

    ECHOMQ["SCHEDULES"] = {
        "nightly-report": {"TASK": "reports.tasks.build", "CRON": "0 3 * * 1-5",
                           "TIMEZONE": "Europe/Berlin", "KWARGS": {"full": True}},
        "heartbeat": {"TASK": "myapp.jobs.ping", "EVERY": 30},
    }

One reading of a schedule's options serves the settings (system checks),
the admin's form and the scheduler: `parse_schedule`, which reports every
problem as a Problem tied to its option.
"""

from __future__ import annotations

import functools
import logging
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from ..conf import get_settings, settings_problems, unserved_queue
from ..core import (
    ALPHABET,
    MAX_PRIORITY,
    MAX_SCHEDULE_NAME,
    MIN_EVERY_MS,
    MIN_PRIORITY,
    InvalidNameError,
    JobOptions,
    PayloadError,
    Schedule,
    ScheduleError,
    check_cron,
    decode_stored,
    encode_json,
    validate_name,
    zone,
)
from ..discovery import discover_jobs
from ..job_options import expiry_ms, own_time_limits_ms
from ..jobs import JobFunction, registered_jobs
from ..settings_values import MAX_SECONDS, Problem

logger = logging.getLogger("echomq.beat")

# Every option of a schedule, with its default (None: see parse_schedule).
SCHEDULE_OPTIONS: dict[str, Any] = {
    "TASK": None,  # dotted path of a Django @task or an echomq @job
    "CRON": None,  # five-field cron expression, in TIMEZONE
    "EVERY": None,  # seconds between ticks (fractions allowed); ticks at whole multiples since the epoch
    "ARGS": [],
    "KWARGS": {},
    "QUEUE": None,  # None: the task's or job's own queue
    "TIMEZONE": None,  # None: settings.TIME_ZONE
    "ENABLED": True,
    "CATCH_UP": True,  # after downtime, fire the newest missed tick once; False: skip missed ticks
    "SKIP_IF_RUNNING": False,  # skip a tick while the previous tick's job has not finished
    "PRIORITY": None,  # None: the task's own priority (0 for a @job)
    "ATTEMPTS": None,  # None: the task's or job's own, else the queue's ATTEMPTS
}
FLAGS = ("ENABLED", "CATCH_UP", "SKIP_IF_RUNNING")
HINTS = {
    "TASK": "Give the dotted path of a Django @task (its backend echomq's) or of an echomq @job (in an "
            "installed app's jobs.py), e.g. 'myapp.tasks.send_report' or 'myapp.jobs.ping'.",
    "CRON": "Use five fields, minute hour day-of-month month day-of-week, e.g. '0 3 * * 1-5'.",
    "EVERY": f"Use seconds from {MIN_EVERY_MS / 1000:g} up to ten years, e.g. 30 or 0.5.",
    "ARGS": "Use a list of JSON values, e.g. [1, \"a\"].",
    "KWARGS": "Use a dict of JSON values with string keys, e.g. {\"full\": true}.",
    "QUEUE": "Use a queue of ECHOMQ['QUEUES'], or leave it out for the task's own.",
    "TIMEZONE": "Use an IANA name such as 'Europe/Berlin' or 'UTC'.",
    "PRIORITY": f"Use a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}.",
    "ATTEMPTS": "Use a whole number >= 1.",
    **{flag: "Use True or False." for flag in FLAGS},
}
# The check id of a problem with each option.
CHECK_IDS = {"TASK": "echomq.E018", "CRON": "echomq.E017", "EVERY": "echomq.E017", "TIMEZONE": "echomq.E017",
             "ARGS": "echomq.E019", "KWARGS": "echomq.E019", "QUEUE": "echomq.E020"}
# The Schedule model's field for each option (the admin's form shows a problem on its field).
FIELD_OF_OPTION = {"NAME": "name", "TASK": "task", "CRON": "cron", "EVERY": "every", "ARGS": "args",
                   "KWARGS": "kwargs", "QUEUE": "queue", "TIMEZONE": "timezone", "PRIORITY": "priority",
                   "ATTEMPTS": "attempts", **{flag: flag.lower() for flag in FLAGS}}


NOT_A_DICT = Problem("echomq.E016", "ECHOMQ['SCHEDULES'] must be a dict of schedule name -> options.",
                     'For example {"heartbeat": {"TASK": "myapp.jobs.ping", "EVERY": 30}}.')


@dataclass(frozen=True)
class Entry:
    """One schedule as configured: its name, where it comes from, and what it resolved to."""

    name: str
    source: str  # "settings" or "database"
    options: dict[str, Any]
    schedule: Schedule | None  # None when it has errors
    enabled: bool = True
    problems: list[tuple[str, Problem]] = field(default_factory=list)  # (option, problem)


def parse_schedule(name: Any, raw: Any, *, since_ms: int = 0, where: str | None = None,
                   source: str = "settings", importing: bool = False) -> Entry:
    """Read one schedule's options; every problem is reported with the option it is about.

    The TASK is looked up among the @job functions and tasks registered in this
    process, after the jobs.py discovery echomq_worker does. `importing` also
    imports the module TASK names (inside an installed app) as echomq_worker
    imports a task's: for the scheduler and for ECHOMQ["SCHEDULES"], never for
    what the admin's users type.
    """
    where = where or f"ECHOMQ['SCHEDULES'][{name!r}]"
    problems: list[tuple[str, Problem]] = []

    def problem(option: str, message: str) -> None:
        problems.append((option, Problem(CHECK_IDS.get(option, "echomq.E021"), message, HINTS.get(option, ""))))

    try:
        validate_name(name, "schedule name")
        if len(name) > MAX_SCHEDULE_NAME:
            raise InvalidNameError(f"schedule name is {len(name)} characters long; the limit is {MAX_SCHEDULE_NAME}")
    except InvalidNameError as error:
        problems.append(("NAME", Problem("echomq.E016", f"{where}: {error}.",
                                         f"Schedule names become part of Redis keys and job ids; use {ALPHABET}, "
                                         f"at most {MAX_SCHEDULE_NAME} characters.")))
        return Entry(str(name), source, {}, None, False, problems)
    if not isinstance(raw, dict):
        problems.append(("NAME", Problem("echomq.E016", f"{where} must be a dict of schedule options.",
                                         f"Known options: {', '.join(SCHEDULE_OPTIONS)}.")))
        return Entry(name, source, {}, None, False, problems)
    for unknown in sorted(set(raw) - set(SCHEDULE_OPTIONS), key=str):
        problems.append((str(unknown), Problem("echomq.W016", f"{where} has an unknown option {unknown!r}; it is "
                                               "ignored.", f"Known options: {', '.join(SCHEDULE_OPTIONS)}.",
                                               warning=True)))
    options = {**SCHEDULE_OPTIONS, **raw}
    flags = {}
    for flag in FLAGS:
        if not isinstance(options[flag], bool):
            problem(flag, f"{where}['{flag}'] must be True or False, not {options[flag]!r}.")
        flags[flag] = options[flag] if isinstance(options[flag], bool) else SCHEDULE_OPTIONS[flag]

    timing = _timing(options, where, problem)
    timezone = options["TIMEZONE"] if options["TIMEZONE"] is not None else settings.TIME_ZONE
    try:
        zone(timezone)
    except ScheduleError as error:
        problem("TIMEZONE", f"{where}['TIMEZONE']: {error}.")
    args, kwargs = _arguments(options, where, problem)
    priority, attempts = _job_options(options, where, problem)
    if options["QUEUE"] is not None:
        _queue(options["QUEUE"], where, problem)
    target = _target(options["TASK"], where, problem, importing=importing)

    schedule = None
    if target is not None and not any(not found.warning for _, found in problems):
        schedule = target.schedule(name, options["QUEUE"], args, kwargs, priority, attempts, where, problem,
                                   timing=timing, timezone=timezone, catch_up=flags["CATCH_UP"],
                                   skip_if_running=flags["SKIP_IF_RUNNING"], since_ms=since_ms)
    return Entry(name, source, dict(raw), schedule, flags["ENABLED"], problems)


def _timing(options: dict[str, Any], where: str, problem: Any) -> dict[str, Any]:
    cron, every = options["CRON"], options["EVERY"]
    if (cron is None) == (every is None):
        problem("CRON", f"{where} needs exactly one of CRON and EVERY.")
        return {}
    if cron is not None:
        try:
            return {"cron": check_cron(cron)}
        except ScheduleError as error:
            problem("CRON", f"{where}['CRON']: {error}.")
            return {}
    # The range before isfinite: an int past a float's range (2**1024) cannot be converted.
    if (isinstance(every, bool) or not isinstance(every, (int, float))
            or not MIN_EVERY_MS / 1000 <= every <= MAX_SECONDS or not math.isfinite(every)):
        problem("EVERY", f"{where}['EVERY'] must be seconds from {MIN_EVERY_MS / 1000:g} to {MAX_SECONDS:,} "
                         f"(ten years), not {every!r:.40}.")  # a 300-digit int is cut
        return {}
    return {"every_ms": round(every * 1000)}


def _arguments(options: dict[str, Any], where: str, problem: Any) -> tuple[list[Any], dict[str, Any]]:
    args, kwargs = options["ARGS"], options["KWARGS"]
    if isinstance(args, tuple):
        args = list(args)
    if not isinstance(args, list):
        problem("ARGS", f"{where}['ARGS'] must be a list, not {type(args).__name__}.")
        args = []
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) for key in kwargs):
        problem("KWARGS", f"{where}['KWARGS'] must be a dict with string keys.")
        kwargs = {}
    for option, value in (("ARGS", args), ("KWARGS", kwargs)):
        try:
            # Through JSON and back, as the job will carry them: what does not survive that is refused.
            if decode_stored(encode_json(value, f"{where}[{option!r}]")) != value:
                problem(option, f"{where}['{option}'] does not survive JSON unchanged (tuples, non-string keys).")
        except (PayloadError, ValueError) as error:
            problem(option, f"{where}['{option}'] is not JSON: {error}.")
    return args, kwargs


def _job_options(options: dict[str, Any], where: str, problem: Any) -> tuple[int | None, int | None]:
    priority, attempts = options["PRIORITY"], options["ATTEMPTS"]
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or not MIN_PRIORITY <= priority <= MAX_PRIORITY):
        problem("PRIORITY", f"{where}['PRIORITY'] must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}, "
                f"not {priority!r}.")
        priority = None
    if attempts is not None:
        try:
            JobOptions(attempts=attempts)
        except PayloadError as error:
            problem("ATTEMPTS", f"{where}['ATTEMPTS']: {error}.")
            attempts = None
    return priority, attempts


class _Target:
    """What a schedule's TASK names: a @job function or a Django Task, and how to make its job."""

    def __init__(self, path: str, found: Any) -> None:
        self.path, self.found = path, found

    def schedule(self, name: str, queue: str | None, args: list[Any], kwargs: dict[str, Any],
                 priority: int | None, attempts: int | None, where: str, problem: Any, *,
                 timing: dict[str, Any], **fields: Any) -> Schedule | None:
        own_limits = own_time_limits_ms(self.found)  # a @job's, or a task's (the same attribute names)
        if isinstance(self.found, JobFunction):
            queue = queue or self.found.queue
            own_attempts, backoff = self.found.attempts, self.found.backoff
            job_name, data = self.found.name, {"args": args, "kwargs": kwargs}
            own_priority = 0
            try:  # as the job will be stored: within the payload limit and the nesting limit
                encode_json(data, f"{where}: the job's data", get_settings().max_payload_bytes)
            except PayloadError as error:
                problem("ARGS", f"{error}.")
                return None
        else:
            task = self.found
            queue = queue or task.queue_name
            try:
                task = task.using(queue_name=queue, priority=task.priority if priority is None else priority)
            except Exception as error:  # InvalidTask: a queue its backend does not allow
                problem("QUEUE", f"{where}: task {self.path} cannot run on queue {queue!r}: {error}")
                return None
            own_attempts, backoff = getattr(task, "attempts", None), getattr(task, "backoff", None)
            job_name, own_priority = task.module_path, task.priority
            try:
                data = task.get_backend().job_data(task, args, kwargs, get_settings().max_payload_bytes)
            except PayloadError as error:
                problem("ARGS", f"{where}: {error}.")
                return None
        if not _queue(queue, where, problem):
            return None
        config = get_settings().queue(queue)
        try:  # the job's (or task's) group too: its ticks count against GROUP_MAX_ACTIVE like its other jobs
            opts = config.job_options.overridden(
                attempts=attempts if attempts is not None else own_attempts, backoff=backoff,
                priority=own_priority if priority is None else priority,
                time_limit_ms=own_limits["time_limit_ms"], soft_time_limit_ms=own_limits["soft_time_limit_ms"],
                group=getattr(self.found, "group", "") or "",
                expires_ms=expiry_ms(getattr(self.found, "expires", None), 0))  # the @job's own, from each firing
        except PayloadError as error:  # a PRIORITY for a job in a group
            problem("PRIORITY", f"{where}: {error}.")
            return None
        if not timing:
            return None
        try:
            return Schedule(name, queue, job_name, data, opts, **timing, **fields)
        except (ScheduleError, InvalidNameError) as error:
            problem("NAME", f"{where}: {error}.")
            return None


def _queue(queue: Any, where: str, problem: Any) -> bool:
    """Whether jobs sent to `queue` run (a configured queue); else the problem is reported."""
    try:
        validate_name(queue, "queue name")
    except InvalidNameError as error:
        problem("QUEUE", f"{where}['QUEUE']: {error}.")
        return False
    if why := unserved_queue(queue):
        problem("QUEUE", f"{where}: {why}.")
        return False
    return True


@functools.cache
def _discover_jobs() -> None:
    """Import every installed app's jobs.py, as echomq_worker does: once, not once per schedule."""
    discover_jobs()


@receiver(setting_changed)
def _rediscover_jobs(*, setting: str, **kwargs: Any) -> None:
    if setting == "INSTALLED_APPS":
        _discover_jobs.cache_clear()


# Modules this file imported to read a TASK that no installed app's jobs.py had imported:
# a @job found in one is unknown to echomq_worker, however often it is read again here.
_imported_for_schedules: set[str] = set()


def _target(path: Any, where: str, problem: Any, *, importing: bool) -> _Target | None:
    from django.apps import apps
    from django.utils.module_loading import import_string

    from ..backends import EchoMQBackend
    from ..tasks_compat import Task

    if not isinstance(path, str) or not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", path):
        problem("TASK", f"{where}['TASK'] must be the dotted path of a @task or @job function, not {path!r}.")
        return None
    # Nothing outside the installed apps is imported (a form in the admin must not run any
    # module's code), as the worker imports nothing else either.
    if apps.get_containing_app_config(path) is None:
        problem("TASK", f"{where}['TASK']: {path!r} is not inside an installed app, so the worker would not run it.")
        return None
    _discover_jobs()  # what echomq_worker imports, so a @job it knows is known here too
    module, _, attribute = path.rpartition(".")
    if importing:
        if module not in sys.modules:
            _imported_for_schedules.add(module)
        try:
            found = import_string(path)
        except Exception as error:  # ImportError, or whatever the module raises as it is imported
            problem("TASK", f"{where}['TASK']: cannot import {path!r}: {type(error).__name__}: {error}.")
            return None
    else:
        # Only what is imported already: any module of an installed app could be named here
        # (django.contrib.admin.tests imports selenium), and its import would run its code.
        loaded = sys.modules.get(module)
        found = getattr(loaded, "__dict__", {}).get(attribute)
        if found is None:
            problem("TASK", f"{where}['TASK']: {path!r} is not a registered @job or echomq @task. A @job is "
                            "registered by an installed app's jobs.py (which echomq_worker imports), a @task once its "
                            "module is imported (import it in that jobs.py); nothing else is imported to check it.")
            return None
    if isinstance(found, JobFunction):
        if module in _imported_for_schedules or registered_jobs().get(found.name) is not found:
            problem("TASK", f"{where}['TASK']: @job {path} is not imported by an installed app's jobs.py, "
                            "so echomq_worker would not know it.")
            return None
        return _Target(path, found)
    if not isinstance(found, Task):
        problem("TASK", f"{where}['TASK']: {path!r} is neither a Django @task nor an echomq @job.")
        return None
    try:
        backend = found.get_backend()
    except Exception as error:  # InvalidTaskBackend: an alias TASKS does not have
        problem("TASK", f"{where}['TASK']: {error}.")
        return None
    if not isinstance(backend, EchoMQBackend):
        problem("TASK", f"{where}['TASK']: task {path} uses backend {found.backend!r}, which is not echomq's "
                        "(TASKS[...]['BACKEND'] = 'echomq_django.backends.EchoMQBackend'), so no echomq_worker "
                        "would run its jobs.")
        return None
    return _Target(path, found)


def _configured() -> Any:
    """ECHOMQ["SCHEDULES"] as the settings have it ({} when ECHOMQ has none)."""
    raw = getattr(settings, "ECHOMQ", {})
    return raw.get("SCHEDULES", {}) if isinstance(raw, dict) else {}


def settings_entries() -> list[Entry]:
    """Every schedule of ECHOMQ["SCHEDULES"], as read now; ImproperlyConfigured when that is not a dict."""
    schedules = _configured()
    if not isinstance(schedules, dict):
        raise ImproperlyConfigured(f"{NOT_A_DICT.message} {NOT_A_DICT.hint}")
    return [parse_schedule(name, options, importing=True) for name, options in schedules.items()]


def schedules_problems() -> list[Problem]:
    """Every problem of ECHOMQ["SCHEDULES"] (for the system checks); none while ECHOMQ itself is broken."""
    if not isinstance(_configured(), dict):
        return [NOT_A_DICT]
    if any(not problem.warning for problem in settings_problems()):
        return []  # queues and defaults unknown: reported by the settings' own checks
    return [problem for entry in settings_entries() for _, problem in entry.problems]
