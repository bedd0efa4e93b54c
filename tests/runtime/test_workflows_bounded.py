"""Every script call of a workflow does bounded work, whatever its shape (issue 38: 1, 2, 3 and 11).

A failure spreading down a long chain, a cancel, a member whose end goes to
many steps, and an add of large members each take several bounded calls, with
the outcome one call would have had. Counted, not timed: how many steps one
call moved, and how many add calls a workflow took (their `add:<token>` records).

Real Redis, real scripts, real workers (the helpers of test_workflows).
"""

import json

import pytest

from echomq_django.core import Chain, Chord, Group, JobOptions, Member, Plan, Queue, WorkflowError, WorkflowHandle
from echomq_django.core.defaults import WORKFLOW_DELIVERIES_PER_CALL, WORKFLOW_FAN_EDGES, WORKFLOW_REASON_BYTES
from echomq_django.core.producing.handoff import deliver_handoffs
from echomq_django.core.producing.new_jobs import NewJob
from echomq_django.core.producing.outcomes import CALL_BYTES
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.producing.workflow_tree import MAX_TREE_DEPTH
from tests.helpers import fetch, finish
from tests.runtime.test_workflows import drain, ran, step

STEPS = 2 * WORKFLOW_DELIVERIES_PER_CALL + 100  # a failure that needs three calls at least


def long_chain(queue: Queue, on_error: Member | None = None) -> Plan:
    plan = Plan.of(Chain(*[step(queue, "add", n) for n in range(STEPS)], on_error=on_error))
    plan.add()
    return plan


def members(plan: Plan) -> list[str]:
    return [s.id for s in plan.steps if s.inputs != "2"]


def test_a_failure_spreads_down_a_long_chain_in_bounded_calls_and_fails_every_step_once(queue):
    ran.clear()
    plan = long_chain(queue, on_error=step(queue, "echo"))
    ids = members(plan)
    [(first, _)] = fetch(queue)
    assert first == ids[0]
    assert finish(queue, first, "token-1", completed=False, value="boom") == 2  # failed for good (attempts=1)
    # The finish itself moved at most its budget of later steps: the rest wait in the handoff list.
    failed_now = queue.client.zcard(queue.keys.failed)
    assert 1 < failed_now <= 1 + WORKFLOW_DELIVERIES_PER_CALL, (
        f"one call failed {failed_now} steps of {STEPS}: a chain's failure must spread in bounded calls")
    assert queue.client.llen(queue.keys.handoff) >= 1
    assert queue.get_state(ids[-1]) == "deferred"
    deliver_handoffs(queue.scripts, queue.keys, now_ms())
    assert queue.client.llen(queue.keys.handoff) == 0
    assert queue.client.zcard(queue.keys.failed) == STEPS, "every later step failed"
    assert queue.client.zcard(queue.keys.deferred) == 0
    later = queue.get_job(ids[-1]).failed_reason
    assert later == f"member {first} failed: boom", later
    drain(queue)
    handler = plan.steps[0].id
    assert ran == {handler: 1}, f"only on_error ran, once: {ran}"
    assert queue.get_job(handler).returnvalue == [first, f"member {first} failed: boom"]
    assert plan.handle().status == "failed"


def test_a_worker_spreads_a_long_chains_failure_to_its_end(queue):
    """The worker that ended the first step delivers what its call could not (no sweep needed)."""
    ran.clear()
    plan = Plan.of(Chain(step(queue, "boom"), *[step(queue, "add", n) for n in range(STEPS)]))
    plan.add()
    drain(queue, rounds=1)
    assert queue.client.zcard(queue.keys.failed) == STEPS + 1
    assert queue.client.llen(queue.keys.handoff) == 0
    assert list(ran) == [plan.steps[0].id], "nothing after the failed step ran"


