"""A searchable copy of the jobs in each queue's failed and stalled sets, for the admin.

Redis stays the source of truth: the sweeper refreshes these rows after every
sweep (see mirror.py), and every admin action goes through the Lua scripts
before it touches a row.
"""

from django.db import models

from .core import MAX_PRIORITY, MIN_PRIORITY
from .outbox.models import OutboxJob, OutboxWorkflow  # noqa: F401  (models of this app, defined below their users)


class JobRecord(models.Model):
    """One job of a failed or stalled set, as its hash was when last synced."""

    class State(models.TextChoices):
        FAILED = "failed", "failed"
        STALLED = "stalled", "marked stalled"

    queue = models.CharField(max_length=128)
    job_id = models.CharField("job id", max_length=149)  # core.keys.MAX_ID_LENGTH: a generated id
    name = models.CharField(max_length=255, blank=True)
    state = models.CharField(max_length=16, choices=State.choices)
    data = models.JSONField(null=True, blank=True)
    opts = models.JSONField(default=dict, blank=True)
    attempts_made = models.IntegerField(default=0)
    stall_count = models.IntegerField(default=0)
    failed_reason = models.TextField(blank=True)
    stacktrace = models.JSONField(default=list, blank=True)
    # The dotted class of the last exception the job raised (the hash's `errc`), "" when none was recorded;
    # None: copied before this column existed, and copied again by the next sync.
    error_class = models.CharField("exception class", max_length=255, null=True, blank=True)
    created_at = models.DateTimeField(null=True, blank=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The job's score in the failed set (ms): a job that fails again gets a new one.
    score_ms = models.BigIntegerField(null=True, blank=True)
    synced_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "job record"
        constraints = [models.UniqueConstraint(fields=["queue", "job_id"], name="echomq_jobrecord_queue_job")]
        indexes = [
            models.Index(fields=["state", "queue", "finished_at"], name="echomq_job_state_queue_fin"),
            models.Index(fields=["state", "name"], name="echomq_job_state_name"),
            models.Index(fields=["state", "finished_at"], name="echomq_job_state_finished"),
            models.Index(fields=["state", "error_class"], name="echomq_job_state_errclass"),
        ]

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id} {self.name}"


class FailedJobManager(models.Manager):
    def get_queryset(self) -> models.QuerySet:
        return super().get_queryset().filter(state=JobRecord.State.FAILED)


class StalledJobManager(models.Manager):
    def get_queryset(self) -> models.QuerySet:
        return super().get_queryset().filter(state=JobRecord.State.STALLED)


class FailedJob(JobRecord):
    objects = FailedJobManager()

    class Meta:
        proxy = True
        verbose_name = "failed job"
        permissions = [("retry_failedjob", "Can retry failed jobs")]


class StalledJob(JobRecord):
    objects = StalledJobManager()

    class Meta:
        proxy = True
        verbose_name = "stalled job"
        default_permissions = ("view",)


class MirrorCursor(models.Model):
    """How far the mirror of one queue's failed set has read, so each sync reads only what is new."""

    queue = models.CharField(max_length=128, unique=True)
    failed_through_ms = models.BigIntegerField(default=0)
    # When a sync last left the rows equal to Redis (None: never); a sync the
    # admin limits may leave some for the next one, and does not set it.
    synced_at = models.DateTimeField("last complete sync", null=True, blank=True)


class Queue(models.Model):
    """No table: the admin's queue dashboard, and the permissions to operate queues and read their metrics."""

    class Meta:
        managed = False
        verbose_name = "queue"
        default_permissions = ("view",)
        permissions = [
            ("sweep_queue", "Can force a sweep of a queue"),
            ("pause_queue", "Can pause a queue"),
            ("view_metrics", "Can view metrics"),
        ]


class Job(models.Model):
    """No table: the admin's job browser (every state of every queue, read from Redis), and its permissions.

    Retrying a failed job needs `echomq.retry_failedjob`, as on the failed list.
    """

    class Meta:
        managed = False
        verbose_name = "job"
        default_permissions = ("view", "delete")
        permissions = [("promote_job", "Can promote delayed jobs"), ("cancel_job", "Can cancel jobs")]


class Worker(models.Model):
    """No table: the admin's Workers page (every live worker of every queue, read from the workers registry)."""

    class Meta:
        managed = False
        verbose_name = "worker"
        default_permissions = ("view",)


class Schedule(models.Model):
    """A periodic job kept in the database and edited in the admin; echomq_beat reads these rows every interval.

    The same options as a schedule of ECHOMQ["SCHEDULES"] (see schedules.py),
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

    def options(self) -> dict:
        """The row as the options of a schedule of ECHOMQ["SCHEDULES"]."""
        return {"TASK": self.task, "CRON": self.cron or None, "EVERY": self.every, "ARGS": self.args,
                "KWARGS": self.kwargs, "QUEUE": self.queue or None, "TIMEZONE": self.timezone or None,
                "ENABLED": self.enabled, "CATCH_UP": self.catch_up, "SKIP_IF_RUNNING": self.skip_if_running,
                "PRIORITY": self.priority, "ATTEMPTS": self.attempts}

    def entry(self, *, importing: bool = False):  # -> schedules.Entry
        """The row read as a schedule; its TASK's module is imported only for the scheduler (see parse_schedule)."""
        from .schedule_parsing import parse_schedule

        since_ms = int(self.updated_at.timestamp() * 1000) if self.updated_at else 0
        return parse_schedule(self.name, self.options(), since_ms=since_ms, where=f"schedule {self.name!r}",
                              source="database", importing=importing)

    def clean(self) -> None:
        """The errors parse_schedule finds, on the fields they are about; a name that settings use."""
        from django.core.exceptions import ImproperlyConfigured, ValidationError

        from .schedule_parsing import FIELD_OF_OPTION, settings_entries

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

