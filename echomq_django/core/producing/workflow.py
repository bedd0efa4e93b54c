"""Workflows: chains, groups and chords of jobs whose hand-offs are decided in the scripts.

A workflow is planned here into jobs and edges, and added in one addWorkflow
call per queue. From then on Redis alone moves it on: the script that ends a
member (moveToFinished, the sweep failing a job, cancelJob, removeJob)
delivers its result or its failure along its edges in the same call
(lua/includes/workflow.lua). An edge to another queue, which on a Redis
Cluster can be another slot, is handed off: the member's script pushes it to
its queue's `handoff` list, and `deliver_handoffs` (a worker after such a
finish, every sweep) delivers it with deliverWorkflow, where it counts once
however often it is delivered. docs/workflows.md describes the whole design.
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from ..defaults import WORKFLOW_FAN_EDGES
from ..errors import WorkflowError
from ..protocol.keys import validate_job_id, validate_job_name
from ..protocol.options import JobOptions
from ..protocol.script_args import script_argv, script_argv_each
from ..protocol.scripts import ADD_RECORD_MS
from ..protocol.times import now_ms
from .new_jobs import EncodedJob, NewJob
from .outcomes import CALL_BYTES, batched_by_size, text_bytes
from .queue import JOBS_PER_CALL, Queue, encoded_bytes
from .tracing import send_traced, with_trace
from .workflow_handle import WorkflowHandle
from .workflow_tree import MAX_DEPTH, MAX_JOBS

# And edges: a chain into a group of 100,000 has as many, but a group after a group has the
# product of their sizes.
MAX_EDGES = 1_000_000
# Jobs per addWorkflow call: each carries its edges besides what addJob writes, so half of addJob's
# JOBS_PER_CALL keeps one call no longer than an addJob call (bench/workflow_cost.py); and, as
# addJob's, at most CALL_BYTES of jobs (the record's tree counts in the first call).
ADD_JOBS_PER_CALL = JOBS_PER_CALL // 2
# How long a finished workflow's record and results are kept (WORKFLOW_TTL), by default.
DEFAULT_TTL_MS = 86_400_000


@dataclass(frozen=True)
class Member:
    """One job of a workflow: what a signature becomes when the workflow is added.

    `immutable`: the job does not receive the previous step's result.
    `allow_failure`: its failure counts as done, `{"error": reason, "job": id}` in place of its result.
    `job_id`: the caller's id for its job (Celery's task_id); by default `<workflow id>-<n>`.
    """

    queue: Queue
    name: str
    data: Any
    opts: JobOptions
    immutable: bool = False
    allow_failure: bool = False
    job_id: str | None = None

    def member(self) -> Member:
        return self


class Canvas:
    """What chain, group and chord have in common: they nest, and `enqueue` adds the whole."""

    kind = ""  # "chain", "group" or "chord"
    on_error: Any = None  # a chain's or chord's error handler (a signature)

    def parts(self) -> tuple[Any, ...]:
        """What it holds, in order: a chain's steps, a group's members, a chord's header and body."""
        raise NotImplementedError

    def enqueue(self, *, ttl_ms: int = DEFAULT_TTL_MS) -> WorkflowHandle:
        """Add the workflow (one call per queue involved); a handle to follow it."""
        plan = Plan.of(self, ttl_ms=ttl_ms)
        plan.add()
        return plan.handle()


@dataclass(frozen=True, init=False)
class Chain(Canvas):
    """Steps one after the other; each step gets the previous one's result as its first argument."""

    steps: tuple[Any, ...]
    on_error: Any = None
    kind = "chain"

    def __init__(self, *steps: Any, on_error: Any = None) -> None:
        object.__setattr__(self, "steps", _children(steps, "a chain"))
        object.__setattr__(self, "on_error", on_error)

    def parts(self) -> tuple[Any, ...]:
        return self.steps


@dataclass(frozen=True, init=False)
class Group(Canvas):
    """Members ready at once; the group's result is the list of theirs, in the order given."""

    members: tuple[Any, ...]
    kind = "group"

    def __init__(self, *members: Any) -> None:
        object.__setattr__(self, "members", _children(members, "a group"))

    def parts(self) -> tuple[Any, ...]:
        return self.members


@dataclass(frozen=True)
class Chord(Canvas):
    """A group, then `body`, run once with the list of the group's results once every member succeeded."""

    header: Group
    body: Any
    on_error: Any = None
    kind = "chord"

    def __post_init__(self) -> None:
        if not isinstance(self.header, Group):
            object.__setattr__(self, "header", Group(*self.header))

    def parts(self) -> tuple[Any, ...]:
        return self.header, self.body


