"""Durable steps on real worker processes killed with SIGKILL (issue 41): each step runs once but where a kill
landed, a sleep and a signal wait free the worker's slot, an atomic step writes one row per job whatever run dies
where, and a fan-out of 500 resumes its parent once.

The workers are `echomq_worker` commands forked from one process that set Django up (tests/durable_app/workers.py):
a worker killed costs a fork, not an interpreter's start, which is what makes hundreds of kills affordable. They run
the jobs of tests/durable_app/jobs.py on the test's database; a sweeper thread here recovers the jobs of the workers
killed. The atomic step's runs kill their own process at points of the test's choosing, one of them an on_commit
callback: after the block's commit and before the step's record goes to Redis, with no sleep to widen the window.
"""

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from echomq_django.core import Queue, Sweeper, connect
from echomq_django.durable import SignalRefused
from echomq_django.models import DurableStep
from tests.durable_app import jobs as durable_jobs
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
LOCK_MS = 1000  # the queue's LOCK_DURATION in tests/durable_settings.py
KILLS = 20  # workers killed under the six-step jobs
RUNS = 200  # runs of the atomic step's jobs, most of them killed
FAN_OUT = 500
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


class Workers:
    """The worker processes of tests/durable_app/workers.py, and which of them are alive (its stdout says)."""

    def __init__(self, env: dict[str, str], errors: Path, count: int, *options: str, respawn: bool) -> None:
        with errors.open("a") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.durable_app.workers", str(count), *(["--respawn"] if respawn else []),
                 "--queue", durable_jobs.QUEUE, "-v", "0", *options],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        self._alive: set[int] = set()
        self._lock = threading.Lock()  # the reader thread changes _alive as the test reads it
        self.started = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            what, pid = line.split()
            with self._lock:
                if what == "started":
                    self._alive.add(int(pid))
                    self.started += 1
                else:
                    self._alive.discard(int(pid))

    @property
    def alive(self) -> set[int]:
        with self._lock:
            return set(self._alive)

    def kill(self, pid: int) -> None:
        """SIGKILL one worker of ours (the launcher reaps it, and replaces it with --respawn)."""
        with self._lock:
            assert pid in self._alive, f"{pid} is not a live worker of this test"
            os.kill(pid, signal.SIGKILL)
            self._alive.discard(pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # it kills its workers and reaps them
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                for pid in self.alive:
                    os.kill(pid, signal.SIGKILL)
                self.process.kill()
                self.process.wait(10)
        self._reader.join(10)


@dataclass
class Durable:
    """A test's queue `dq`, its keys for what the jobs record, its worker processes and a sweeper thread."""

    queue: Queue
    env: dict[str, str]
    tmp_path: Path
    runs: str  # the jobs' runs (tests/durable_app/jobs.py)
    effects: str  # the steps' side effects
    fleets: list[Workers] = field(default_factory=list)

    @property
    def errors(self) -> Path:
        return self.tmp_path / "workers.err"

    def workers(self, count: int, *options: str, respawn: bool = False) -> Workers:
        """Start `count` workers (echomq_worker `options`), replaced as they die with `respawn`."""
        fleet = Workers(self.env, self.errors, count, *options, respawn=respawn)
        self.fleets.append(fleet)
        return fleet

    def runs_of(self, job_id: str) -> int:
        return int(self.queue.client.hget(self.runs, job_id) or 0)

    def all_completed(self, handles) -> bool:
        return all(self.queue.get_state(handle.id) == "completed" for handle in handles)

    def events(self, name: str, job_id: str) -> int:
        return sum(1 for _id, fields in self.queue.client.xrange(self.queue.keys.events)
                   if fields["event"] == name and fields["jobId"] == job_id)

    def explain(self) -> str:
        """What a failed wait shows: the queue's counts, and the end of what the workers wrote to stderr."""
        errors = self.errors.read_text()[-3000:] if self.errors.exists() else ""
        return f"counts {self.queue.counts()}; the workers' stderr: {errors}"


@pytest.fixture
def durable(settings, subprocess_env, redis_client, redis_url, prefix, tmp_path):
    """The test's Durable; its workers are killed and its sweeper stopped at the end."""
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix,
                       "QUEUES": {durable_jobs.QUEUE: {"LOCK_DURATION": LOCK_MS / 1000}}}
    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.durable_settings"}
    queue = Queue(durable_jobs.QUEUE, redis_client, prefix=prefix)
    state = Durable(queue, env, tmp_path, runs=f"{prefix}:runs", effects=f"{prefix}:effects")
    # Short sweeps, and no job failed for its stalls: the kills are the test, not a fault in the jobs.
    sweeper = Sweeper(connect(redis_url), [queue.name], prefix=prefix, interval_ms=250, max_stalled_count=1000,
                      lock_duration_ms=LOCK_MS)
    sweeping = threading.Thread(target=sweeper.run, args=(lambda report: None,), daemon=True)
    sweeping.start()
    try:
        yield state
    finally:
        for fleet in state.fleets:
            fleet.stop()
        sweeper.stop()
        sweeping.join(10)


