"""Workflows on the core runtime: chains, groups, chords, failures, hand-offs between queues, re-sends.

Real Redis (a Cluster on the Cluster CI line, where two queues are two slots), real scripts, real workers.
"""

import json
import threading

import pytest

from echomq_django.core import (
    Chain,
    Chord,
    Group,
    JobOptions,
    Member,
    Plan,
    Queue,
    Retention,
    Worker,
    WorkerOptions,
    WorkflowError,
)
from echomq_django.core.producing.handoff import deliver_handoffs
from echomq_django.core.producing.queue import now_ms
from tests.helpers import abandoned_await_ends, fetch, finish, kill_lock, sweep


@pytest.fixture
def other(redis_client, prefix, scripts) -> Queue:
    """A second queue (on a Cluster, another slot: its steps get their inputs by hand-off)."""
    return Queue("other", redis_client, prefix=prefix, scripts=scripts)


def step(queue: Queue, name: str, *args, attempts: int = 1, **options) -> Member:
    return Member(queue, name, {"args": list(args)}, JobOptions(attempts=attempts), **options)


ran: dict[str, int] = {}
ran_lock = threading.Lock()


def handler(job):
    """The test's job functions, by name; a workflow's inputs come first, as jobs.py passes them."""
    with ran_lock:
        ran[job.id] = ran.get(job.id, 0) + 1
    args = [*job.workflow_args, *job.data["args"]]
    if job.name == "add":
        return sum(args)
    if job.name == "total":
        return sum(args[0])
    if job.name == "echo":
        return args
    if job.name == "nonjson":
        return {1, 2}  # a set: no JSON
    raise ValueError(f"{job.name} failed")


def drain(*queues: Queue, rounds: int = 8, concurrency: int = 4, **options) -> None:
    """Run each queue's workers in bursts until every queue is empty (hand-offs take a round each)."""
    for _ in range(rounds):
        for queue in queues:
            Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.1,
                                                                    concurrency=concurrency, **options)).run(burst=True)
        counts = [queue.counts() for queue in queues]
        if all(c["wait"] + c["active"] + c["prioritized"] + c["delayed"] == 0 for c in counts) and not any(
                queue.client.llen(queue.keys.handoff) for queue in queues):
            return


def test_a_chain_passes_each_result_on(queue, other):
    workflow = Chain(step(queue, "add", 1), step(other, "add", 10), step(queue, "add", 100)).enqueue()
    assert workflow.status == "waiting"
    drain(queue, other)
    assert workflow.status == "succeeded" and workflow.results() == 111


def test_a_group_keeps_its_members_order(queue):
    workflow = Group(step(queue, "add", n) for n in range(100)).enqueue()
    drain(queue, concurrency=8)
    assert workflow.results() == list(range(100))


def test_a_chord_callback_runs_once_with_every_result_in_order(queue, other):
    ran.clear()
    members = [step(queue if n % 2 else other, "add", n) for n in range(1000)]
    workflow = Chord(Group(*members), step(queue, "echo")).enqueue()
    drain(queue, other, concurrency=8)
    assert workflow.results() == [list(range(1000))]
    callback = [job_id for job_id in ran if job_id.endswith(f"-{len(members)}")]
    assert [ran[job_id] for job_id in callback] == [1], "the callback ran exactly once"
    assert queue.counts()["deferred"] == other.counts()["deferred"] == 0


def test_nesting_and_immutable_steps(queue, other):
    workflow = Chain(
        step(queue, "add", 1),
        Group(step(other, "add", 10), Chain(step(queue, "add", 100), step(other, "add", 1000))),
        step(queue, "echo", immutable=True),
        Chord([step(queue, "add", 2, immutable=True), step(other, "add", 3, immutable=True)], step(queue, "total")),
    ).enqueue()
    drain(queue, other)
    assert workflow.results() == 5
    tree = workflow.tree
    assert tree[0] == "chain" and [node[0] for node in tree[1][1:]] == ["group", queue.name, "chord"]