@dataclass(frozen=True, init=False)
class Linked(Canvas):
    """`body` with callbacks beside it (Celery's `link`): each runs once with the body's result when it succeeded,
    and its result stays the body's, not theirs; `on_error` (Celery's `link_error`) runs once if the body fails."""

    body: Any
    callbacks: tuple[Any, ...]
    on_error: Any = None
    kind = "linked"

    def __init__(self, body: Any, callbacks: Iterable[Any] = (), on_error: Any = None) -> None:
        object.__setattr__(self, "body", _children([body], "a linked node")[0])
        object.__setattr__(self, "callbacks", tuple(callbacks) and _children(tuple(callbacks), "a link"))
        object.__setattr__(self, "on_error", on_error)

    def parts(self) -> tuple[Any, ...]:
        return self.body, *self.callbacks


def _children(items: Iterable[Any], what: str) -> tuple[Any, ...]:
    if len(items := tuple(items)) == 1 and not _is_node(items[0]) and isinstance(items[0], Iterable):
        items = tuple(items[0])  # chain([a, b]) as chain(a, b); group(generator) as group(*generator)
    if not items:
        raise WorkflowError(f"{what} needs at least one member")
    for item in items:
        if not _is_node(item):
            raise WorkflowError(f"{what} holds signatures, chains, groups and chords, not {item!r}")
    return items


def _is_node(item: Any) -> bool:
    return isinstance(item, Canvas) or callable(getattr(item, "member", None))


@dataclass
class Step:
    """One job of a plan, with its place in the workflow."""

    id: str
    member: Member
    encoded: EncodedJob
    deps: int = 0  # inputs it waits for
    edges: list[list[str]] = field(default_factory=list)  # [prefix, target, slot, kind]
    inputs: str = ""  # "1": the inputs come first in its arguments; "2": an error handler's (id, error)
    pages: list[str] = field(default_factory=list)  # its edges in pages (JSON), when it has many (see page)

    def page(self) -> None:
        """Keep more than WORKFLOW_FAN_EDGES edges in pages, named by one edge of kind "f" (addEdgePages)."""
        if len(self.edges) > WORKFLOW_FAN_EDGES:
            self.pages = [json.dumps(self.edges[start:start + WORKFLOW_FAN_EDGES], separators=(",", ":"))
                          for start in range(0, len(self.edges), WORKFLOW_FAN_EDGES)]
            self.edges = [[self.member.queue.keys.base, self.id, "", "f"]]


