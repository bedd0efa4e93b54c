"""A workflow's page in the admin: its tree of steps, each step's state, attempts and result or error.

The page is read from Redis when it opens: the workflow's record (its shape
and status, in its home queue) and the hashes of its steps, a pipeline per
queue. Cancel is POST-only behind the job cancel permission, with a
confirmation page, as a job's Cancel.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from ..core import InvalidNameError, Job, Queue, WorkflowHandle, read_tree, tree_nodes, validate_name
from .browser_pages import job_link, shortened
from .common import JOB_ERRORS, REDIS_ERRORS, configured_queue, confirmation, confirmed, redis_problem

# The steps a page shows (a chord of 10,000 members shows its first ones, and says how many more).
MAX_STEPS = 1000
CANCEL_PERMISSION = "echomq.cancel_job"
# Where a step is, asked in this order (a step's hash says the rest: a token = active).
SETS = ("completed", "failed", "deferred", "delayed")


def workflow_or_404(queue_name: str, workflow_id: str) -> WorkflowHandle:
    queue = configured_queue(queue_name)
    try:
        validate_name(workflow_id, "workflow id")
    except InvalidNameError as error:
        raise Http404(str(error)) from None
    return WorkflowHandle(queue, workflow_id)


def workflow_view(model_admin: admin.ModelAdmin, request: HttpRequest, queue_name: str,
                  workflow_id: str) -> HttpResponse:
    """The workflow's tree, read from Redis now."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    workflow = workflow_or_404(queue_name, workflow_id)
    title = f"Workflow {workflow.id}"
    context: dict[str, Any] = {**model_admin.admin_site.each_context(request), "opts": model_admin.opts,
                               "title": title, "queue_name": workflow.home.name, "workflow_id": workflow.id}
    try:
        record = {key: value for key, value in workflow.home.client.hgetall(
            workflow.home.keys.workflow(workflow.id)).items()}
        if not record:
            return TemplateResponse(request, "admin/echomq/workflow_page.html", {**context, "missing": True},
                                    status=404)
        rows, more = tree_rows(workflow, record)
    except REDIS_ERRORS as error:
        return TemplateResponse(request, "admin/echomq/workflow_page.html",
                                {**context, "unread": redis_problem(error)})
    status = workflow.status if record.get("status") == "waiting" else record.get("status", "-")
    can_cancel = status in ("waiting", "running") and request.user.has_perm(CANCEL_PERMISSION)
    return TemplateResponse(request, "admin/echomq/workflow_page.html", {
        **context, "status": status, "reason": record.get("reason"), "jobs": record.get("jobs", "-"),
        "rows": rows, "more": more, "tree_unread": bool(record.get("tree")) and read_tree(record.get("tree")) is None,
        "cancel_url": reverse("admin:echomq_workflow_cancel", args=[workflow.home.name, workflow.id])
        if can_cancel else None})


def tree_rows(workflow: WorkflowHandle, record: dict[str, str]) -> tuple[list[dict[str, Any]], int]:
    """The tree as rows (depth, what, and a step's facts), at most MAX_STEPS steps; and how many more."""
    tree = read_tree(record.get("tree"))
    rows: list[dict[str, Any]] = []
    steps: dict[str, list[str]] = defaultdict(list)
    shown = more = 0  # steps shown, steps left out
    for node in tree_nodes(tree):
        if node.job_id is None:
            rows.append({"depth": node.depth, "label": node.label, "kind": node.kind})
        elif shown >= MAX_STEPS:
            more += 1
        else:
            shown += 1
            rows.append({"depth": node.depth, "label": node.label, "queue": node.queue, "id": node.job_id})
            steps[node.queue].append(node.job_id)
    facts = {}
    for queue_name, ids in steps.items():
        facts.update(step_facts(workflow.queue(queue_name), ids))
    for row in rows:
        if "id" in row:
            row.update(facts.get((row["queue"], row["id"]), {}))
            row["link"] = job_link(row["queue"], row["id"])
    return rows, more


def step_facts(queue: Queue, ids: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """Each step's state, attempts, and result or error, read in one pipeline."""
    pipe = queue.client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hgetall(queue.keys.job(job_id))
        for state in SETS:
            pipe.zscore(getattr(queue.keys, state), job_id)
    replies = pipe.execute(raise_on_error=False)
    facts = {}
    width = 1 + len(SETS)
    for index, job_id in enumerate(ids):
        fields, *scores = replies[index * width:(index + 1) * width]
        if not isinstance(fields, dict) or not fields:
            facts[(queue.name, job_id)] = {"state": "gone (removed, or trimmed by retention)"}
            continue
        job = Job.from_hash(queue.name, job_id, fields)
        state = next((name for name, score in zip(SETS, scores) if score is not None and not isinstance(
            score, Exception)), "active" if job.token else "waiting")
        outcome = (shortened(json.dumps(job.returnvalue)) if state == "completed"
                   else shortened(job.failed_reason) if job.failed_reason else "")
        facts[(queue.name, job_id)] = {"state": state, "name": job.name,
                                       "attempts": f"{job.attempts_made} / {job.attempts_started}",
                                       "outcome": outcome}
    return facts


def cancel_workflow_view(model_admin: admin.ModelAdmin, request: HttpRequest, queue_name: str,
                         workflow_id: str) -> HttpResponse:
    """Cancel every step that has not ended (after a confirmation page)."""
    if not request.user.has_perm(CANCEL_PERMISSION):
        raise PermissionDenied
    workflow = workflow_or_404(queue_name, workflow_id)
    page = reverse("admin:echomq_workflow_detail", args=[workflow.home.name, workflow.id])
    if not confirmed(request):
        return confirmation(request, model_admin, title=f"Cancel workflow {workflow.id}?",
                            button="Yes, cancel it",
                            question=f"Cancel every step of workflow {workflow.id} that has not ended? Running "
                                     "steps are stopped as a cancelled job is; the workflow fails.")
    try:
        count = workflow.cancel(f"in the admin by {request.user.get_username()}")
        model_admin.message_user(request, f"Workflow {workflow.id}: {count} step(s) cancelled.", messages.SUCCESS)
    except JOB_ERRORS as error:
        model_admin.message_user(request, f"Workflow {workflow.id} was left alone: {redis_problem(error)}.",
                                 messages.ERROR)
    return HttpResponseRedirect(page)
