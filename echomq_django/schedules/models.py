"""The Schedule model: the schedules kept in the database and edited in the admin (the app's models.py imports it)."""

from typing import Any

from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.db import models

from ..core import MAX_PRIORITY, MIN_PRIORITY
from .parsing import FIELD_OF_OPTION, Entry, parse_schedule, settings_entries


class Schedule(models.Model):
    """A periodic job kept in the database and edited in the admin; echomq_beat reads these rows every interval.

    The same options as a schedule of ECHOMQ["SCHEDULES"] (see parsing.py),
    checked by the same code when the row is cleaned. What Redis remembers
    (the latest tick and job) is shown beside it, never stored here.
    """

    name = models.CharField(max_length=100, unique=True,
                            help_text="Part of the job ids of its ticks (name@tick); letters, digits and _ . @ + = -.")
    task = models.CharField(max_length=255, help_text="Dotted path of a Django @task or an echomq @job function.")
    cron = models.CharField("cron", max_length=100, blank=True,
                            help_text="Five fields: minute hour day-of-month month day-of-week, e.g. 0 3 * * 1-5. "
                                      "Give this or Every.")
    every = models.FloatField("every (seconds)", null=True, blank=True,
                              help_text="Seconds between ticks, at whole multiples since the epoch. Give this or Cron.")
    args = models.JSONField(default=list, blank=True, help_text="JSON list of positional arguments.")
    kwargs = models.JSONField(default=dict, blank=True, help_text="JSON object of keyword arguments.")
    queue = models.CharField(max_length=128, blank=True, help_text="Empty: the task's own queue.")
    timezone = models.CharField("time zone", max_length=64, blank=True,
                                help_text="Of the cron expression; empty: settings.TIME_ZONE.")
    enabled = models.BooleanField(default=True)
    catch_up = models.BooleanField(default=True,
                                   help_text="After the scheduler was down, fire the newest missed tick once. "
                                             "Off: skip missed ticks.")
    skip_if_running = models.BooleanField(default=False,
                                          help_text="Skip a tick while the previous tick's job has not finished.")
    priority = models.IntegerField(null=True, blank=True,
                                   help_text=f"{MIN_PRIORITY}..{MAX_PRIORITY}; empty: the task's own.")
    attempts = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: the task's or queue's own.")
    created_at = models.DateTimeField(auto_now_add=True)
    # Ticks before this are not caught up: re-enabling a schedule does not fire what it slept through.
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [("run_schedule", "Can run a schedule now")]

    def __str__(self) -> str:
        return self.name

    def options(self) -> dict[str, Any]:
        """The row as the options of a schedule of ECHOMQ["SCHEDULES"]."""
        return {"TASK": self.task, "CRON": self.cron or None, "EVERY": self.every, "ARGS": self.args,
                "KWARGS": self.kwargs, "QUEUE": self.queue or None, "TIMEZONE": self.timezone or None,
                "ENABLED": self.enabled, "CATCH_UP": self.catch_up, "SKIP_IF_RUNNING": self.skip_if_running,
                "PRIORITY": self.priority, "ATTEMPTS": self.attempts}

    def entry(self, *, importing: bool = False) -> Entry:
        """The row read as a schedule; its TASK's module is imported only for the scheduler (see parse_schedule)."""
        since_ms = int(self.updated_at.timestamp() * 1000) if self.updated_at else 0
        return parse_schedule(self.name, self.options(), since_ms=since_ms, where=f"schedule {self.name!r}",
                              source="database", importing=importing)

    def clean(self) -> None:
        """The errors parse_schedule finds, on the fields they are about; a name that settings use."""
        try:
            problems = self.entry().problems
            taken = any(entry.name == self.name for entry in settings_entries())
        except ImproperlyConfigured as error:  # ECHOMQ itself is broken: say so on the form
            raise ValidationError(f"ECHOMQ cannot be read, so the schedule cannot be checked: {error}") from None
        errors: dict[str, list[str]] = {}
        for option, problem in problems:
            if not problem.warning:
                errors.setdefault(FIELD_OF_OPTION.get(option, "name"), []).append(problem.message)
        if taken:
            errors.setdefault("name", []).append(
                f"ECHOMQ['SCHEDULES'] has a schedule named {self.name!r}; pick another name.")
        if errors:
            raise ValidationError(errors)

