"""The long-running commands' signal handling: SIGTERM lands while the stop's Event is busy.

Python runs a signal handler on the main thread, between two of its steps. The
beat and the sweeper stop by setting an Event that their loop waits on; if the
loop were on the main thread, a signal landing while that wait held the
Event's lock would make the handler wait for the lock forever (echomq_beat
hung so once in CI). A Worker's run() waits on the main thread too, at
concurrency 1, while its loop runs beside it. Each test runs a child process of
its own and sends it real signals.
"""

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time
    from echomq_django.management.commands._options import run_stoppable

    stopping, stops = threading.Event(), []
    case = sys.argv[1]

    slow = threading.Lock()

    def stop():
        stops.append(threading.current_thread() is threading.main_thread())
        if case == "slow":
            with slow:  # a stop that takes a while, holding a lock: the next signal lands inside it
                print("in stop", flush=True)
                time.sleep(1)
        stopping.set()

    def work():
        if case == "busy":
            # The signal lands while the stop's Event is held, as inside an interrupted wait.
            with stopping._cond:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.2)
        elif case == "raises":
            raise LookupError("from the work")
        print("ready", flush=True)
        if case == "stuck":
            time.sleep(60)  # deaf to the first stop, as a call to a frozen Redis is
        stopping.wait(30)

    try:
        run_stoppable(work, stop, second_stop_grace_s=0.5)
    except LookupError as error:
        print(f"raised: {error}", flush=True)
    print(f"returned; handlers on the main thread: {stops}", flush=True)
""")


def child(case: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, case], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def output_of(script: str, *args: str, timeout_s: float = 10) -> tuple[str, str]:
    """What a child running `script` printed on stdout and stderr; stdout "hung" when it outlived the timeout."""
    process = subprocess.Popen([sys.executable, "-c", script, *args], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        return process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "hung", ""
    finally:
        process.kill()
        process.communicate()


def test_a_stop_signal_landing_while_its_event_is_held_does_not_hang():
    process = child("busy")
    try:
        out, err = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert out.splitlines() == ["ready", "returned; handlers on the main thread: [True]"]


def test_a_second_signal_leaves_a_work_that_does_not_stop_after_its_grace():
    process = child("stuck")
    try:
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        out, err = process.communicate(timeout=10)
        took = time.monotonic() - signalled
    finally:
        process.kill()
    assert process.returncode == 0, err  # SystemExit(0), while the work still slept
    assert out == "" and 0.4 < took < 5, f"left after {took:.1f} s (grace 0.5 s)"


def test_a_signal_landing_inside_the_stop_of_another_does_not_hang():
    process = child("slow")
    try:
        assert process.stdout.readline().strip() == "ready"
        process.send_signal(signal.SIGTERM)
        assert process.stdout.readline().strip() == "in stop"
        process.send_signal(signal.SIGTERM)  # its handler runs inside the first one's, which holds the lock
        out, err = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert out.splitlines()[0] == "in stop", "the second stop is made too, after the first"


def test_what_the_work_raises_is_raised_to_the_caller():
    out, err = child("raises").communicate(timeout=10)
    assert out.splitlines() == ["raised: from the work", "returned; handlers on the main thread: []"], err


# A worker run on the main thread by a script of its own, stopped by its own SIGTERM handler (as
# tests/worker_process.py is). At concurrency 1 run() waits there while its loop runs the job beside it;
# the wait's slices are made 0 so that the second SIGTERM lands inside that wait as often as can be.
WORKER_CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time
    import echomq_django.core.worker as worker_module
    from echomq_django.core import Queue, Worker, connect

    url, prefix, name = sys.argv[1:4]
    client = connect(url)
    queue = Queue(name, client, prefix=prefix)
    queue.add("long")
    started = threading.Event()
    worker_module.SIGNAL_CHECK_S = 0
    worker = Worker(name, lambda job: started.set() or time.sleep(30), client, prefix=prefix, block_timeout_s=0.2)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop())

    def stop_twice():
        started.wait(10)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not worker._stopping.is_set() and time.monotonic() < deadline:
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_twice, daemon=True).start()
    print("returned", worker.run(), flush=True)
""")