def test_a_member_failing_for_good_fails_the_later_steps_and_runs_on_error_once(queue, other):
    ran.clear()
    plan = Plan.of(Chain(step(queue, "add", 1), step(other, "boom", attempts=2), step(queue, "add", 3),
                         on_error=step(queue, "echo")))
    plan.add()
    workflow = plan.handle()
    drain(queue, other)
    handler_id, _, boom_id, last_id = (s.id for s in plan.steps)
    assert workflow.status == "failed"
    assert workflow.reason == f"member {boom_id} failed: ValueError: boom failed"
    last = queue.get_job(last_id)
    assert last.failed_reason == workflow.reason and last.attempts_started == 0, "the later step never ran"
    assert ran[handler_id] == 1 and queue.get_job(handler_id).returnvalue == [boom_id, workflow.reason]
    with pytest.raises(WorkflowError, match="it is failed"):
        workflow.results()


def test_a_member_allowed_to_fail_counts_as_done_with_its_error(queue):
    workflow = Chord([step(queue, "add", 1), step(queue, "boom", allow_failure=True)], step(queue, "echo")).enqueue()
    drain(queue)
    [[one, error]] = workflow.results()
    assert one == 1 and error["error"] == "ValueError: boom failed" and error["job"].startswith(workflow.id)


def test_on_error_is_deleted_once_the_workflow_succeeded(queue):
    plan = Plan.of(Chord([step(queue, "add", 1)], step(queue, "total"), on_error=step(queue, "echo")))
    plan.add()
    drain(queue)
    assert plan.handle().results() == 1
    assert queue.get_job(plan.steps[0].id) is None and queue.counts()["deferred"] == 0


def test_a_stalled_member_failed_by_the_sweep_fails_its_workflow(queue):
    plan = Plan.of(Chain(step(queue, "add", 1), step(queue, "add", 2), on_error=step(queue, "echo")))
    plan.add()
    [(first, _)] = fetch(queue)  # its worker dies: the lock lapses, and it has no attempt left
    assert first == plan.steps[1].id
    kill_lock(queue, first)
    sweep(queue)  # marks
    sweep(queue)  # fails it at its ceiling
    assert plan.handle().status == "failed"
    assert "stalled and reached its attempt ceiling" in plan.handle().reason
    drain(queue)
    assert queue.get_job(plan.steps[0].id).returnvalue[0] == first, "on_error ran"
    assert queue.get_job(plan.steps[2].id).attempts_started == 0


def test_a_resent_finish_counts_a_member_once(queue):
    plan = Plan.of(Chord([step(queue, "add", 1), step(queue, "add", 2)], step(queue, "total")))
    plan.add()
    (first, _), (second, _) = fetch(queue, count=2)
    assert finish(queue, first, "token-1", value="1") == 1
    assert finish(queue, first, "token-1", value="1") == 5, "the re-send is answered 'already done'"
    callback = queue.get_job(plan.steps[-1].id)
    assert queue.get_state(callback.id) == "deferred"
    assert queue.client.hget(queue.keys.job(callback.id), "deps") == "1", "counted once"
    assert finish(queue, second, "token-1", value="2") == 1
    assert queue.get_state(callback.id) == "wait"


def test_a_handoff_delivered_twice_counts_once(queue, other):
    plan = Plan.of(Chord([step(other, "add", 1), step(other, "add", 2)], step(queue, "total")))
    plan.add()
    (first, _), (second, _) = fetch(other, count=2)
    finish(other, first, "token-1", value="1")
    [message] = other.client.lrange(other.keys.handoff, 0, -1)
    other.client.rpush(other.keys.handoff, message)  # as if a deliverer died after delivering it
    assert deliver_handoffs(other.scripts, other.keys, now_ms()) == 2
    assert queue.client.hget(queue.keys.job(plan.steps[-1].id), "deps") == "1"
    finish(other, second, "token-1", value="2")
    deliver_handoffs(other.scripts, other.keys, now_ms())
    drain(queue)
    assert plan.handle().results() == 3


def test_a_resent_add_adds_nothing_twice(queue, other):
    plan = Plan.of(Chain(step(queue, "add", 1), step(other, "add", 2)))
    plan.add()
    plan.add()  # the reply was lost, and the whole add is sent again
    assert queue.counts()["wait"] == 1 and other.counts()["deferred"] == 1
    drain(queue, other)
    assert plan.handle().results() == 3
    plan.add()  # even after the workflow ended: each call's reply is recorded
    assert queue.counts()["wait"] == 0 and other.counts()["wait"] == 0


