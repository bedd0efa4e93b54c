"""The thread that reads the schedules for Beat.run, so a slow or locked database never holds a tick back."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from .ticks import Schedule

logger = logging.getLogger("echomq.beat")


class ScheduleReader:
    """Reads the schedules on a daemon thread, one reading at a time, for Beat.run.

    A reading that fails keeps the schedules known (a database that is down, a
    bug in a loader): firing what is known beats firing nothing.
    """

    def __init__(self, load: Callable[[], Iterable[Schedule]], done: threading.Event,
                 close: Callable[[], None] | None) -> None:
        self._load, self._done, self._close = load, done, close
        self._asked = threading.Event()
        self._lock = threading.Lock()
        self._result: list[Schedule] | None = None
        self._stopped = False
        self.busy = False
        threading.Thread(target=self._serve, name="echomq-beat-reader", daemon=True).start()

    def ask(self) -> None:
        self.busy = True
        self._asked.set()

    def take(self) -> list[Schedule] | None:
        """The schedules of the latest reading that ended since the last take, else None."""
        with self._lock:
            result, self._result = self._result, None
        return result

    def wait_ended(self, deadline: float, stopping: threading.Event) -> bool:
        """Wait for the reading in progress to end, until `deadline` (monotonic) or `stopping`; whether it ended."""
        while self.busy and time.monotonic() < deadline and not stopping.is_set():
            self._done.wait(0.05)
            self._done.clear()
        return not self.busy

    def stop(self) -> None:
        self._stopped = True
        self._asked.set()

    def _serve(self) -> None:
        try:
            while True:
                self._asked.wait()
                self._asked.clear()
                if self._stopped:
                    return
                try:
                    found: list[Schedule] | None = list(self._load())
                except Exception:
                    logger.exception("could not read the schedules; keeping those known")
                    found = None
                with self._lock:
                    self._result = found
                self.busy = False
                self._done.set()
        finally:
            if self._close is not None:
                self._close()
