"""A workflow once added: its status, its members, its result, a wait for it, and its cancel (in bounded calls)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from ..errors import InvalidNameError, WorkflowError
from ..protocol.codec import decode_stored
from ..protocol.keys import validate_name
from .handle import awaited, deadline_of, sleep_unless
from .outcomes import BULK_BATCH, STOPPING, batched
from .queue import Queue
from .workflow_tree import MAX_JOBS, as_text, assemble, read_tree, tree_nodes

STATUSES = ("waiting", "running", "succeeded", "failed")


class WorkflowHandle:
    """A workflow added to Redis: its status, its result, a wait for it, its cancel."""

    def __init__(self, home: Queue, workflow_id: str) -> None:
        self.home, self.id = home, workflow_id

    def __repr__(self) -> str:
        return f"<Workflow {self.id} of queue {self.home.name}>"

    def _record(self) -> dict[str, str]:
        return {as_text(k): as_text(v) for k, v in self.home.client.hgetall(self.home.keys.workflow(self.id)).items()}

    @property
    def status(self) -> str:
        """"waiting", "running", "succeeded" or "failed"; "unknown" once its record expired (or never was)."""
        record = self._record()
        status = record.get("status")
        if status is None:
            return "unknown"
        if status == "waiting" and self._started(record):
            return "running"
        return status

    def _started(self, record: dict[str, str]) -> bool:
        for queue, job_ids in self._members(record).items():
            pipe = queue.client.pipeline(transaction=False)
            for job_id in job_ids:
                pipe.hget(queue.keys.job(job_id), "ats")
            if any(int(value or 0) > 0 for value in pipe.execute()):
                return True
        return False

    def _members(self, record: dict[str, str] | None = None, *, handlers: bool = True) -> dict[Queue, list[str]]:
        """Every job of the workflow by queue, as its record's tree names them (without `handlers`: but on_error's);
        from its queues and job ids when the tree cannot be read (another client's write)."""
        record = self._record() if record is None else record
        if (tree := read_tree(record.get("tree"))) is None:
            return self._members_from_keys(record, handlers=handlers)
        found: dict[str, list[str]] = defaultdict(list)
        for node in tree_nodes(tree, handlers=handlers):
            if node.job_id is not None:
                found[node.queue].append(node.job_id)
        return {self.queue(name): ids for name, ids in found.items()}

    def _members_from_keys(self, record: dict[str, str], *, handlers: bool) -> dict[Queue, list[str]]:
        """The jobs `<id>-0` ... `<id>-<jobs - 1>` whose hash names this workflow, in each of the record's queues."""
        try:
            count = min(int(record.get("jobs", "0")), MAX_JOBS)
        except (ValueError, TypeError):
            count = 0
        try:  # apart from the count: broken queues still leave the home queue to search
            names = {name for name in decode_stored(record.get("queues") or "[]") if isinstance(name, str)}
        except (ValueError, TypeError):
            names = set()
        found: dict[Queue, list[str]] = {}
        for name in sorted(names | {self.home.name}):
            try:
                queue = self.queue(validate_name(name, "queue name"))
            except InvalidNameError:
                continue
            ids = [f"{self.id}-{number}" for number in range(count)]
            kept: list[str] = []
            for start in range(0, len(ids), 1000):
                pipe = queue.client.pipeline(transaction=False)
                for job_id in ids[start:start + 1000]:
                    pipe.hmget(queue.keys.job(job_id), "wf", "inp")
                for job_id, reply in zip(ids[start:start + 1000], pipe.execute(raise_on_error=False)):
                    if isinstance(reply, list) and as_text(reply[0] or "") == self.id and (
                            handlers or as_text(reply[1] or "") != "2"):
                        kept.append(job_id)
            if kept:
                found[queue] = kept
        return found

    def queue(self, name: str) -> Queue:
        """One of the workflow's queues (on the home queue's Redis)."""
        if name == self.home.name:
            return self.home
        return Queue(name, self.home.client, prefix=self.home.keys.prefix, scripts=self.home.scripts)

    @property
    def tree(self) -> Any:
        """The workflow's shape (see Plan._tree), or None once its record expired (or its tree is unreadable)."""
        return read_tree(self._record().get("tree"))

    @property
    def reason(self) -> str | None:
        """Why it failed ("member <id> failed: ..."), else None."""
        return self._record().get("reason")

    def results(self) -> Any:
        """The workflow's result: its last step's, or a list for a group (WorkflowError unless it succeeded)."""
        status = self.status
        if status != "succeeded":
            raise WorkflowError(f"workflow {self.id} has no result: it is {status}"
                                + (f" ({self.reason})" if status == "failed" else ""))
        raw = self.home.client.hgetall(self.home.keys.inputs("wf:" + self.id))
        try:
            return assemble({as_text(k): as_text(v) for k, v in raw.items()})
        except ValueError as error:  # written by another client
            raise WorkflowError(f"workflow {self.id} has results no workflow writes: {error}") from None

    def wait(self, timeout: float | None = None, *, poll_s: float = 0.05,
             sleep: Callable[[float], None] = time.sleep) -> Any:
        """Wait for the workflow to end; its results (WorkflowError if it failed, TimeoutError past `timeout` s)."""
        deadline = deadline_of(timeout)
        while (status := self._record().get("status", "unknown")) in ("waiting", "running"):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"workflow {self.id} did not end within {timeout} s")
            sleep(poll_s)
            poll_s = min(poll_s * 1.5, 1.0)
        if status == "unknown":
            raise WorkflowError(f"workflow {self.id} is unknown (its record expired, or it was never added)")
        return self.results()

    async def await_results(self, timeout: float | None = None) -> Any:
        """`wait` for asyncio code, on a thread of its own, which ends once the awaiter is cancelled."""
        return await awaited(lambda given_up: self.wait(timeout, sleep=lambda s: sleep_unless(given_up, s)))

    def cancel(self, reason: str = "") -> int:
        """Cancel every job not yet ended (a running one is stopped as Queue.cancel stops it); how many.

        Not the on_error handlers: a cancelled member is one that failed for
        good, and the first failure in a handler's scope runs it, once.
        """
        cancelled = 0
        for queue, job_ids in self._members(handlers=False).items():
            for chunk in batched(job_ids, BULK_BATCH):
                # A cancel fails the later steps with it, and its cancel_many delivers what its calls
                # could not, so the steps that ended meanwhile are not asked again (a chain of 100,000:
                # one cancel, its spread, and a read of the rest).
                pipe = queue.client.pipeline(transaction=False)
                for job_id in chunk:
                    pipe.hexists(queue.keys.job(job_id), "finishedOn")
                live = [job_id for job_id, ended in zip(chunk, pipe.execute()) if not ended]
                outcome = queue.cancel_many(live, reason or f"workflow {self.id} cancelled")
                cancelled += len(outcome.done) + len(outcome.other.get(STOPPING, []))
        return cancelled