def test_a_second_sigterm_landing_in_runs_wait_for_its_loop_does_not_hang(redis_url, prefix):
    for attempt in range(5):
        out, err = output_of(WORKER_CHILD, redis_url, prefix, f"q{attempt}")
        assert out.strip() == "returned 0", f"attempt {attempt}: {out} {err[-2000:]}"


# A script's own runner, stopped by its own SIGTERM handler, in bursts: the handlers land on the main
# thread inside the runner's waits, inside stop() itself, inside run()'s end (see core/stopping.py).
RUNNER_CHILD = textwrap.dedent("""
    import os, random, signal, sys, threading, time
    from echomq_django.core import Beat, Queue, Sweeper, Worker, connect

    url, prefix, kind, name = sys.argv[1:5]
    client = connect(url)
    started = threading.Event()
    if kind.startswith("worker"):
        Queue(name, client, prefix=prefix).add("long")
        runner = Worker(name, lambda job: started.set() or time.sleep(30), client, prefix=prefix,
                        concurrency=int(kind[-1]))
    elif kind == "sweeper":
        runner = Sweeper(client, [name], prefix=prefix, interval_ms=30_000)
    else:
        runner = Beat(client, lambda: started.set() or [], prefix=prefix, reload_interval_ms=30_000)
    signal.signal(signal.SIGTERM, lambda *_: runner.stop())

    def burst():
        if kind != "sweeper":
            started.wait(10)
        time.sleep(0.05)  # in its wait
        for _ in range(random.randint(2, 20)):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(random.random() * 0.002)

    threading.Thread(target=burst, daemon=True).start()
    runner.run()
    print("returned", flush=True)
""")


@pytest.mark.parametrize("kind", ["worker1", "worker3", "sweeper", "beat"])
def test_a_runner_stopped_by_a_burst_of_its_own_sigterm_handler_returns(redis_url, prefix, kind):
    for attempt in range(3):
        out, err = output_of(RUNNER_CHILD, redis_url, prefix, kind, f"q{attempt}")
        assert out.splitlines() == ["returned"], f"attempt {attempt}: {out} {err[-2000:]}"


# A caller that catches the KeyboardInterrupt of a Ctrl-C and lives on (a shell, a notebook), and a
# second Ctrl-C that lands in the cleanup the first began (injected there: the window is a few µs):
# the cleanup must still end the worker's renewals, else the jobs it left are never recovered.
CTRL_C_CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time
    from echomq_django.core import Queue, Worker, connect

    url, prefix, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = connect(url)
    queue = Queue("q", client, prefix=prefix)
    for _ in range(concurrency):
        queue.add("long")
    running = threading.Semaphore(0)
    worker = Worker("q", lambda job: running.release() or time.sleep(5), client, prefix=prefix,
                    concurrency=concurrency, lock_duration_ms=400)
    close = worker._close

    def close_hit_by_a_second_ctrl_c():
        if threading.current_thread() is threading.main_thread():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)  # its handler runs here
        close()

    worker._close = close_hit_by_a_second_ctrl_c

    def first_ctrl_c():
        for _ in range(concurrency):
            running.acquire()
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=first_ctrl_c, daemon=True).start()
    interrupts = 0
    try:
        try:
            worker.run()
        except KeyboardInterrupt:
            interrupts += 1
    except KeyboardInterrupt:
        interrupts += 1
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(thread.name == "echomq-renew" for thread in threading.enumerate()):
        time.sleep(0.01)
    renewing = any(thread.name == "echomq-renew" for thread in threading.enumerate())
    print(interrupts, "renewing" if renewing else "left to the sweeper", flush=True)
""")


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_second_ctrl_c_in_runs_cleanup_still_leaves_the_jobs_to_the_sweeper(redis_url, prefix, concurrency):
    out, err = output_of(CTRL_C_CHILD, redis_url, prefix, str(concurrency), timeout_s=20)
    assert out.strip() == "1 left to the sweeper", err[-2000:]
