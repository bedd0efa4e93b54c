"""Hostile checks of the job handle's async wait (issue 28, item 5)."""

import math
import threading

import pytest

from echomq_django.core import JobNotFoundError
from tests.helpers import abandoned_await_ends


def test_an_await_result_given_up_by_its_caller_ends_its_thread(queue):
    # asyncio.wait_for (or a cancelled task) gives the wait up: its worker thread must stop too. Else
    # asyncio.run waits for it as it shuts its executor down (5 minutes), and every such timeout leaves a thread
    # polling Redis forever.
    handle = queue.handle(queue.add("x"))  # never worked: the wait cannot end by itself
    abandoned_await_ends(handle.await_result)


def test_wait_takes_an_infinite_timeout_and_refuses_nan_clearly(queue):
    # math.inf is the usual "wait for ever" spelling (as threading's waits take it); it crashed in int().
    handle = queue.handle(queue.add("x"))
    with pytest.raises(ValueError, match="timeout"):
        handle.wait(math.nan)
    remover = threading.Timer(0.3, lambda: queue.remove(handle))  # ends the wait: the job is gone
    remover.start()
    with pytest.raises(JobNotFoundError):
        handle.wait(math.inf)
    remover.join()