def effects_by_step(durable: Durable) -> dict[tuple[str, int], list[tuple[int, str]]]:
    """(job id, step) -> [(pid, token)] of each run of the step's function, in the order they started."""
    runs: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
    for entry in durable.queue.client.lrange(durable.effects, 0, -1):
        job_id, number, pid, token = entry.rsplit(":", 3)
        runs[(job_id, int(number))].append((int(pid), token))
    return runs



def kill_workers_under_six_step_jobs(durable: Durable, rng: random.Random) -> tuple[list, set[int]]:
    """Kill KILLS workers at random moments, each one that has begun a step, keeping six jobs running meanwhile;
    (the jobs, the pids killed)."""
    workers = durable.workers(3, "--concurrency", "2", respawn=True)
    handles = [durable_jobs.six_steps.enqueue(durable.runs, durable.effects) for _ in range(6)]
    killed: set[int] = set()
    chosen: list[int] = []

    def pick() -> bool:
        recent = durable.queue.client.lrange(durable.effects, -50, -1)  # "<job id>:<step>:<pid>:<token>"
        working = {int(entry.rsplit(":", 2)[1]) for entry in recent}
        candidates = sorted(workers.alive & working - killed)
        chosen[:] = [rng.choice(candidates)] if candidates else []
        return bool(chosen)

    while len(killed) < KILLS:
        time.sleep(rng.uniform(0.1, 0.4))  # the kill's moment, at random: not a wait for anything
        assert wait_until(pick, 30), durable.explain()
        workers.kill(chosen[0])
        killed.add(chosen[0])
        if sum(handle.status != "completed" for handle in handles) < 6:
            handles.append(durable_jobs.six_steps.enqueue(durable.runs, durable.effects))
    return handles, killed


def test_six_step_jobs_whose_workers_are_killed_20_times_run_each_step_once_but_where_a_kill_landed(durable):
    handles, killed = kill_workers_under_six_step_jobs(durable, random.Random())
    assert wait_until(lambda: durable.all_completed(handles), 60), durable.explain()

    effects = effects_by_step(durable)
    cut_off_in_all = 0
    for handle in handles:
        result = handle.result
        assert result["total"] == sum(range(1, durable_jobs.STEPS + 1)), result
        cut_off_by: list[int] = []
        for number, token in enumerate(result["tokens"], 1):
            ran = effects[(handle.id, number)]
            # The result is the last run's: every earlier run was cut off before its record was written.
            assert ran[-1][1] == token, (handle.id, number, ran, token)
            cut_off = [pid for pid, _token in ran[:-1]]
            assert set(cut_off) <= killed, f"step {number} of {handle.id} ran again with no kill: {ran}"
            cut_off_by += cut_off
        # So each step ran at most once more than the kills that landed in it: a kill cut off one step of a job.
        assert len(set(cut_off_by)) == len(cut_off_by), f"a kill cut off two runs of {handle.id}: {cut_off_by}"
        assert durable.events("completed", handle.id) == 1
        cut_off_in_all += len(cut_off_by)
    print(f"\n{len(handles)} six-step jobs, {len(killed)} workers killed, {cut_off_in_all} steps cut off and run again")
    assert cut_off_in_all >= KILLS // 4, "the kills hardly landed in a step: the test no longer tests re-runs"


def test_a_sleep_at_concurrency_1_frees_the_worker_for_another_job(durable):
    durable.workers(1, "--concurrency", "1")
    sleeper = durable_jobs.nap.enqueue(durable.runs, 3)
    assert wait_until(lambda: sleeper.status == "delayed", 30), durable.explain()
    other = durable_jobs.quick.enqueue(durable.runs, "meanwhile")
    assert wait_until(lambda: other.status == "completed", 30), durable.explain()
    assert sleeper.status == "delayed", "the other job ran only once the sleep was over"
    assert wait_until(lambda: sleeper.status == "completed", 30), durable.explain()
    job = durable.queue.get_job(sleeper.id)
    assert 3 <= job.returnvalue < 3 + 20, job.returnvalue
    assert job.attempts_made == 1 and durable.runs_of(sleeper.id) == 2


