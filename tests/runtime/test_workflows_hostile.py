"""Workflows under attack: corrupt hand-offs, retries and cancels of members, odd options, deep results.

Real Redis, real scripts, real workers (the helpers of test_workflows).
"""

import json

import pytest

from echomq_django.core import Chain, Chord, Group, JobOptions, Member, Plan, Queue
from echomq_django.core.producing.handoff import deliver_handoffs
from echomq_django.core.producing.queue import now_ms
from tests.helpers import fetch, finish, sweep
from tests.runtime.test_workflows import drain, ran, step


@pytest.fixture
def other(redis_client, prefix, scripts) -> Queue:
    return Queue("other", redis_client, prefix=prefix, scripts=scripts)


@pytest.mark.parametrize("corrupt", [
    "[1, 2, 3, 4, 5, 6, 7]",  # a prefix that is no text
    "[" * 5000,  # nested past Python's decoder (its RecursionError)
    None,  # a value Redis cannot take (filled in below with a real prefix)
])
def test_a_corrupt_handoff_does_not_block_the_ones_behind_it(queue, other, corrupt):
    if corrupt is None:
        corrupt = json.dumps([queue.keys.base, "x", "", "r", 1, None, "o"])
    plan = Plan.of(Chain(step(other, "add", 1), step(queue, "add", 2)))
    plan.add()
    other.client.rpush(other.keys.handoff, corrupt)  # another client's (or an older version's) entry
    [(first, _)] = fetch(other)
    finish(other, first, "token-1", value="1")
    deliver_handoffs(other.scripts, other.keys, now_ms())  # raised, and would raise at every sweep
    sweep(other)
    assert queue.get_state(plan.steps[1].id) == "wait", "the valid hand-off behind it was delivered"
    assert other.client.llen(other.keys.handoff) == 0, "the corrupt one left the list"


def test_retrying_every_failed_job_does_not_run_a_chord_callback_with_part_of_its_inputs(queue):
    ran.clear()
    plan = Plan.of(Chord([step(queue, "add", 1), step(queue, "boom")], step(queue, "echo")))
    plan.add()
    drain(queue)
    body = plan.steps[-1].id
    assert plan.handle().status == "failed" and queue.get_state(body) == "failed"
    queue.retry_all_failed()  # the operator's "retry all failed" after the cause was fixed
    drain(queue)
    assert body not in ran, (
        f"the callback ran with {queue.get_job(body).returnvalue!r}: a chord callback runs only with the "
        "complete list of its members' results")


def test_cancelling_a_workflow_still_runs_its_on_error_once(queue):
    ran.clear()
    plan = Plan.of(Chain(step(queue, "add", 1), step(queue, "add", 2), on_error=step(queue, "echo")))
    plan.add()
    workflow = plan.handle()
    workflow.cancel("stop")
    drain(queue)
    handler = plan.steps[0].id
    assert workflow.status == "failed"
    assert ran.get(handler) == 1, f"on_error is {queue.get_state(handler)}: {queue.get_job(handler).failed_reason}"


def test_a_removed_deferred_step_fails_its_workflow(queue, other):
    plan = Plan.of(Chain(step(queue, "add", 1), step(other, "add", 2), on_error=step(queue, "echo")))
    plan.add()
    assert other.remove(plan.steps[2].id)
    assert plan.handle().status == "failed" and "removed" in plan.handle().reason
    drain(queue, other)
    assert queue.get_job(plan.steps[0].id).returnvalue[0] == plan.steps[2].id, "on_error ran"


def test_steps_released_into_a_paused_queue_wait_for_its_resume(queue):
    plan = Plan.of(Chain(step(queue, "add", 1), step(queue, "add", 2)))
    plan.add()
    [(first, _)] = fetch(queue)
    queue.pause()
    finish(queue, first, "token-1", value="1")
    assert queue.get_state(plan.steps[1].id) == "paused"
    queue.resume()
    drain(queue)
    assert plan.handle().results() == 3


def test_a_released_steps_group_priority_and_delay_are_kept(queue):
    grouped = Member(queue, "add", {"args": [2]}, JobOptions(attempts=1, group="tenant-a"))
    prioritized = Member(queue, "add", {"args": [3]}, JobOptions(attempts=1, priority=5))
    delayed = Member(queue, "add", {"args": [4]}, JobOptions(attempts=1, delay_ms=60_000))
    plan = Plan.of(Chain(step(queue, "add", 1), Group(grouped, prioritized, delayed)))
    plan.add()
    [(first, _)] = fetch(queue)
    finish(queue, first, "token-1", value="1")
    states = [queue.get_state(s.id) for s in plan.steps[1:]]
    assert states == ["wait", "prioritized", "delayed"]
    assert queue.client.hget(queue.keys.job(plan.steps[1].id), "grp") == "tenant-a"