class Plan:
    """A workflow as the jobs and edges to add, and the record of it kept in its home queue."""

    # How long each addWorkflow call's reply is kept under its token: a re-send within it adds nothing, even once
    # the jobs ran and were trimmed (the outbox sets it to as long as its row may be sent again).
    record_ms = ADD_RECORD_MS

    def __init__(self, workflow_id: str, home: Queue, ttl_ms: int) -> None:
        self.id, self.home, self.ttl_ms = workflow_id, home, ttl_ms
        self.steps: list[Step] = []
        self.ends: list[tuple[Step, str]] = []
        self.tree: Any = None

    @classmethod
    def of(cls, canvas: Any, *, ttl_ms: int = DEFAULT_TTL_MS, workflow_id: str | None = None) -> Plan:
        """Plan `canvas` (WorkflowError when it cannot be added); nothing is sent."""
        if isinstance(ttl_ms, bool) or not isinstance(ttl_ms, int) or ttl_ms <= 0:
            raise WorkflowError(f"a workflow's TTL must be a positive whole number of ms, not {ttl_ms!r}")
        members: dict[int, Member] = {}
        _resolve(canvas, members, 1)
        home = next(iter(members.values())).queue
        if any(member.queue.client is not home.client for member in members.values()):
            raise WorkflowError("every job of a workflow must be on the same Redis (or the same Redis Cluster)")
        plan = cls(workflow_id or "w" + uuid.uuid4().hex, home, ttl_ms)
        plan.ends = plan._place(canvas, [], [], members)
        plan.tree = plan._tree(canvas)
        for step, slot in plan.ends:
            step.edges.append([home.keys.base, "wf:" + plan.id, slot, "r"])
        if len(plan.steps) > MAX_JOBS:
            raise WorkflowError(f"a workflow has at most {MAX_JOBS} jobs, not {len(plan.steps)}")
        if len({step.id for step in plan.steps}) < len(plan.steps):
            raise WorkflowError("a job id given to a step is used twice in the workflow (a signature with a task_id "
                                "used in two places)")
        if (edges := sum(len(step.edges) for step in plan.steps)) > MAX_EDGES:
            raise WorkflowError(f"a workflow has at most {MAX_EDGES:,} edges, not {edges:,}: a group after a group "
                                "gives each member of the first an edge to each of the second; put a step between")
        for step in plan.steps:
            step.page()
        return plan

    def _new(self, member: Member, parents: list[tuple[Step, str]], handlers: list[Step]) -> Step:
        encoded = member.queue.encode(NewJob(member.name, member.data, member.opts))  # refused now, or never
        step = Step(member.job_id or f"{self.id}-{len(self.steps)}", member, encoded, deps=len(parents),
                    inputs="" if member.immutable or not parents else "1")
        self.steps.append(step)
        for parent, slot in parents:
            parent.edges.append([member.queue.keys.base, step.id, slot, "r"])
        for handler in handlers:
            step.edges.append([handler.member.queue.keys.base, handler.id, "", "e"])
        return step

    def _place(self, node: Any, parents: list[tuple[Step, str]], handlers: list[Step],
               members: dict[int, Member]) -> list[tuple[Step, str]]:
        """Add `node`'s steps after `parents`; its ends, each with the slot of its result in `node`'s."""
        if not isinstance(node, Canvas):
            return [(self._new(members[id(node)], parents, handlers), "")]
        if isinstance(node, Group):
            ends = []
            for index, member in enumerate(node.members):
                ends += [(step, f"{index}.{slot}" if slot else str(index))
                         for step, slot in self._place(member, parents, handlers, members)]
            return ends
        handler = None
        if node.on_error is not None:
            handler = self._new(members[id(node.on_error)], [], [])
            handler.inputs = "" if handler.member.immutable else "2"  # .si(): its own arguments only
            handlers = [*handlers, handler]
        if isinstance(node, Linked):  # the callbacks hang off the body's ends; the node ends where its body does
            ends = self._place(node.body, parents, handlers, members)
            for callback in node.callbacks:
                self._place(callback, ends, handlers[:-1] if handler is not None else handlers, members)
        else:
            ends = parents  # a chain's steps one after another; a chord is its header, then its body
            for part in node.parts():
                ends = self._place(part, ends, handlers, members)
        if handler is not None:
            # The scope's ends tell the handler when it is no longer needed ("d"), instead of only failures ("e").
            for index, (step, _) in enumerate(ends):
                for edge in step.edges:
                    if edge[1] == handler.id:
                        edge[2:] = [str(index), "d"]
            handler.deps = len(ends)
        return ends

    def _tree(self, node: Any) -> Any:
        """The workflow's shape for pages: ["chain"|"group"|"chord", [children], on_error] and [queue, id] leaves.

        Walked in the order `_place` made the steps (a scope's error handler first), so each leaf is its step.
        """
        steps = iter(self.steps)

        def shape(item: Any) -> Any:
            if not isinstance(item, Canvas):
                step = next(steps)
                return [step.member.queue.name, step.id]
            handler = shape(item.on_error) if item.on_error is not None else None
            return [item.kind, [shape(part) for part in item.parts()], handler]

        return shape(node)

    def add(self) -> None:
        """Add every step: the steps that wait for inputs first, then the ones ready at once.

        A small workflow on one queue is one call, atomic. A larger one, or
        one across queues, takes a call per queue and ADD_JOBS_PER_CALL jobs,
        each atomic and recorded under its token (with the plan's own ids, a
        re-sent call adds nothing twice); as the steps that wait come first,
        a step that runs at once finds the steps it hands its result to, and
        an add cut short runs nothing. Every job was encoded when planned,
        so bad input is refused before anything is sent. With tracing on, the
        add is one send span on the home queue, whose context every job carries.
        """
        send_traced(self.home.name, self._add, len(self.steps))

    def _add(self, trace: str) -> list[str]:
        by_queue: dict[str, list[Step]] = defaultdict(list)
        for step in self.steps:
            by_queue[step.member.queue.name].append(step)
        self._check_caller_ids()
        tree_bytes = text_bytes(self._tree_text())
        if len(by_queue) == 1 and len(self.steps) <= ADD_JOBS_PER_CALL and (
                tree_bytes + sum(_step_bytes(step) for step in self.steps) <= CALL_BYTES):
            passes: list[Callable[[Step], bool]] = [lambda step: True]
        else:
            passes = [lambda step: step.deps > 0, lambda step: step.deps == 0]
        order = sorted(by_queue, key=lambda name: name != self.home.name)
        for name in order:  # a step's pages first: its end reads them
            if pages := [call for step in by_queue[name] for call in _page_calls(step)]:
                by_queue[name][0].member.queue.scripts.run_confirmed(pages, by_queue[name][0].member.queue.confirm,
                                                                     raise_on_error=True)
        for number, chosen in enumerate(passes):
            for name in order:
                queue = by_queue[name][0].member.queue
                record = name == self.home.name and number == 0
                picked = [step for step in by_queue[name] if chosen(step)]
                chunks = list(batched_by_size(picked, ADD_JOBS_PER_CALL, _step_bytes,
                                              first_bytes=tree_bytes if record else 0)) or ([[]] if record else [])
                calls = [self._call(queue, chunk, record and index == 0, f"{number}.{index}", trace)
                         for index, chunk in enumerate(chunks)]
                if calls:
                    try:
                        queue.scripts.run_confirmed(calls, queue.confirm, raise_on_error=True)
                    except ResponseError as error:
                        if str(error).startswith("TAKEN "):  # a caller's id another job took meanwhile
                            raise WorkflowError(f"{str(error)[6:]}: give each step a new one") from None
                        raise
        return []

    def _check_caller_ids(self) -> None:
        """WorkflowError, before anything is sent, for a step whose caller-given id (Celery's task_id) is another
        job's: the step would never be added, never end, and what waits for it would wait for good. (Each
        addWorkflow call refuses such an id too, atomically; this keeps a plan of many calls from starting.)"""
        given = [step for step in self.steps if step.member.job_id is not None]
        if not given:
            return
        pipe = self.home.client.pipeline(transaction=False)
        for step in given:
            pipe.exists(step.member.queue.keys.job(step.id))
            pipe.hget(step.member.queue.keys.job(step.id), "wf")
        replies = pipe.execute(raise_on_error=False)
        for step, exists, owner in zip(given, replies[::2], replies[1::2], strict=True):
            if exists == 1 and owner != self.id:
                raise WorkflowError(f"job id {step.id!r} is another job's: give each step a new one")

    def _call(self, queue: Queue, steps: Sequence[Step], record: bool, part: str, trace: str = "") -> Any:
        token = f"{self.id}.{part}"
        args = script_argv("addWorkflow-8", prefix=queue.keys.base, timestamp=now_ms(), token=token,
                           record_ms=self.record_ms, workflow_id=self.id, home=self.home.name,
                           ends=len(self.ends) if record else "", ttl_ms=self.ttl_ms, jobs=len(self.steps),
                           tree=self._tree_text() if record else "",
                           queues=json.dumps(sorted({step.member.queue.name for step in self.steps}))
                           if record else "")
        for step in steps:
            encoded = step.encoded
            args += script_argv_each(
                "addWorkflow-8", job_id=step.id, name=encoded.name, data=encoded.data,
                opts=with_trace(encoded.opts, trace),
                delay_ms=encoded.delay_ms, priority=encoded.priority, group=encoded.group, deps=step.deps,
                next_steps=json.dumps(step.edges, separators=(",", ":")), inputs=step.inputs,
                allow_failure="1" if step.member.allow_failure else "")
        return ("addWorkflow-8", queue.keys.for_script("addWorkflow-8", token=token), args)

    def _tree_text(self) -> str:
        return json.dumps(self.tree, separators=(",", ":"))

    def handle(self) -> WorkflowHandle:
        return WorkflowHandle(self.home, self.id)


