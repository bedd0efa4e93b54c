"""The app's models: a searchable copy of the jobs in each queue's failed and stalled sets, for the admin, and the
tableless models that carry the admin's pages and permissions. The outbox's and the schedules' tables live with
their feature (outbox/models.py, schedules/models.py) and are imported here, where Django looks for models.

Redis stays the source of truth: the sweeper refreshes the copied rows after
every sweep (see mirror.py), and every admin action goes through the Lua
scripts before it touches a row.
"""

from django.db import models

# The models of this app that live with their feature, imported so that Django finds them.
from .outbox.models import OutboxJob, OutboxWorkflow  # noqa: F401
from .schedules.models import Schedule  # noqa: F401


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
        permissions = [("promote_job", "Can promote delayed jobs"), ("cancel_job", "Can cancel jobs"),
                       ("signal_job", "Can send signals to jobs")]


class Worker(models.Model):
    """No table: the admin's Workers page (every live worker of every queue, read from the workers registry)."""

    class Meta:
        managed = False
        verbose_name = "worker"
        default_permissions = ("view",)


class DurableStep(models.Model):
    """An atomic step of a durable job (echomq_django.durable.atomic_step), committed with the step's own writes.

    Its row decides the step on every later run of the job: it is what makes
    those writes happen exactly once.
    """

    queue = models.CharField(max_length=128)
    job_id = models.CharField("job id", max_length=149)
    job_timestamp = models.BigIntegerField(default=0)  # when the job was added (ms): an id used again is another job
    name = models.CharField(max_length=128)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "durable step"
        constraints = [models.UniqueConstraint(fields=["queue", "job_id", "job_timestamp", "name"],
                                               name="echomq_durablestep_unique_run")]
        indexes = [models.Index(fields=["created_at"], name="echomq_durablestep_created")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id} {self.name}"