def test_members_cancelled_and_removed_while_real_workers_run_them(queue, other):
    """Cancels and removals race finishes on two queues: the callback runs never or once with every result,
    on_error runs once, and no step is left in deferred."""
    import random
    import threading

    from echomq_django.core import JobLockedError, Worker, WorkerOptions
    from tests.helpers import wait_until
    from tests.runtime.test_workflows import handler

    ran.clear()
    members = [step(queue if n % 2 else other, "add", n, attempts=2) for n in range(300)]
    plan = Plan.of(Chord(Group(*members), step(queue, "echo"), on_error=step(other, "echo")))
    plan.add()
    workflow = plan.handle()
    workers = [Worker(q.name, handler, q.client,
                      WorkerOptions(prefix=q.keys.prefix, block_timeout_s=0.1, concurrency=4))
               for q in (queue, other)]
    threads = [threading.Thread(target=w.run) for w in workers]
    for thread in threads:
        thread.start()
    try:
        ids = [s.id for s in plan.steps[1:-1]]
        random.Random(7).shuffle(ids)
        for n, job_id in enumerate(ids[:20]):
            target = queue if int(job_id.rsplit("-", 1)[1]) % 2 == 0 else other  # (member n is step n + 1)
            assert target.get_job(job_id) is not None or target.get_state(job_id) is None
            if n % 2:
                target.cancel(job_id, "race")
            else:
                try:
                    target.remove(job_id)
                except JobLockedError:
                    target.cancel(job_id, "race")
        assert wait_until(lambda: workflow.status in ("succeeded", "failed"), 30)
        handler_id, body_id = plan.steps[0].id, plan.steps[-1].id
        assert wait_until(lambda: ran.get(handler_id, 0) >= 1 or workflow.status == "succeeded", 30)
        assert wait_until(lambda: not other.client.llen(other.keys.handoff) and not queue.client.llen(
            queue.keys.handoff) and queue.counts()["active"] + other.counts()["active"] == 0, 30)
    finally:
        for w in workers:
            w.stop()
        for thread in threads:
            thread.join(30)
    assert queue.counts()["deferred"] == other.counts()["deferred"] == 0
    if workflow.status == "failed":
        assert ran.get(handler_id) == 1 and body_id not in ran
        assert workflow.reason.startswith("member ")
    else:
        assert ran.get(body_id) == 1 and workflow.results() == [list(range(300))]


@pytest.mark.parametrize("shape", ["local step, then another queue", "another queue, then a third"])
def test_a_failure_cascading_across_queues_reaches_the_workflow_without_a_sweep(queue, other, redis_client, prefix,
                                                                                shape):
    third = Queue("third", redis_client, prefix=prefix, scripts=queue.scripts)
    if shape == "local step, then another queue":  # the failed member's own edges stay in its queue
        steps = (step(queue, "boom"), step(queue, "add", 1), step(other, "add", 2))
    else:  # the step failed by a hand-off hands its failure on from the queue it was delivered to
        steps = (step(queue, "boom"), step(other, "add", 1), step(third, "add", 2), step(queue, "add", 3))
    workflow = Chain(*steps).enqueue()
    drain(queue, other, third)  # workers only: the sweeper runs every SWEEP_INTERVAL (30 s by default)
    assert workflow.status == "failed", (
        "the failure waits in a handoff list that only the next sweep delivers: "
        f"{[(q.name, q.client.llen(q.keys.handoff)) for q in (queue, other, third)]}")


def test_a_workflow_job_with_an_expiry_is_refused_with_nothing_added(queue):
    """addWorkflow writes no expiry: the job ran long after it, and honoured it would fail no later step."""
    from echomq_django.core import WorkflowError

    expiring = Member(queue, "add", {"args": [1]}, JobOptions(attempts=1, expires_ms=100))
    with pytest.raises(WorkflowError, match="cannot expire"):
        Plan.of(Chain(expiring, step(queue, "add", 2))).add()
    assert queue.counts()["wait"] == 0 and not queue.client.keys(queue.keys.base + "*")


def test_a_handoff_entry_with_bytes_that_are_not_utf8_is_delivered_and_leaves_the_list(queue, other, redis_url):
    """Read decoded, its bytes came back as replacement characters, which LREM never matched: every delivery
    read it again until its limit (10,000 times, 2 s), and each sweep did. It is delivered once and removed."""
    from echomq_django.core import connect

    plan = Plan.of(Chain(step(queue, "add", 1), step(other, "add", 2)))
    plan.add()
    later = plan.steps[1].id
    raw = connect(redis_url, decode_responses=False)  # (a cluster client on a cluster)
    try:
        entry = json.dumps([other.keys.base, later, "", "r", 0, "bad X byte", plan.steps[0].id]).encode()
        raw.rpush(queue.keys.handoff, entry.replace(b"X", b"\xff"))
        assert deliver_handoffs(queue.scripts, queue.keys, now_ms()) == 2  # it, then the failed step's end
        assert raw.llen(queue.keys.handoff) == 0 and raw.llen(other.keys.handoff) == 0
        assert other.get_state(later) == "failed", "the end was delivered, not dropped"
        assert other.get_job(later).failed_reason == "bad \ufffd byte"
    finally:
        raw.close()
