"""The steps of an admin's bulk action on many jobs, run by the workers of the queue whose jobs it changes.

The admin records the run and adds its first step (admin/bulk_runs.py); from
there the run is the workers': each step changes the run's next ids (at most
core's STEP_JOBS, the run's cursor and counts kept in Redis), drops the
mirror's rows of the jobs it took out of their set, and adds the next step;
the step that ends the run writes the admin's history line, once, with the
final counts and the user who asked. A step is a job named BULK_STEP_JOB
(jobs.py), registered here: the app imports this module where the admin is
installed (apps.py), as the history line is the admin's LogEntry.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import models

from .core import GONE, MAX_PRIORITY, STOPPING, BulkOutcome, BulkRun, Job, JobOptions, Queue, read_run, run_step
from .jobs import BULK_STEP_JOB, register_builtin
from .models import FailedJob, JobRecord
from .queues import get_queue

logger = logging.getLogger("echomq.admin")

# A step's attempts: each goes on from where the one before stopped.
STEP_ATTEMPTS = 5


def add_step(queue: Queue, run_id: str, cursor: int) -> str:
    """Add the run's step from `cursor` (its id names both: an add of the same step twice adds one)."""
    step_id = f"bulk-run-{run_id}-{cursor}"
    # The highest priority: a step runs ahead of the queue's waiting jobs (the ones it retried among them).
    queue.add(BULK_STEP_JOB, {"run": run_id}, opts=JobOptions(attempts=STEP_ATTEMPTS, priority=MAX_PRIORITY),
              job_id=step_id)
    queue.client.hset(queue.keys.bulk_run(run_id), "step", step_id)
    return step_id


def forget(action: str, model: type[models.Model], queue_name: str, outcome: BulkOutcome) -> None:
    """Drop the mirror's rows of the jobs a retry or delete took out of their set (or found gone already)."""
    if action != "cancel":
        model.objects.filter(queue=queue_name, job_id__in=outcome.done + outcome.gone).delete()


def run_step_job(job: Job) -> dict[str, Any]:
    """A worker's run of one step of a bulk action: change the run's next ids; add the next step, or write the
    audit line."""
    queue = get_queue(job.queue)
    run_id = job.data.get("run") if isinstance(job.data, dict) else None
    run = read_run(queue, run_id) if isinstance(run_id, str) else None
    if run is None:
        return {"run": run_id, "status": "no such run (lapsed, or never recorded)"}
    action = run.action
    model = FailedJob if action == "retry" else JobRecord
    run = run_step(queue, run.run_id, after=lambda outcome: forget(action, model, queue.name, outcome))
    if run is None:
        return {"run": run_id, "status": "no such run (lapsed meanwhile)"}
    if run.finished:
        audit_once(queue, run)
    else:
        add_step(queue, run.run_id, run.cursor)
    return {"run": run_id, "status": run.status, "changed": run.cursor, "of": run.total}


def audit_once(queue: Queue, run: BulkRun) -> None:
    """The run's line in the admin's history, with its final counts and its user, written once."""
    fields = run.fields
    marker = f"bulk run {queue.name}/{run.run_id}"
    if LogEntry.objects.filter(object_id=marker).exists():
        return  # a step run again after a crash: its line is there
    try:
        user = get_user_model().objects.filter(pk=fields.get("user_id")).first()
        kind = ContentType.objects.filter(pk=int(fields.get("content_type", ""))).first()
        flag = int(fields.get("flag", ""))
    except (ValueError, TypeError):  # the record's fields broken by another client
        user = kind = None
    if user is None or kind is None:  # the user deleted meanwhile: the jobs were changed all the same
        logger.warning("%s: its user (%s) or its model is gone, so no history line is written: %s", marker,
                       fields.get("username", ""), run_summary(queue.name, run))
        return
    LogEntry.objects.create(
        user_id=user.pk, content_type_id=kind.pk, object_id=marker, object_repr=fields.get("what", "")[:200],
        action_flag=flag, change_message=f"{fields.get('verb', run.action)}: {run_summary(queue.name, run)}")


def run_summary(queue_name: str, run: BulkRun) -> str:
    """What a run did so far, in one message, as the admin's bulk.summary words a request's."""
    parts = [f"{run.counts.done:,} job(s) {run.fields.get('done_text', 'changed')}, of {run.total:,} asked for in "
             f"queue {queue_name}"]
    for why, (count, first) in run.counts.other.items():
        if why == STOPPING:
            parts.append(f"{count:,} {why}")
            continue
        if why == GONE:
            state = "marked stalled" if run.state == "stalled" else run.state
            why = f"no longer {state} (moved on or removed meanwhile)"
        parts.append(f"{count:,} left alone, {why}: " + ", ".join(first) + (", …" if count > len(first) else ""))
    return "; ".join(parts) + "."


register_builtin(BULK_STEP_JOB, run_step_job)
