"""What a worker's, a sweeper's or a beat's stop() sets: safe to call from a signal handler.

Python runs a signal handler on the main thread, between two of its steps:
maybe while that thread holds the lock of a threading.Event it is waiting on
or setting, or while it runs the handler of an earlier signal. A handler
that sets the same Event then waits for that lock forever (a burst of
SIGTERMs to a script whose handler is `worker.stop()`, or one signal landing
in an outage's retry pause). A Flag takes no lock that a handler could find
taken; and `TwoStages` counts the stops in one step that a handler cannot cut
in two, so that a stop landing inside another is still the second.
"""

from __future__ import annotations

import _thread
import collections
import contextlib
import itertools
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType


class Flag:
    """threading.Event's set, clear, is_set and wait, safe in a signal handler (see the module's docstring).

    Each wait blocks on a lock of its own, which set() releases. Every step
    that a handler could land between is one the other side is ready for: a
    wait looks at the flag again once its lock is in the queue, so a set()
    before that is seen there, and one after it releases the lock; set()
    takes each lock out of the queue in one step, so a set() landing inside
    another never releases a lock twice.
    """

    def __init__(self) -> None:
        self._set = False
        self._waiters: collections.deque[_thread.LockType] = collections.deque()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        while True:
            try:
                waiter = self._waiters.popleft()
            except IndexError:
                return
            waiter.release()

    def clear(self) -> None:
        self._set = False

    def wait(self, timeout: float | None = None) -> bool:
        """Until set, or for at most `timeout` seconds (0 or less: not at all); whether it is set."""
        if self._set:
            return True
        waiter = _thread.allocate_lock()
        waiter.acquire()
        try:
            self._waiters.append(waiter)  # inside: a handler's exception may leave from this very call
            if self._set:
                return True
            if timeout is None:
                return waiter.acquire()
            # True when set() released it, as Event's: even if cleared again since
            return waiter.acquire(timeout=timeout) if timeout > 0 else False
        finally:
            try:
                self._waiters.remove(waiter)
            except ValueError:
                pass  # set() took it


class TwoStages:
    """The two stages of a stop: `stopping` from the first stop() on, `aborted` from the second."""

    def __init__(self) -> None:
        self.stopping, self.aborted = Flag(), Flag()
        self._count = itertools.count()  # next() is one step for the interpreter: no handler lands inside it

    def stop(self) -> bool:
        """Count a stop and raise its flags; True for the second and later."""
        later = next(self._count) > 0
        self.stopping.set()
        if later:
            self.aborted.set()
        return later


# How long after a Ctrl-C that raised the next ones are dropped: run()'s cleanup takes milliseconds.
CLEANUP_GRACE_S = 2.0


@contextlib.contextmanager
def one_ctrl_c() -> Iterator[None]:
    """Within: a Ctrl-C raises KeyboardInterrupt, as Python's own does, but not again for CLEANUP_GRACE_S.

    Python's Ctrl-C raises between any two steps of the main thread, and so
    a second one lands in the cleanup that the first began: a caller that
    catches the KeyboardInterrupt and lives on (a shell, a notebook) would
    keep a worker half stopped, renewing the locks of the jobs it left. A
    SIGINT handler of the caller's own is left as it is, and so is a block
    off the main thread (no signal is handled there). Should a Ctrl-C land
    where this cannot put Python's handler back (between two of its own
    steps), the one left behind still raises: never twice in a grace, and
    once the block has ended, as Python's, which it puts back.
    """
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    raised_at, within = -CLEANUP_GRACE_S, True

    def on_ctrl_c(signum: int, frame: FrameType | None) -> None:
        nonlocal raised_at
        if not within:  # left behind by a Ctrl-C in the finally below: Python's own, from now on
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        if time.monotonic() - raised_at >= CLEANUP_GRACE_S:
            raised_at = time.monotonic()
            raise KeyboardInterrupt

    try:
        signal.signal(signal.SIGINT, on_ctrl_c)  # inside: a Ctrl-C may raise as soon as it is in
        yield
    finally:
        within = False
        if signal.getsignal(signal.SIGINT) is on_ctrl_c:  # not one that a job put in meanwhile
            signal.signal(signal.SIGINT, signal.default_int_handler)
