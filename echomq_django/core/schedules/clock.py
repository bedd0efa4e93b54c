"""Redis's clock, followed from the host's: every scheduler fires by it, whatever its host's clock says."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

# A host clock that moves this far from the monotonic clock between two looks was stepped (NTP, a
# restored VM): Redis's clock is measured again rather than followed from the old offset.
CLOCK_STEP_MS = 500


class RedisClock:
    """The time by Redis's clock (ms), from the host's `clock` and an offset measured with one TIME call."""

    def __init__(self, client: Any, clock: Callable[[], int]) -> None:
        self.client = client
        self.clock = clock
        self._offset_ms: int | None = None  # Redis's clock minus ours, measured at each reading
        self._clock_drift_ms = 0  # our clock minus the monotonic clock when the offset was measured

    def now(self) -> int:
        """The time by Redis's clock, measured first when it never was, or when our clock was stepped since."""
        local = self.clock()
        if self._offset_ms is None or abs(local - time.monotonic_ns() // 1_000_000 - self._clock_drift_ms) \
                > CLOCK_STEP_MS:
            self.measure()  # never measured, or our clock was stepped since
            local = self.clock()
        return local + (self._offset_ms or 0)

    def measure(self) -> None:
        """Measure how far Redis's clock is from ours (one TIME call)."""
        before = self.clock()
        seconds, micros = self.client.time()
        after = self.clock()
        self._offset_ms = int(seconds) * 1000 + int(micros) // 1000 - (before + after) // 2
        self._clock_drift_ms = after - time.monotonic_ns() // 1_000_000

    def forget(self) -> None:
        """Have the next look measure again (Redis did not answer, or an answer said our clocks disagree)."""
        self._offset_ms = None
