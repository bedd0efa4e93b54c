"""The durable jobs of tests/system/test_durable_processes.py, run by worker processes (tests/durable_app/workers.py).

Each job counts its runs, before anything else, in the Redis hash whose key
it is given (`runs`: job id -> runs): a park and its resume are two runs, and
so are a run killed and the run after it. A step's side effect is an
entry in the list `effects`, written by the step's function as it starts.
"""

import os
import random
import signal
import time
import uuid
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from echomq_django.durable import SignalTimeout, atomic_step, fan_out, sleep, step, wait_for_signal
from echomq_django.jobs import job
from echomq_django.queues import get_queue
from echomq_django.registry import current_job

QUEUE = "dq"
STEPS = 6
# Where open_account's run may kill its own process (SIGKILL), in the order a run passes them: "in_block" is
# after the row's INSERT and before its commit; "after_commit" is after the commit and before atomic_step
# writes the step's record to Redis (an on_commit callback runs there).
KILL_POINTS = ("start", "in_block", "after_commit", "after_record")


def _redis() -> Any:
    return get_queue(QUEUE).client


def _running() -> Any:
    found = current_job()
    assert found is not None, "called outside a job"
    return found


def _ran(runs: str) -> int:
    """Count this run of the job; its number (1 for the first)."""
    return int(_redis().hincrby(runs, _running().id, 1))


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@job(queue=QUEUE, name="durable.six_steps", attempts=1000)
def six_steps(runs: str, effects: str) -> dict[str, Any]:
    """Six steps in a row, each adding its number to the previous step's total: 21, and each step's token."""
    _ran(runs)
    total, tokens = 0, []
    for number in range(1, STEPS + 1):
        done = step(f"s{number}", _side_effect, effects, number, total)
        total = done["total"]
        tokens.append(done["token"])
    return {"total": total, "tokens": tokens}


def _side_effect(effects: str, number: int, total: int) -> dict[str, Any]:
    """Record this run of the step ("<job id>:<step>:<pid>:<token>"), then work for 50 to 150 ms."""
    token = uuid.uuid4().hex[:12]
    _redis().rpush(effects, f"{_running().id}:{number}:{os.getpid()}:{token}")
    time.sleep(random.uniform(0.05, 0.15))  # the step's work: the window a kill lands in
    return {"token": token, "total": total + number}


@job(queue=QUEUE, name="durable.nap")
def nap(runs: str, seconds: float) -> float:
    """Sleep durably for `seconds`; the time from the first run's start to the end of the sleep."""
    _ran(runs)
    started = step("started", time.time)
    sleep("nap", seconds)
    return time.time() - started


@job(queue=QUEUE, name="durable.quick")
def quick(runs: str, tag: str) -> str:
    _ran(runs)
    return tag


@job(queue=QUEUE, name="durable.await_signal")
def await_signal(runs: str, name: str, timeout: float | None = None) -> dict[str, Any]:
    """Wait for the signal `name`: its payload, or the name of what the wait raised past `timeout`."""
    _ran(runs)
    try:
        return {"payload": wait_for_signal(name, timeout)}
    except SignalTimeout as error:
        return {"raised": type(error).__name__}


@job(queue=QUEUE, name="durable.open_account", attempts=100)
def open_account(runs: str, kills: list[str]) -> dict[str, Any]:
    """Insert one User row in an atomic step, the run killing its own process where `kills` says.

    `kills[n]` is where run n + 1 dies (KILL_POINTS); a run past the list
    completes. The row's username is new on every run, so only atomic_step
    keeps a second row out (no unique constraint does); `last_name` is the job's id.
    """
    run = _ran(runs)
    point = kills[run - 1] if run <= len(kills) else None
    if point == "start":
        _die()
    with atomic_step("open") as opened:
        opened.result = User.objects.create(username=f"acct-{uuid.uuid4().hex}",
                                             last_name=_running().id).pk
        if point == "in_block":
            _die()
        if point == "after_commit":
            transaction.on_commit(_die)
    if point == "after_record":
        _die()
    return {"pk": opened.result, "replayed": opened.replayed}


@job(queue=QUEUE, name="durable.square")
def square(runs: str, number: int) -> int:
    _ran(runs)
    time.sleep(0.01)  # a child's work: a killed worker is caught in the middle of some
    return number * number


@job(queue=QUEUE, name="durable.fan_parent")
def fan_parent(runs: str, count: int) -> list[int]:
    """The squares of 0..count-1, each a child job of one fan-out."""
    _ran(runs)
    return fan_out("squares", [square.s(runs, number) for number in range(count)])
