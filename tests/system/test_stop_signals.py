"""Real runners and the real commands under bursts of SIGTERM and SIGINT, through run_until_signalled.

The signals are handled in one place (core/worker/signals.py): a handler that does
nothing, and stop() then abort() called by the main thread. Each case runs a
process of its own and sends it real signals, in bursts that land inside
stop(), inside the runners' waits and inside the ends of their run().
"""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from echomq_django.core import Queue, connect
from echomq_django.core.reading.metrics import totals
from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
# How many runs each burst test makes: a few in the suite; ECHOMQ_SIGNAL_RUNS=50 for the stress run.
RUNS = int(os.environ.get("ECHOMQ_SIGNAL_RUNS", "3"))
pytestmark = pytest.mark.timeout(180 * max(1, RUNS // 3))  # a few seconds at 3 runs, more where Django starts slowly


def output_of(script: str, *args: str, timeout_s: float = 20) -> tuple[str, str]:
    """What a child running `script` printed on stdout and stderr; stdout "hung" when it outlived the timeout,
    and stderr then every thread's stack (faulthandler, on the SIGABRT that ends it)."""
    process = subprocess.Popen([sys.executable, "-c", script, *args], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        return process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        try:
            return "hung", process.communicate(timeout=10)[1]
        except subprocess.TimeoutExpired:
            return "hung", ""
    finally:
        process.kill()
        process.communicate()


# A script's own runner, run by run_until_signalled, and a burst of its own signals (one alone: the first stage).
RUNNER_CHILD = textwrap.dedent("""
    import os, random, signal, sys, threading, time
    from echomq_django.core import (Beat, Queue, RecordedSignals, Sweeper, Worker, WorkerOptions, connect,
                                    run_until_signalled)

    url, prefix, kind, name, count = sys.argv[1:6]
    client = connect(url)
    started = threading.Event()
    seconds = 0.5 if count == "1" else 30  # one signal: the running job finishes; a burst: it is left
    if kind.startswith("worker"):
        queue = Queue(name, client, prefix=prefix)
        runner = Worker(name, lambda job: started.set() or time.sleep(seconds), client,
                        WorkerOptions(prefix=prefix, concurrency=int(kind[-1])))
        queue.add("long")
    elif kind == "sweeper":
        runner = Sweeper(client, [name], prefix=prefix, interval_ms=30_000)
    else:
        runner = Beat(client, lambda: started.set() or [], prefix=prefix, reload_interval_ms=30_000)

    # Two signals of a kind pending at once are one (the kernel keeps one of each): the first two wait until
    # their stage reached the runner (noted as its call starts, so the next signal still lands inside it).
    reached = [threading.Event(), threading.Event()]
    for stage, event in zip(("stop", "abort"), reached):
        def noting(call=getattr(runner, stage), event=event):
            event.set()
            return call()
        setattr(runner, stage, noting)

    def burst():
        if kind != "sweeper":
            started.wait(10)
        time.sleep(0.05)  # in its wait
        for n in range(int(count)):
            os.kill(os.getpid(), random.choice([signal.SIGTERM, signal.SIGINT]))
            if n < 2:
                reached[n].wait(10)
            else:
                time.sleep(random.random() * 0.002)

    # Recorded until the burst has ended, so that none lands on the process's own handlers afterwards.
    with RecordedSignals() as recorded:
        bursting = threading.Thread(target=burst, daemon=True)
        bursting.start()
        run_until_signalled(runner, recorded=recorded)
        bursting.join()
    if kind.startswith("worker"):
        print("returned", queue.counts()["completed"], flush=True)
    else:
        print("returned", flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["worker1", "worker3", "sweeper", "beat"])
def test_a_runner_stopped_by_a_burst_of_signals_returns_and_leaves_its_job(redis_url, prefix, kind):
    for attempt in range(RUNS):
        out, err = output_of(RUNNER_CHILD, redis_url, prefix, kind, f"q{attempt}", str(random.randint(2, 20)))
        expected = ["returned 0"] if kind.startswith("worker") else ["returned"]  # the 30 s job left running
        assert out.splitlines() == expected, f"attempt {attempt}: {out} {err[-8000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["worker1", "worker3"])
def test_one_signal_lets_the_running_job_finish(redis_url, prefix, kind):
    out, err = output_of(RUNNER_CHILD, redis_url, prefix, kind, "q", "1")
    assert out.splitlines() == ["returned 1"], err[-2000:]


# A script that runs a worker on its main thread and gets a Ctrl-C (Python's KeyboardInterrupt) there:
# it is raised, and the worker's renewals end, so that the jobs it left are recovered by the sweeper.
CTRL_C_CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time
    from echomq_django.core import Queue, Worker, WorkerOptions, connect

    url, prefix, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = connect(url)
    queue = Queue("q", client, prefix=prefix)
    for _ in range(concurrency):
        queue.add("long")
    running = threading.Semaphore(0)
    worker = Worker("q", lambda job: running.release() or time.sleep(5), client,
                    WorkerOptions(prefix=prefix, concurrency=concurrency, lock_duration_ms=400))

    def ctrl_c():
        for _ in range(concurrency):
            running.acquire()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    try:
        worker.run()
        print("returned", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(thread.name == "echomq-renew" for thread in threading.enumerate()):
        time.sleep(0.01)
    renewing = any(thread.name == "echomq-renew" for thread in threading.enumerate())
    print("renewing" if renewing else "left to the sweeper", flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_ctrl_c_in_run_raises_and_leaves_the_jobs_to_the_sweeper(redis_url, prefix, concurrency):
    out, err = output_of(CTRL_C_CHILD, redis_url, prefix, str(concurrency), timeout_s=30)
    assert out.splitlines() == ["interrupted", "left to the sweeper"], err[-2000:]


# -- the commands, on a Redis of their own that a run may stop (an outage) -----------------------

# The worker runs the demo's real jobs (queue "demo": lock 3 s, a sweep every 2 s), and every run of it adds some.
COMMANDS = {"worker": ["echomq_worker", "--queue", "demo", "--concurrency", "3"],
            "sweep": ["echomq_sweep", "--queue", "demo"], "beat": ["echomq_beat"]}
JOBS_PER_RUN = 8
SLOW = "demo_project.demo_app.jobs.slow"


def run_until(env: dict[str, str], queue: Queue, done: Callable[[], bool], deadline_s: float) -> bool:
    """Run a worker and a sweeper command on `queue` until `done()` or the deadline; True when done."""
    commands = [subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) for args in (COMMANDS["worker"], COMMANDS["sweep"])]
    try:
        deadline = time.monotonic() + deadline_s
        while not done() and time.monotonic() < deadline:
            time.sleep(0.1)
        return done()
    finally:
        for process in commands:
            process.kill()
            process.wait()


@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_exits_under_bursts_of_signals_also_during_an_outage(subprocess_env, prefix, command):
    """Every run exits 0 after a random burst, whether Redis answers or not (every other run stops it).

    The worker's runs take real jobs as the signals land; afterwards a worker
    and a sweeper finish what the runs left, and every job has completed
    once: none lost, none finished twice, and a job started again only after
    a sweep recovered it from a run that left it (the second stage).
    """
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")  # an outage loses nothing
    server.start()
    env = {**subprocess_env, "ECHOMQ_REDIS_URL": server.url}
    queue = Queue("demo", connect(server.url), prefix=prefix)
    ids: list[str] = []
    stopped_in_time = 0
    try:
        for attempt in range(RUNS):
            outage = attempt % 2 == 1
            if command == "worker":
                ids += [queue.add(SLOW, {"args": [random.choice([0.005, 0.05, 0.3])], "kwargs": {}})
                        for _ in range(JOBS_PER_RUN)]
            process = subprocess.Popen([sys.executable, "manage.py", *COMMANDS[command]], cwd=ROOT, env=env,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                assert process.stdout is not None
                assert process.stdout.readline(), "no start-up line"  # after it the signals' handling is in place
                time.sleep(random.random() * 0.3)  # not a synchronisation: the burst lands at a random moment
                if outage:
                    server.stop()
                for _ in range(random.randint(1, 12)):
                    process.send_signal(random.choice([signal.SIGTERM, signal.SIGINT]))
                    time.sleep(random.random() * 0.01)
                process.send_signal(signal.SIGTERM)  # two at least: leave now
                code = process.wait(timeout=60)
                # 0, or the default action of a signal that landed once the command had stopped and given the
                # process's handlers back (nothing of it runs by then: the burst outlived it).
                assert code in (0, -signal.SIGINT, -signal.SIGTERM), \
                    f"attempt {attempt} (outage: {outage}) exited {code}: {process.stdout.read()}"
                stopped_in_time += code == 0
            finally:
                process.kill()
                process.communicate()
                if outage:
                    server.start()
        if command == "worker":
            assert run_until(env, queue, lambda: queue.counts()["completed"] >= len(ids), deadline_s=120), \
                f"{queue.counts()} of {len(ids)} jobs"
            with queue.client.pipeline(transaction=False) as pipe:
                for job_id in ids:
                    pipe.hmget(queue.keys.job(job_id), "ats", "atm", "stc")
                counters = dict(zip(ids, pipe.execute()))
            states = {job_id: queue.get_state(job_id) for job_id in ids}
            lost = [job_id for job_id, state in states.items() if state != "completed"]
            # A recovery counts an attempt (atm) and a stall (stc); a start (ats) beyond the first needs one.
            twice = {job_id: c for job_id, c in counters.items() if not int(c[0]) == int(c[1]) == 1 + int(c[2] or 0)}
            assert not lost and not twice, f"lost: {lost}; (ats, atm, stc) off: {twice}"
            assert queue.counts()["completed"] == totals(queue)["completed"] == len(ids), "a job finished twice"
            recovered = sum(int(c[2] or 0) for c in counters.values())
            print(f"{len(ids)} jobs completed once each, {recovered} of them after a sweep recovered them")
    finally:
        server.stop()
        server.workdir.cleanup()
    print(f"{stopped_in_time} of {RUNS} runs exited 0 (the others after the burst outlived them)")
