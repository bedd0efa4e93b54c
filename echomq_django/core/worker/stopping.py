"""The two stages of a stop that Worker, Sweeper and Beat share: thread-safe, never called from a signal handler.

Signals reach them through run_until_signalled (signals.py), whose handlers
only record the signal: stop() and abort() run in ordinary code, on any
thread, and may take locks and log.
"""

from __future__ import annotations

import threading


class TwoStages:
    """`stopping` from the first stop() on; `aborted` from abort() on (which a runner's second stop() calls)."""

    def __init__(self) -> None:
        self.stopping, self.aborted = threading.Event(), threading.Event()
        self._lock = threading.Lock()

    def stop(self) -> bool:
        """Raise `stopping`; True when it was raised already (the runner then aborts: a second stop)."""
        with self._lock:
            later = self.stopping.is_set()
            self.stopping.set()
        return later

    def abort(self) -> bool:
        """Raise both flags; True when this is the first abort."""
        with self._lock:
            first = not self.aborted.is_set()
            self.stopping.set()
            self.aborted.set()
        return first
