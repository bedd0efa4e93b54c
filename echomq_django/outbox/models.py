"""The outbox's tables, one for jobs and one for workflows (the app's models.py imports them, so Django finds them)."""

import uuid

from django.db import models


class OutboxJob(models.Model):
    """A job enqueued inside a transaction, written in that transaction and sent to Redis after it (jobs.py).

    The fields are the job as the add sends it, already validated and encoded.
    The committing process sends its rows right after the commit and deletes
    them; a row left behind (Redis was away, the process died) is sent by the
    relay of `echomq_sweep` or `echomq_relay`. A row that cannot be sent as it
    is (edited by hand) keeps the reason and is not sent again.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    queue = models.CharField(max_length=128)
    job_id = models.CharField("job id", max_length=128)
    name = models.CharField(max_length=255)
    data = models.TextField(help_text="JSON, as sent")
    opts = models.TextField(help_text="JSON, as sent")
    delay_ms = models.BigIntegerField(default=0)
    priority = models.IntegerField(default=0)
    group = models.CharField(max_length=128, blank=True)
    expires_ms = models.BigIntegerField("expires after (ms)", default=0)
    dedupe = models.CharField("dedupe key", max_length=200, blank=True)
    dedupe_mode = models.CharField(max_length=16, blank=True)
    dedupe_ms = models.BigIntegerField(default=0)
    # When it was enqueued (ms), the job's timestamp in Redis: its delay counts from here.
    timestamp_ms = models.BigIntegerField()
    error = models.TextField(blank=True,
                             help_text="Why it cannot be sent as it is (an edited row); such a row is not sent again.")

    class Meta:
        verbose_name = "outbox job"
        default_permissions = ("view", "delete")
        constraints = [models.UniqueConstraint(fields=["queue", "job_id"], name="echomq_outbox_queue_job")]
        indexes = [models.Index(fields=["timestamp_ms"], name="echomq_outbox_timestamp")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id} {self.name}"


class OutboxWorkflow(models.Model):
    """A workflow enqueued inside a transaction, written in that transaction and added to Redis after it.

    `canvas` is what planning the workflow again needs (workflows.py):
    its shape and each job, encoded, checked when it was enqueued. Planned
    again with the same id, its jobs get the same ids and its adds the same
    tokens, so a row sent twice adds the workflow once. Sent and deleted as
    OutboxJob rows are, by the committing process or a relay.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    queue = models.CharField(max_length=128, help_text="The workflow's home queue: the one that holds its record.")
    workflow_id = models.CharField("workflow id", max_length=128)
    jobs = models.IntegerField(default=0)
    canvas = models.TextField(help_text="JSON: the workflow's shape and jobs, as enqueued")
    ttl_ms = models.BigIntegerField("record kept after the end (ms)")
    # When it was enqueued (ms): a relay sends it once it is RELAY_AFTER_S old, never past OUTBOX_MAX_AGE.
    timestamp_ms = models.BigIntegerField()
    error = models.TextField(blank=True,
                             help_text="Why it cannot be sent as it is (an edited row); such a row is not sent again.")

    class Meta:
        verbose_name = "outbox workflow"
        default_permissions = ("view", "delete")
        constraints = [models.UniqueConstraint(fields=["queue", "workflow_id"], name="echomq_outbox_queue_workflow")]
        indexes = [models.Index(fields=["timestamp_ms"], name="echomq_outbox_wf_timestamp")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.workflow_id} ({self.jobs} jobs)"