def _page_calls(step: Step) -> list[Any]:
    """The addEdgePages calls that write `step`'s pages: at most 1,000 and CALL_BYTES a call."""
    calls, first = [], 0
    keys = step.member.queue.keys
    for chunk in batched_by_size(step.pages, 1000, text_bytes):
        args = script_argv("addEdgePages-1", pages=len(step.pages), first=first)
        for page in chunk:
            args += script_argv_each("addEdgePages-1", page=page)
        calls.append(("addEdgePages-1", keys.for_script("addEdgePages-1", id=step.id), args))
        first += len(chunk)
    return calls


def _step_bytes(step: Step) -> int:
    """What a step adds to its addWorkflow call: its job, and its edges (an edge names a target and a slot)."""
    return encoded_bytes(step.encoded) + sum(len(edge[0]) + len(edge[1]) + len(edge[2]) + 12 for edge in step.edges)


def _resolve(node: Any, members: dict[int, Member], depth: int) -> None:
    """Turn every signature of `node` into its Member (a signature checks itself then), depth first."""
    if depth > MAX_DEPTH:
        raise WorkflowError(f"a workflow nests at most {MAX_DEPTH} levels deep")
    if not isinstance(node, Canvas):
        member = node.member()
        if not isinstance(member, Member):
            raise WorkflowError(f"{node!r} did not give a workflow member")
        validate_job_name(member.name)
        if member.job_id is not None:
            validate_job_id(member.job_id)
        if member.opts.expires_ms:  # addWorkflow writes no expiry, and an expired step would tell no later step
            raise WorkflowError(f"a workflow's job cannot expire (job {member.name!r} has expires): give the "
                                "workflow a time limit of its own, or let the job check its age")
        members[id(node)] = member
        return
    for part in node.parts():
        _resolve(part, members, depth + 1)
    if node.on_error is not None:
        if isinstance(node.on_error, Canvas):
            raise WorkflowError("on_error takes one signature, not a chain, group or chord")
        _resolve(node.on_error, members, depth + 1)