def test_signals_across_processes_park_without_a_slot_resume_keep_early_ones_and_time_out(durable):
    early = durable_jobs.await_signal.enqueue(durable.runs, "go")
    assert early.signal("go", {"early": True}) is False  # kept: no worker has run the job yet
    parked = durable_jobs.await_signal.enqueue(durable.runs, "approved")
    patient = durable_jobs.await_signal.enqueue(durable.runs, "never", 0.5)
    durable.workers(1, "--concurrency", "1")

    assert wait_until(lambda: early.status == "completed", 30), durable.explain()
    assert early.result == {"payload": {"early": True}}
    assert wait_until(lambda: parked.status == "parked", 30), durable.explain()
    other = durable_jobs.quick.enqueue(durable.runs, "meanwhile")
    assert wait_until(lambda: other.status == "completed", 30), durable.explain()
    assert parked.status == "parked", "a parked job held the only slot"
    assert wait_until(lambda: patient.status == "completed", 30), durable.explain()
    assert patient.result == {"raised": "SignalTimeout"}
    with pytest.raises(SignalRefused):
        patient.signal("never", "too late")

    assert parked.signal("approved", {"by": "ops"}) is True  # delivered: back in wait
    assert wait_until(lambda: parked.status == "completed", 30), durable.explain()
    assert parked.result == {"payload": {"by": "ops"}}
    for handle, runs in ((early, 1), (parked, 2), (patient, 2), (other, 1)):
        assert durable.queue.get_job(handle.id).attempts_made == 1, handle.id
        assert durable.runs_of(handle.id) == runs, handle.id



def kill_plans(rng: random.Random) -> list[list[str]]:
    """Where each job's runs die: lists of KILL_POINTS, one per run killed, RUNS runs in all.

    The first jobs die once at each point; the rest at random points, 0 to 3
    times. "after_commit" only while the row is not committed yet (a replay's
    block rolls back, and its on_commit never runs).
    """
    plans = [[point] for point in durable_jobs.KILL_POINTS]
    while sum(len(plan) + 1 for plan in plans) < RUNS:
        plan, committed = [], False
        for _ in range(rng.randint(0, 3)):
            point = rng.choice([point for point in durable_jobs.KILL_POINTS
                                if not (committed and point == "after_commit")])
            committed = committed or point in ("after_commit", "after_record")
            plan.append(point)
        plans.append(plan)
    return plans


def test_an_atomic_step_killed_at_random_points_over_200_runs_writes_one_row_per_job(durable):
    plans = kill_plans(random.Random())
    workers = durable.workers(6, "--concurrency", "1", respawn=True)
    handles = [durable_jobs.open_account.enqueue(durable.runs, plan) for plan in plans]
    assert wait_until(lambda: durable.all_completed(handles), 120), durable.explain()

    for handle, plan in zip(handles, plans):
        rows = list(User.objects.filter(last_name=handle.id).values_list("pk", flat=True))
        assert len(rows) == 1, (handle.id, plan, rows)
        assert DurableStep.objects.filter(job_id=handle.id, name="open").count() == 1
        committed = any(point in ("after_commit", "after_record") for point in plan)
        assert handle.result == {"pk": rows[0], "replayed": committed}, (plan, handle.result)
        assert durable.runs_of(handle.id) == len(plan) + 1, (handle.id, plan)
    kills = sum(len(plan) for plan in plans)
    assert workers.started >= 6 + kills, "each kill ended a worker process"
    print(f"\n{len(plans)} jobs, {kills + len(plans)} runs, {kills} killed: "
          f"{dict(Counter(point for plan in plans for point in plan))}")



def test_a_fan_out_of_500_resumes_its_parent_once_with_every_result_though_a_worker_was_killed(durable):
    workers = durable.workers(2, "--concurrency", "4")
    parent = durable_jobs.fan_parent.enqueue(durable.runs, FAN_OUT)
    assert wait_until(lambda: durable.queue.counts()["completed"] >= FAN_OUT // 3, 60), durable.explain()
    victim = random.choice(sorted(workers.alive))
    workers.kill(victim)

    assert wait_until(lambda: parent.status == "completed", 90), durable.explain()
    assert parent.result == [number * number for number in range(FAN_OUT)]
    assert durable.runs_of(parent.id) == 2, "the parent ran to its fan-out, then once more, resumed"
    assert durable.events("resumed", parent.id) == 1 and durable.events("completed", parent.id) == 1
    children = {job_id: int(count) for job_id, count in durable.queue.client.hgetall(durable.runs).items()
                if job_id != parent.id}
    assert len(children) == FAN_OUT, "the children were added once"
    assert any(count > 1 for count in children.values()), "the kill caught no child mid-run: it tested nothing"
    counts = durable.queue.counts()
    assert counts["parked"] == counts["wait"] == counts["active"] == counts["failed"] == 0, counts
