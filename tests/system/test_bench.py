"""The side-by-side benchmark still runs (its numbers are meaningless at these sizes)."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import current_redis_url
from tests.redis_servers import redis_server

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_compare_runs_and_prints_every_row():
    with redis_server() as url:  # of its own: bench/measure.py sets the slow log's threshold to log every call
        command = [sys.executable, "bench/compare.py", "--quick", "--echomq-only", "--no-everyday", "--redis-url", url]
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("steady sweep", "recover", "worker, no-op jobs/s", "bulk enqueue", "memory per waiting job"):
        assert row in proc.stdout, f"{row!r} missing from:\n{proc.stdout}"


@pytest.mark.timeout(360)
@pytest.mark.slow
def test_everyday_runs_every_figure_for_echomq_and_says_how_it_compares():
    proc = subprocess.run([sys.executable, "bench/everyday.py", "--quick", "--only", "echomq"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    header, *rows = [line for line in proc.stdout.splitlines() if "echomq Task.enqueue" in line or
                     line.startswith(("single enqueue, jobs/s", "pickup latency p50", "no-op jobs/s", "50 ms jobs/s",
                                      "  Redis time per job"))]
    assert header.split() == ["echomq", "echomq,", "pool", "echomq", "@job", "echomq", "Task.enqueue", "Django",
                              "Tasks,", "no", "queue"]
    figures = {row.rsplit(None, 5)[0]: row.split()[-5:] for row in rows}
    assert set(figures) == {"single enqueue, jobs/s", "pickup latency p50, ms", "no-op jobs/s, concurrency 1",
                            "no-op jobs/s, concurrency 8", "no-op jobs/s, concurrency 32",
                            "50 ms jobs/s, concurrency 32", "  Redis time per job, µs"}, proc.stdout
    assert all(cell != "err" for cells in figures.values() for cell in cells), proc.stdout
    assert figures["single enqueue, jobs/s"][4] != "n/a" and figures["no-op jobs/s, concurrency 1"][2:] == \
        ["n/a", "n/a", "n/a"], "the Django rows have the enqueue figures only"
    assert figures["no-op jobs/s, concurrency 1"][1] != "n/a", "the pool's way runs jobs too"
    assert float(figures["  Redis time per job, µs"][0]) > 0, "every job calls Redis"
    assert "physical limits, one client, round trips/s: redis-benchmark PING_INLINE" in proc.stdout


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_cluster_throughput_runs_for_one_and_three_masters():
    proc = subprocess.run([sys.executable, "bench/cluster_throughput.py", "--masters", "1,3", "--queues", "3",
                           "--jobs", "200", "--runs", "1"], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [row for row in map(str.split, proc.stdout.splitlines()) if len(row) == 5 and row[0].isdigit()]
    assert [row[0] for row in rows] == ["1", "3"], proc.stdout


@pytest.mark.timeout(240)
def test_metrics_cost_runs_and_prints_every_row():
    proc = subprocess.run([sys.executable, "bench/metrics_cost.py", "--quick", "--redis-url", current_redis_url()],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("finish, 1 job per call", "finish, 32 jobs per call", "fetch, 1 job per call",
                "fetch, 32 jobs per call", "worker, concurrency 8", "bytes per minute hash", "per queue per day"):
        assert row in proc.stdout, f"{row!r} missing from:\n{proc.stdout}"


@pytest.mark.timeout(240)
def test_browse_cost_runs_and_prints_every_row():
    proc = subprocess.run([sys.executable, "bench/browse_cost.py", "--quick", "--redis-url", current_redis_url()],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("completed ", "wait "))]
    assert [(row[0], row[1]) for row in rows] == [(state, call) for state in ("completed", "wait")
                                                  for call in ("counts()", "first", "last")], proc.stdout



@pytest.mark.timeout(360)
@pytest.mark.slow
def test_beat_cost_runs_and_finds_each_tick_fired_once():
    proc = subprocess.run([sys.executable, "-u", "bench/beat_cost.py", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(("1 scheduler ", "2 schedulers "))]
    assert [row[0] for row in rows] == ["1", "2"] * 3, proc.stdout  # the ticks, lateness and cost tables
    for row in rows[:2]:  # ... >1 job, fired decisions, jobs (all), printed, missed
        assert row[-5] == "0" and row[-4] == row[-3] == row[-2], proc.stdout


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_pool_cost_runs_and_prints_every_row():
    """Celery's rows are measured when it is installed (the bench extra), and said to be missing otherwise."""
    proc = subprocess.run([sys.executable, "bench/pool_cost.py", "--quick", "--redis-url", current_redis_url()],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    cases = [("echomq", "threads", "no-op"), ("echomq", "processes", "no-op"), ("echomq", "processes", "counting")]
    if "celery prefork: not measured" not in proc.stdout:
        cases.append(("celery", "prefork", "counting"))
    rows = [tuple(row[:4]) for row in map(str.split, lines) if len(row) == 9 and row[2] in ("no-op", "counting")]
    assert rows == [(*case, conc) for conc in ("2", "8") for case in cases], proc.stdout
    for row, times in {"processes / threads, no-op": 2, "echomq processes / celery prefork, counting": 2,
                       "CPU-bound: 4 jobs": 1, "threads / processes wall time": 1}.items():
        assert proc.stdout.count(row) == times, f"{row!r} missing from:\n{proc.stdout}"
    walls = [row[0] for row in map(str.split, lines) if row[:1] in (["threads"], ["processes"]) and row[1] != "/"]
    assert walls == ["threads", "processes"], proc.stdout


@pytest.mark.timeout(240)
def test_outbox_cost_runs_and_prints_every_row():
    proc = subprocess.run([sys.executable, "bench/outbox_cost.py", "--transactions", "10", "--runs", "1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("1 job(s) per transaction ", "100 job(s) per transaction, and a row of its own", "with the outbox",
                "0 of 50", "the job started"):
        assert row in proc.stdout, f"{row!r} missing from:\n{proc.stdout}"


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_workflow_cost_runs_and_prints_every_row():
    with redis_server() as url:  # of its own, as compare.py's
        proc = subprocess.run([sys.executable, "bench/workflow_cost.py", "--quick", "--redis-url", url],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Redis time per member end" in proc.stdout and "chord member" in proc.stdout
    assert "  chord  501 jobs:" in proc.stdout and "longest call" in proc.stdout
    assert "Last member's end to the callback's start" in proc.stdout



@pytest.mark.timeout(240)
def test_otel_cost_runs_and_prints_every_row():
    proc = subprocess.run([sys.executable, "bench/otel_cost.py", "--quick", "--redis-url", current_redis_url()],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in ("tracing on: False", "Queue.add, with the hook", "the same add without the hook",
                "median of the blocks' ratios (wall time)", "the hook alone", "with tracing on"):
        assert row in proc.stdout, f"{row!r} missing from:\n{proc.stdout}"


@pytest.mark.timeout(360)
def test_redis_time_runs_on_a_private_server_and_prints_every_row():
    # --floor also runs a worktree of HEAD with bench/floor's scripts in place of the real ones.
    proc = subprocess.run([sys.executable, "bench/redis_time.py", "--quick", "--floor"], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = ("add, one call per job", "add, bulk", "fetch + finish", "whole life, single adds", "whole life, bulk adds")
    for row in ("concurrency 1 ", "concurrency 32 ", *rows):
        assert row in proc.stdout, f"{row!r} missing from:\n{proc.stdout}"
    assert proc.stdout.count("the floor / this checkout") == 2, proc.stdout
    for row in rows:
        ratios = [line.split()[-2:] for line in proc.stdout.splitlines() if line.startswith(f"    {row}")]
        assert len(ratios) == 2 and all(float(r) > 0 for pair in ratios for r in pair), proc.stdout


@pytest.mark.timeout(240)
@pytest.mark.slow
def test_light_load_runs_every_figure_in_interleaved_blocks():
    """On a private redis-server; Huey's ratios are n/a when it is not installed (the bench extra)."""
    proc = subprocess.run([sys.executable, "bench/light_load.py", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split("  ")[0] for line in proc.stdout.splitlines()
            if line.startswith(("single enqueue", "pickup latency", "no-op jobs/s"))]
    assert rows == ["single enqueue, jobs/s"] * 2 + ["pickup latency p50 c1, ms", "pickup latency p50 c8, ms",
                                                     "no-op jobs/s, concurrency 1"], proc.stdout
    assert "ping() " in proc.stdout and ">= 0.85" in proc.stdout, proc.stdout


@pytest.mark.timeout(120)
def test_retry_spread_runs_and_shows_the_jitter():
    command = [sys.executable, "bench/retry_spread.py", "--jobs", "200", "--backoff", "30",
               "--redis-url", current_redis_url()]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    without, with_jitter = proc.stdout.splitlines()
    assert without.startswith("without jitter") and with_jitter.startswith("with jitter")
    stdev = [float(line.rsplit("stdev ", 1)[1].split()[0]) for line in (without, with_jitter)]
    assert stdev[1] > 5 > stdev[0], "a 30 s backoff drawn at random spreads over seconds; without jitter it does not"


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_durable_runs_its_three_parts_and_prints_sane_figures():
    """On a private redis-server of the bench's own (part 3 has the slow log keep every call)."""
    proc = subprocess.run([sys.executable, "bench/durable.py", "--quick"], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {line.strip().split("  ")[0]: line.split() for line in proc.stdout.splitlines() if line.startswith("   ")}
    # 1: a checkpoint costs Redis something, and less than a no-op job's whole life (about a tenth of it).
    assert {"no-op job's life (add, fetch, finish)", "one checkpoint (HGET + recordStep)"} <= set(rows), proc.stdout
    ratios = [float(cell) for cell in rows["checkpoint / no-op life, median ratio"][-3:]]
    assert all(0 < ratio < 1 for ratio in ratios), proc.stdout
    # 2: both runs took their 200 steps, and the replay, a read a step, sent Redis less work than the first run.
    first, replay = rows["first run (records each step)"], rows["replay (reads each record)"]
    assert float(first[-3]) > 0 and float(replay[-3]) > 0, proc.stdout
    assert 0 < float(rows["replay / first run, median ratio"][-1]) < 1, proc.stdout
    # 3: each of the 1,000 steps recorded by exactly one recordStep call; the job read, paged and removed.
    assert rows["recordStep-3"][1] == "1,000", proc.stdout
    assert int(rows["HGET"][1].replace(",", "")) >= 1000, proc.stdout
    assert {"moveToFinished-10", "getJob-11", "HSCAN", "HLEN", "removeJob-10"} <= set(rows), proc.stdout
    longest = float(proc.stdout.split("longest call of any kind: ", 1)[1].split()[0])
    assert 0 < longest < 1000, proc.stdout  # gross: the bound measured is 50 ms, on a quiet machine
    page = proc.stdout.split("a page of the steps", 1)[1]
    assert int(page.split(" records")[0].split()[-1]) > 0, proc.stdout
    assert page.split("the admin's read_steps: ", 1)[1].split(" records")[0].endswith(" 200"), "its 200 at most"
    assert 20 < int(page.split(" per step")[0].split()[-1]) < 1000, "bytes a step's record takes in Redis"