def test_completed_retention_cannot_lose_a_chords_input(queue):
    workflow = Chord(Group(step(queue, "add", n) for n in range(20)), step(queue, "total")).enqueue()
    drain(queue, keep_completed=Retention(count=0))  # each finish deletes every completed job
    assert workflow.results() == sum(range(20))
    assert queue.counts()["completed"] == 0


def test_cancel_fails_what_has_not_ended(queue, other):
    plan = Plan.of(Chain(step(queue, "add", 1), step(other, "add", 2), step(queue, "add", 3)))
    plan.add()
    drain(queue)  # the first step ran; the second waits in `other`
    workflow = plan.handle()
    assert workflow.status == "running"
    assert workflow.cancel("no longer needed") == 2, "the two steps that had not run"
    assert workflow.status == "failed" and "cancelled: no longer needed" in workflow.reason
    assert other.get_state(plan.steps[1].id) == "failed" and queue.get_state(plan.steps[2].id) == "failed"


def test_the_record_expires_its_ttl_after_the_workflow_ended(queue):
    workflow = Chain(step(queue, "add", 1)).enqueue(ttl_ms=60_000)
    key = queue.keys.workflow(workflow.id)
    assert queue.client.pttl(key) == -1, "kept while it runs"
    drain(queue)
    assert 0 < queue.client.pttl(key) <= 60_000 and 0 < queue.client.pttl(queue.keys.inputs("wf:" + workflow.id))


@pytest.mark.parametrize("make, message", [
    (lambda q: Group(), "a group needs at least one member"),
    (lambda q: Chain(), "a chain needs at least one member"),
    (lambda q: _nested(q, 50), "nests at most 32 levels"),
    (lambda q: Chain(step(q, "add", 1), Member(q, "bad", {"args": [{1, 2}]}, JobOptions())), "JSON"),
    (lambda q: Chain(step(q, "add"), "not a step"), "holds signatures"),
    (lambda q: Chain(step(q, "add"), on_error=Chain(step(q, "add"))), "on_error takes one signature"),
])
def test_bad_input_is_refused_before_anything_is_added(queue, make, message):
    with pytest.raises(ValueError, match=message):
        make(queue).enqueue()
    assert sum(queue.counts().values()) == 0 and not list(queue.client.scan_iter(f"{queue.keys.base}*"))


def _nested(queue: Queue, depth: int):
    node = step(queue, "add", 1)
    for _ in range(depth):
        node = Chain(node)
    return node


def test_the_record_names_every_job_and_the_edges_are_json(queue, other):
    plan = Plan.of(Chord([step(queue, "add", 1), step(other, "add", 2)], step(queue, "total")))
    plan.add()
    record = queue.client.hgetall(queue.keys.workflow(plan.id))
    assert record["status"] == "waiting" and record["deps"] == "1" and record["jobs"] == "3"
    edges = json.loads(queue.client.hget(queue.keys.job(plan.steps[0].id), "nxt"))
    assert edges == [[queue.keys.base, plan.steps[2].id, "0", "r"]]


def test_a_step_failed_before_its_inputs_came_is_not_retried(queue):
    """Retrying it would run it on part of its inputs; the failed member itself may be retried, to no effect."""
    plan = Plan.of(Chord([step(queue, "add", 1), step(queue, "boom")], step(queue, "total")))
    plan.add()
    drain(queue)
    callback, boom = plan.steps[-1].id, plan.steps[1].id
    assert queue.get_state(callback) == "failed" and not queue.retry(callback)
    assert queue.get_state(callback) == "failed"
    assert queue.retry_all_failed() == 1, "only the member that ran"
    drain(queue)
    assert queue.get_state(boom) == "failed" and queue.get_state(callback) == "failed"
    assert plan.handle().status == "failed"


def test_a_result_that_is_not_json_fails_the_member_and_the_workflow(queue):
    workflow = Chain(step(queue, "nonjson"), step(queue, "echo")).enqueue()
    drain(queue)
    assert workflow.status == "failed" and "return value of job" in workflow.reason
    assert "JSON" in workflow.reason or "serializable" in workflow.reason


def test_an_await_of_a_workflow_given_up_by_its_caller_ends_its_thread(queue):
    """As for a job's handle: asyncio.wait_for giving the wait up must stop its polling thread too."""
    workflow = Chain(step(queue, "add", 1)).enqueue()  # no worker: it cannot end by itself
    abandoned_await_ends(workflow.await_results)
