"""System checks (`manage.py check`): the ECHOMQ setting, and the queues @job functions send to.

The Tasks backend checks its own TASKS entry (EchoMQBackend.check, run by Django's Tasks checks).
"""

from typing import Any

from django.core import checks
from django.utils.module_loading import autodiscover_modules

from .conf import settings_problems


@checks.register("echomq")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report every problem of the ECHOMQ setting, each with its id and a hint."""
    return [
        (checks.Warning if problem.warning else checks.Error)(problem.message, hint=problem.hint, id=problem.id)
        for problem in settings_problems()
    ]


def echomq_settings_readable() -> bool:
    """Whether ECHOMQ has no errors, so the checks that need its queues can read them."""
    return not any(not problem.warning for problem in settings_problems())


# A tag of its own: this check imports every app's jobs.py, which checks of the setting alone need not do.
@checks.register("echomq_jobs")
def check_job_queues(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Refuse each @job whose queue is not in ECHOMQ["QUEUES"]: its jobs would never run."""
    from .jobs import registered_jobs, unserved_queue

    if not echomq_settings_readable():
        return []  # check_settings reports why
    autodiscover_modules("jobs")  # as echomq_worker does, so every @job is registered
    return [
        checks.Error(f"@job {name}: {problem}, and its enqueue raises ImproperlyConfigured.", id="echomq.E013",
                     hint=f"Add {function.queue!r} to ECHOMQ['QUEUES'], or give the @job a configured queue.")
        for name, function in sorted(registered_jobs().items())
        if (problem := unserved_queue(function.queue))
    ]


# A tag of its own, like echomq_jobs: reading a schedule imports its task's module.
@checks.register("echomq_schedules")
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report every problem of ECHOMQ["SCHEDULES"]: a bad cron, an unknown task, arguments that are not JSON..."""
    from .schedules import schedules_problems

    autodiscover_modules("jobs")
    return [
        (checks.Warning if problem.warning else checks.Error)(problem.message, hint=problem.hint, id=problem.id)
        for problem in schedules_problems()
    ]
