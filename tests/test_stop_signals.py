"""The long-running commands' signal handling: SIGTERM lands while the stop's Event is busy.

Python runs a signal handler on the main thread, between two of its steps. The
beat and the sweeper stop by setting an Event that their loop waits on; if the
loop were on the main thread, a signal landing while that wait held the
Event's lock would make the handler wait for the lock forever (echomq_beat
hung so once in CI). Each test runs a child process of its own and sends it
real signals.
"""

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time
    from echomq_django.management.commands._options import run_stoppable

    stopping, stops = threading.Event(), []
    case = sys.argv[1]

    def stop():
        stops.append(threading.current_thread() is threading.main_thread())
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


def test_what_the_work_raises_is_raised_to_the_caller():
    out, err = child("raises").communicate(timeout=10)
    assert out.splitlines() == ["raised: from the work", "returned; handlers on the main thread: []"], err
