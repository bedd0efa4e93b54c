"""What a worker's, a sweeper's or a beat's stop() sets: safe to call from a signal handler.

Python runs a signal handler on the main thread, between two of its steps:
maybe while that thread holds the lock of a threading.Event it is waiting on
or setting, or while it runs the handler of an earlier signal. A handler
that sets the same Event then waits for that lock forever (a burst of
SIGTERMs to a script whose handler is `worker.stop()`, or one signal landing
in an outage's retry pause). A Flag's lock is reentrant, so the handler goes
through; and `TwoStages` counts the stops in one step that a handler cannot
cut in two, so that a stop landing inside another is still the second.
"""

from __future__ import annotations

import itertools
import threading


class Flag:
    """threading.Event's set, clear, is_set and wait, on a reentrant lock (see the module's docstring)."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.RLock())
        self._set = False

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._changed:
            self._set = True
            self._changed.notify_all()

    def clear(self) -> None:
        with self._changed:
            self._set = False

    def wait(self, timeout: float | None = None) -> bool:
        """Until set, or for at most `timeout` seconds; whether it is set."""
        with self._changed:
            return self._changed.wait_for(self.is_set, timeout)


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
