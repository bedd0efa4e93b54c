"""Many sweepers at once, through bench/race.py: the atomic script recovers each job once with
atm +1; the seeds' non-atomic loop of round trips, kept only in the experiment, does not."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # the race's runs, about 5 s each, are the set-up


RUNS = 5  # a run whose sweepers did not meet (one took every job before the others started) is run again


@pytest.fixture(scope="module")
def race(redis_url) -> dict[str, dict]:
    for _ in range(RUNS):
        result = subprocess.run(
            # A budget of 1 id a call: each sweep is 800 short calls, so four sweepers interleave all along
            # (the overlap is the point, not the count; the round-trip loop's LREMs grow with the square of it).
            [sys.executable, "bench/race.py", "--sweepers", "4", "--jobs", "800", "--budget", "1", "--json",
             "--redis-url", redis_url],
            cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        rows = {row["strategy"]: row for row in json.loads(result.stdout)}
        # On a busy machine the sweepers can start a few round trips apart: walking the same list in the same
        # order, the late ones then find each job recovered and never meet the first. A run is taken once both
        # strategies' sweepers overlapped and the loop's met on a job: the race is a matter of chance, so the
        # contrast is shown by the run where it happened (the atomic sweep's every run must hold).
        atomic, loop = rows["atomic"], rows["non-atomic"]
        assert (atomic["recovered_twice"], atomic["lost_updates"], atomic["never_recovered"]) == (0, 0, 0), atomic
        if atomic["sweepers_that_recovered"] > 1 and (loop["recovered_twice"] or loop["lost_updates"]):
            break
    return rows


def test_overlapping_atomic_sweeps_recover_each_job_exactly_once(race):
    atomic = race["atomic"]
    assert atomic["sweepers_that_recovered"] > 1, "the sweeps did not overlap"
    assert (atomic["recovered_twice"], atomic["lost_updates"], atomic["never_recovered"]) == (0, 0, 0)


def test_the_non_atomic_loop_double_recovers_or_loses_attempts(race):
    loop = race["non-atomic"]
    assert loop["recovered_twice"] > 0 or loop["lost_updates"] > 0, (
        f"the round-trip loop showed no race in {RUNS} runs")