def test_cancelling_a_long_chain_fails_every_step_once_and_runs_on_error_once(queue):
    ran.clear()
    plan = long_chain(queue, on_error=step(queue, "echo"))
    ids = members(plan)
    # One cancel call, as the script sees it: bounded however long the chain.
    assert queue.scripts.cancel_job(queue.keys, ids[0], "cancelled", now_ms()) == 1
    assert queue.client.zcard(queue.keys.failed) <= 1 + WORKFLOW_DELIVERIES_PER_CALL
    cancelled = plan.handle().cancel("stop")
    assert cancelled >= 0
    assert queue.client.zcard(queue.keys.failed) == STEPS
    assert queue.client.zcard(queue.keys.deferred) == 0 and queue.client.llen(queue.keys.handoff) == 0
    drain(queue)
    assert ran == {plan.steps[0].id: 1}, f"only on_error ran, once: {ran}"
    assert plan.handle().status == "failed"


def test_a_member_whose_end_goes_to_many_steps_releases_them_in_bounded_calls(queue):
    """Its edges are in pages (addEdgePages): its finish hands the first page on, and a call delivers a page."""
    ran.clear()
    fan = STEPS
    plan = Plan.of(Chain(step(queue, "add", 1), Group(*[step(queue, "add", n) for n in range(fan)])))
    assert len(plan.steps[0].edges) == 1 and len(plan.steps[0].pages) == -(-fan // WORKFLOW_FAN_EDGES)
    plan.add()
    [(first, _)] = fetch(queue)
    assert finish(queue, first, "token-1", value="1") == 1
    assert queue.client.llen(queue.keys.wait) == 0 and queue.client.llen(queue.keys.handoff) == 1
    deliver_handoffs(queue.scripts, queue.keys, now_ms(), limit=1)  # one deliverWorkflow call
    released = queue.client.llen(queue.keys.wait)
    assert 0 < released <= WORKFLOW_DELIVERIES_PER_CALL, f"one call released {released} of {fan} steps"
    deliver_handoffs(queue.scripts, queue.keys, now_ms())  # what the sweep does for a finish no worker wrote
    assert queue.client.llen(queue.keys.wait) == fan
    assert not queue.client.exists(queue.keys.edge_pages(first)), "the pages go once the last one is delivered"
    drain(queue)
    assert queue.client.zcard(queue.keys.deferred) == 0 and queue.client.llen(queue.keys.handoff) == 0
    assert all(ran.get(s.id) == 1 for s in plan.steps[1:]), "every member ran once"
    assert plan.handle().results() == [1 + n for n in range(fan)]


def test_a_failure_before_a_large_fan_out_fails_every_member_once(queue):
    ran.clear()
    plan = Plan.of(Chain(step(queue, "boom"), Group(*[step(queue, "add", n) for n in range(STEPS)]),
                         step(queue, "total"), on_error=step(queue, "echo")))
    plan.add()
    drain(queue)
    assert queue.client.zcard(queue.keys.failed) == STEPS + 2, "every member and the callback failed"
    assert queue.client.zcard(queue.keys.deferred) == 0 and queue.client.llen(queue.keys.handoff) == 0
    assert ran == {plan.steps[0].id: 1, plan.steps[1].id: 1}, "only the failed step and on_error ran, once each"


def test_a_group_after_a_group_of_too_many_edges_is_refused_with_nothing_sent(queue):
    with pytest.raises(WorkflowError, match="at most 1,000,000 edges"):
        Plan.of(Chain(Group(*[step(queue, "add", n) for n in range(1001)]),
                      Group(*[step(queue, "add", n) for n in range(1000)])))
    assert queue.counts()["wait"] == 0


def test_a_worker_releases_every_step_of_a_large_fan_out(queue):
    """The worker that ended the member delivers what its call could not (no sweep needed)."""
    ran.clear()
    plan = Plan.of(Chain(step(queue, "add", 1), Group(*[step(queue, "add", n) for n in range(STEPS)])))
    plan.add()
    drain(queue, rounds=2)
    assert queue.client.zcard(queue.keys.deferred) == 0 and queue.client.llen(queue.keys.handoff) == 0
    assert plan.handle().status == "succeeded"


def test_an_immutable_error_handler_gets_only_its_own_arguments(queue):
    """on_error=notify.si("ops"): it runs with ("ops",), not with the failed member's id and error first."""
    ran.clear()
    handler = Member(queue, "echo", {"args": ["ops"]}, JobOptions(attempts=1), immutable=True)
    plan = Plan.of(Chain(step(queue, "boom"), step(queue, "add", 2), on_error=handler))
    plan.add()
    drain(queue)
    handler_id = plan.steps[0].id
    assert queue.get_job(handler_id).returnvalue == ["ops"], queue.get_job(handler_id).failed_reason
    assert ran.get(handler_id) == 1
    mutable = Plan.of(Chord([step(queue, "boom")], step(queue, "echo"), on_error=step(queue, "echo", "ops")))
    mutable.add()
    drain(queue)
    failed = mutable.steps[1].id
    reason = queue.get_job(failed).failed_reason
    assert queue.get_job(mutable.steps[0].id).returnvalue == [failed, f"member {failed} failed: {reason}", "ops"]


@pytest.mark.parametrize("character", ["x", "é", "😀"])
def test_a_huge_failure_reason_is_carried_down_a_chain_cut(queue, character):
    """A member's 1 MB error is copied cut into the steps it fails, the hand-offs, the record and on_error's input
    (each a 1 MB copy before: 520 steps used 1 GB), cut at a character's start; the member keeps it whole."""
    ran.clear()
    plan = Plan.of(Chain(*[step(queue, "add", n) for n in range(WORKFLOW_DELIVERIES_PER_CALL + 20)],
                         on_error=step(queue, "echo")))
    plan.add()
    ids = members(plan)
    error = "a" + character * (1_000_000 // len(character.encode()))  # "a": a multi-byte character spans the cut
    [(first, _)] = fetch(queue)
    assert finish(queue, first, "token-1", completed=False, value=error) == 2
    longest_entry = max(len(entry.encode()) for entry in queue.client.lrange(queue.keys.handoff, 0, -1))
    assert longest_entry < 2 * WORKFLOW_REASON_BYTES, f"a hand-off entry of {longest_entry:,} bytes"
    deliver_handoffs(queue.scripts, queue.keys, now_ms())
    assert queue.get_job(first).failed_reason == error, "the member's own reason stays whole"
    later = queue.get_job(ids[-1]).failed_reason
    assert "\ufffd" not in later, "cut inside a character (the client decodes what it cannot as U+FFFD)"
    assert later.startswith(f"member {first} failed: a{character * 10}")
    assert later.endswith(f" [cut: {len(error.encode())} bytes]"), later[-60:]
    assert len(later.encode()) <= WORKFLOW_REASON_BYTES + 100, len(later.encode())
    assert len(queue.client.hget(queue.keys.job(ids[-1]), "failedReason").encode()) < WORKFLOW_REASON_BYTES + 100
    assert len((plan.handle().reason or "").encode()) <= WORKFLOW_REASON_BYTES + 100
    drain(queue)
    handler = plan.steps[0].id
    assert queue.get_job(handler).returnvalue == [first, later]


def add_tokens(queue: Queue, pattern: str) -> int:
    return sum(1 for _ in queue.client.scan_iter(match=queue.keys.base + "add:" + pattern, count=1000))


def test_a_group_of_large_members_is_added_in_calls_bounded_by_bytes(queue):
    member_bytes = 400 * 1024
    count = 3 * CALL_BYTES // member_bytes  # three calls' worth, far under the count per call
    plan = Plan.of(Group(*[step(queue, "add", "x" * member_bytes) for _ in range(count)]))
    plan.add()
    calls = add_tokens(queue, plan.id + ".*")
    assert calls >= 3, f"{count} members of 400 KB went in {calls} call(s): a call carries at most {CALL_BYTES} bytes"
    assert queue.counts()["wait"] == count and plan.handle().status == "waiting"


def test_add_bulk_of_large_jobs_is_cut_by_bytes(queue):
    job_bytes = 400 * 1024
    count = 3 * CALL_BYTES // job_bytes
    ids = queue.add_bulk([NewJob("big", {"blob": "x" * job_bytes}) for _ in range(count)])
    assert len(set(ids)) == count and queue.counts()["wait"] == count
    assert add_tokens(queue, "*") >= 3, "add_bulk sent one call of its whole size"


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("tree", [deep(5000), deep(MAX_TREE_DEPTH + 5), "{not json"])
def test_a_workflow_whose_tree_another_client_broke_can_still_be_cancelled(queue, tree):
    other = Queue("other", queue.client, prefix=queue.keys.prefix, scripts=queue.scripts)
    plan = Plan.of(Chain(step(queue, "add", 1), step(other, "add", 2), step(queue, "add", 3),
                         on_error=step(queue, "echo")))
    plan.add()
    record = queue.keys.workflow(plan.id)
    queue.client.hset(record, "tree", tree)
    handle = WorkflowHandle(queue, plan.id)
    assert handle.tree is None
    assert handle.status == "waiting"
    assert handle.cancel("stop") >= 1
    assert handle.status == "failed"
    handler = plan.steps[0].id
    assert queue.get_state(handler) != "failed", "the error handler is not cancelled"
    for s in plan.steps[1:]:
        assert s.member.queue.get_state(s.id) == "failed", s.id
    assert json.loads(queue.client.hget(record, "queues")) == ["other", "q"]


@pytest.mark.parametrize("queues", ["[" * 5000, "{not json", '"q"'])
def test_a_broken_queues_field_still_leaves_the_home_queue_to_cancel(queue, queues):
    """Both the tree and the queues field broken: the steps of the workflow's own queue are still found."""
    plan = Plan.of(Chain(step(queue, "add", 1), step(queue, "add", 2), step(queue, "add", 3)))
    plan.add()
    record = queue.keys.workflow(plan.id)
    queue.client.hset(record, mapping={"tree": "{not json", "queues": queues})
    handle = WorkflowHandle(queue, plan.id)
    assert handle.cancel("stop") >= 1
    assert handle.status == "failed"
    for s in plan.steps:
        assert queue.get_state(s.id) == "failed", s.id


def test_a_cancel_with_a_huge_reason_keeps_it_cut_in_every_member(queue):
    """A group's cancel stored the whole reason in each member (twice), 3 MB a member for a 1 MB reason."""
    plan = Plan.of(Chord(Group(*[step(queue, "add", n) for n in range(20)]), step(queue, "echo")))
    plan.add()
    reason = "é" + "R" * 1_000_000
    assert plan.handle().cancel(reason) >= 20
    for s in plan.steps:
        stored = queue.client.hmget(queue.keys.job(s.id), "failedReason", "cxl")
        assert all(len((text or "").encode()) <= WORKFLOW_REASON_BYTES + 100 for text in stored), s.id
    lone = queue.add("x")
    assert queue.cancel(lone, reason)
    failed_reason = queue.get_job(lone).failed_reason
    assert failed_reason.startswith("cancelled: éRRR") and failed_reason.endswith(" bytes]")
    assert len(failed_reason.encode()) <= WORKFLOW_REASON_BYTES + 100


def test_results_under_a_slot_no_workflow_writes_are_refused_not_built(queue):
    """Another client's slot "99999999" made results() build a list of 100 million items (800 MB)."""
    plan = Plan.of(Group(step(queue, "add", 1), step(queue, "add", 2)))
    plan.add()
    drain(queue)
    handle = plan.handle()
    assert handle.results() == [1, 2]
    queue.client.hset(queue.keys.inputs("wf:" + plan.id), "99999999", "3")
    with pytest.raises(WorkflowError, match="no workflow writes"):
        handle.results()
