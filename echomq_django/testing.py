"""Testing a project's jobs and tasks: run what was enqueued in the test's own process, through the real scripts on
a real Redis, until nothing is left (docs/testing.md).

    # conftest.py
    pytest_plugins = ["echomq_django.testing"]

    # test_orders.py
    def test_a_receipt_is_sent(echomq, mailoutbox):
        place_order(...)                 # the view enqueues send_receipt
        assert echomq.run_jobs() == 1    # runs it here; its retries, links and workflows too
        assert len(mailoutbox) == 1

The `echomq` fixture gives each test a Redis key prefix of its own (ECHOMQ["PREFIX"]) and deletes its keys
afterwards; `run_jobs` works without it too, on the prefix the settings name.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from .core import EchoMQError

# (The Django layer is imported inside the functions: pytest loads this plugin before Django is set up.)

__all__ = ["EchoMQFixture", "JobsLeft", "echomq", "run_jobs"]

# The states of jobs that are still to run (a deferred workflow step runs once its inputs came).
_PENDING = ("wait", "prioritized", "paused", "active", "delayed", "deferred")
_ROUND = 100


class JobsLeft(EchoMQError):
    """run_jobs gave up: jobs were still to run at its timeout (a job that re-enqueues itself for ever, say)."""


def run_jobs(queue: str | None = None, *, run_delayed: bool = True, timeout: float = 30) -> int:
    """Run the jobs of `queue` (every configured queue by default) in this process until none is left to run;
    the number of attempts run.

    Each round is a real worker in burst mode (threads pool, the queue's own
    settings), so jobs go through the same scripts, JSON, retries, time limits
    and workflow hand-offs as in production; the jobs a run enqueues run too.
    With `run_delayed` (the default) a delayed job (a countdown, an eta, a
    retry's backoff) is made due at once, as Celery's eager mode ignores
    countdowns; without it, delayed jobs are left for the test to see. A job
    paused by a queue's `pause()` is left too. JobsLeft after `timeout` seconds
    (checked between rounds: a job that runs longer is not interrupted).
    A task's own rate limit holds here too: its jobs wait their turns, and each
    time one is held back counts as an attempt run.
    """
    from .conf import get_settings, unserved_queue
    from .jobs import run_job
    from .queues import make_worker

    if queue is not None and (problem := unserved_queue(queue)):
        raise ValueError(f"run_jobs cannot run {problem}")
    names = [queue] if queue is not None else list(get_settings().queues)
    deadline = time.monotonic() + timeout
    ran = 0
    while True:
        this_round = 0
        for name in names:  # (at most _ROUND jobs a burst: a job that enqueues itself for ever ends at the timeout)
            this_round += make_worker(name, run_job, concurrency=1, pool="threads").run(burst=True, max_jobs=_ROUND)
        ran += this_round
        promoted = sum(_promote_all(name) for name in names) if run_delayed else 0
        if this_round == 0 and promoted == 0 and not any(_left(name, run_delayed) for name in names):
            return ran
        if time.monotonic() >= deadline:
            left = {name: count for name in names if (count := _left(name, run_delayed))}
            if not left:
                return ran
            raise JobsLeft(f"jobs were still to run after {timeout} s: {left}")
        if this_round == 0 and promoted == 0:
            time.sleep(0.05)  # a job held back by a rate limit, or running in another worker: look again


def _promote_all(name: str, limit: int = 10_000) -> int:
    """Make every delayed job of queue `name` due now (at most `limit`)."""
    from .queues import get_queue

    queue = get_queue(name)
    ids = queue.client.zrange(queue.keys.delayed, 0, limit - 1)
    return sum(1 for job_id in ids if queue.promote(job_id))


def _left(name: str, with_delayed: bool) -> int:
    from .queues import get_queue

    counts = get_queue(name).counts()
    return sum(counts.get(state, 0) for state in _PENDING
               if (state != "delayed" or with_delayed) and state != "paused")


class EchoMQFixture:
    """What the `echomq` fixture gives a test: `run_jobs`, and each configured queue by name (`queue(name)`)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def run_jobs(self, queue: str | None = None, **options: Any) -> int:
        return run_jobs(queue, **options)

    def queue(self, name: str = "default") -> Any:
        from .queues import get_queue

        return get_queue(name)

    def clean(self) -> None:
        from .conf import get_settings
        from .queues import get_queue

        for name in get_settings().queues:
            get_queue(name).obliterate()


try:
    import pytest
except ImportError:  # pragma: no cover  (the fixture needs pytest; run_jobs does not)
    pass
else:
    @pytest.fixture
    def echomq(settings: Any) -> Iterator[EchoMQFixture]:
        """A key prefix of this test's own under ECHOMQ (pytest-django's `settings`), deleted afterwards."""
        prefix = f"test-{uuid.uuid4().hex[:12]}"
        settings.ECHOMQ = {**getattr(settings, "ECHOMQ", {}), "PREFIX": prefix}
        fixture = EchoMQFixture(prefix)
        try:
            yield fixture
        finally:
            fixture.clean()
