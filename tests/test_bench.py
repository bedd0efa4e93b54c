"""The side-by-side benchmark still runs (its numbers are meaningless at these sizes)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import current_redis_url

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_compare_runs_and_prints_every_row():
    proc = subprocess.run([sys.executable, "bench/compare.py", "--quick", "--echomq-only", "--redis-url", current_redis_url()],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("steady sweep", "recover", "worker, no-op jobs/s", "bulk enqueue", "memory per waiting job"):
        assert row in proc.stdout, f"{row!r} missing from:\n{proc.stdout}"
