"""What a child process of the processes pool runs first, before its first job.

The worker (core.Worker, pool "processes") starts each child as a fresh Python
process and calls `setup` there before anything else, before the handler
(jobs.run_job, or echomq_worker's run_and_report) is unpickled: so this module
imports nothing of Django at its top, and the settings module is the one
DJANGO_SETTINGS_MODULE names in the environment the child inherits from
`manage.py echomq_worker`.
"""

from __future__ import annotations


def setup(verbosity: int | None = None) -> None:
    """Make this process a Django process that can run jobs: set Django up, import the jobs, close connections.

    Django is set up (apps, settings, LOGGING), every installed app's `jobs`
    module is imported as the worker does (so each @job is registered), and
    every database connection is closed, as Celery does in a new child, so none
    opened by an import outlives it. Each job then closes the unusable and
    expired ones before and after it runs (jobs.run_job).

    `verbosity` (echomq_worker's, bound with functools.partial): when LOGGING
    does not handle the "echomq" loggers, their records in this child (a job
    started, completed) go to its stdout and stderr, which it shares with the
    command, as the command shows its own.
    """
    import django

    django.setup()

    from django.db import connections

    from .discovery import discover_jobs

    if verbosity is not None:
        _show_echomq_logs(verbosity)
    discover_jobs()
    connections.close_all()


def _show_echomq_logs(verbosity: int) -> None:
    """Send the "echomq" loggers' records to this process's output, as echomq_worker shows them in its own."""
    import logging

    from django.core.management.base import BaseCommand

    from .command_output import LEVELS, CommandOutputHandler

    logger = logging.getLogger("echomq")
    if logger.hasHandlers():  # LOGGING handles them, in the child as in the command
        return
    level = LEVELS.get(verbosity, logging.DEBUG)
    logger.addHandler(CommandOutputHandler(BaseCommand(), level))
    logger.setLevel(level)
