"""How long Redis was blocked by scripts, read from Redis itself; shared by the benchmarks.

Total script time comes from INFO commandstats (EVALSHA's usec counter, which
includes the commands a script runs); the longest single call from SLOWLOG.
Both are Redis-wide, so measure one thing at a time on a Redis nobody else uses.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# Calls faster than this are not logged; a longest call below it shows as this bound
# (0 logs every call, and every command inside a script, which costs a little).
SLOWLOG_THRESHOLD_US = 100


@dataclass
class ScriptTime:
    calls: int = 0
    total_ms: float = 0.0
    longest_ms: float = 0.0
    wall_ms: float = 0.0


def _evalsha_stats(client: Any) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return stats.get("calls", 0), stats.get("usec", 0)


@contextmanager
def slowlog_on(client: Any, threshold_us: int = SLOWLOG_THRESHOLD_US) -> Iterator[None]:
    """Log every call slower than `threshold_us` while inside; restore the settings after."""
    saved = client.config_get("slowlog-*")
    client.config_set("slowlog-log-slower-than", threshold_us)
    client.config_set("slowlog-max-len", 100_000)
    try:
        yield
    finally:
        client.config_set("slowlog-log-slower-than", saved["slowlog-log-slower-than"])
        client.config_set("slowlog-max-len", saved["slowlog-max-len"])


def script_time(client: Any, action: Callable[[], Any]) -> tuple[ScriptTime, Any]:
    """Run `action` and say how long Redis spent in scripts meanwhile (inside `slowlog_on`)."""
    client.slowlog_reset()
    calls_before, usec_before = _evalsha_stats(client)
    started = time.perf_counter()
    result = action()
    wall_ms = (time.perf_counter() - started) * 1000
    calls_after, usec_after = _evalsha_stats(client)
    # Redis 7 also logs the commands run inside a script (client "?:0"); only
    # the top-level EVALSHA is how long other clients had to wait.
    longest = max((entry["duration"] for entry in client.slowlog_get(100_000)
                   if str(entry["command"]).startswith(("EVALSHA", "b'EVALSHA"))
                   and entry["client_address"] not in ("?:0", b"?:0")), default=SLOWLOG_THRESHOLD_US)
    return ScriptTime(calls_after - calls_before, (usec_after - usec_before) / 1000, longest / 1000,
                      wall_ms), result


def used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def drop(client: Any, pattern: str) -> None:
    """Delete every key matching `pattern` (a SCAN pattern, already escaped)."""
    batch: list[str] = []
    for key in client.scan_iter(match=pattern, count=5000):
        batch.append(key)
        if len(batch) >= 5000:
            client.unlink(*batch)
            batch = []
    if batch:
        client.unlink(*batch)


def parse_rate(proc: subprocess.CompletedProcess) -> float:
    """The rate a worker subprocess printed as 'RATE <jobs/s>'."""
    if proc.returncode != 0:
        raise RuntimeError(f"worker exited {proc.returncode}: {proc.stderr[-2000:]}")
    for line in proc.stdout.splitlines():
        if line.startswith("RATE "):
            return float(line.split()[1])
    raise RuntimeError(f"worker printed no rate: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
