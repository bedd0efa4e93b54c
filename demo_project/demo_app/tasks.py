"""Django Tasks (`@task`) that the demo and the tests run through echomq."""

import asyncio
import time
from datetime import timedelta

from echomq_django.core import Backoff
from echomq_django.durable import step, wait_for_signal

try:
    from django.tasks import task
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(attempts=3, backoff=Backoff("fixed", 0))
def always_fails(message: str) -> None:
    raise ValueError(message)


@task
async def double_later(x: int) -> int:
    """An async task: the worker runs it on an event loop."""
    await asyncio.sleep(0.01)
    return x * 2


@task(takes_context=True, attempts=3)
def slow_first_attempt(context, seconds: float) -> int:
    """Sleeps on its first attempt only; returns the attempt it finished on."""
    if context.attempt == 1:
        time.sleep(seconds)
    return context.attempt


@task
def returns_a_set() -> object:
    return {1, 2}


@task(attempts=3)
def approve_order(order_id: int) -> dict:
    """A durable task: its price is a recorded step, then it waits, with no worker, for an "approved" signal."""
    total = step("price", lambda: order_id * 10)
    decision = wait_for_signal("approved", timeout=timedelta(days=2))
    return {"order": order_id, "total": total, "approved_by": decision["by"]}
