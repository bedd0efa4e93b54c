"""core.stopping: the flags and the cleanup that signal handlers land in.

The signal cases run in a child process of their own: a Flag that deadlocks,
or a Ctrl-C that escapes, must fail the test, not hang or end the test run.
"""

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from echomq_django.core.stopping import Flag, TwoStages

ROOT = Path(__file__).resolve().parents[1]


def run_child(code: str, timeout_s: float = 30) -> str:
    process = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                             text=True, timeout=timeout_s)
    assert process.returncode == 0, process.stderr[-2000:]
    return process.stdout.strip()


def test_a_flag_set_by_a_signal_handler_on_its_waiting_thread_wakes_that_wait():
    # A timer's SIGALRM lands 1-60 µs into the wait, at any of its steps; the handler sets the flag.
    # An Event's lock deadlocks the handler there; a Condition on a reentrant lock slept on after
    # about 1 in 100. (A signal just before the wait blocks in C is handled only once it ends, as
    # in any wait of Python's: not counted here, the handler ran late, not the wait.)
    out = run_child("""
        import random, signal, time
        from echomq_django.core.stopping import Flag

        flag, set_at, late = Flag(), [], 0
        signal.signal(signal.SIGALRM, lambda *_: set_at.append(time.monotonic()) or flag.set())
        for _ in range(3000):
            flag.clear()
            set_at.clear()
            signal.setitimer(signal.ITIMER_REAL, random.uniform(1e-6, 60e-6))
            flag.wait(0.2)
            late += bool(set_at) and time.monotonic() - set_at[0] > 0.1
        print(late)
    """)
    assert out == "0", f"{out} of 3000 waits slept on after the handler set the flag"


def test_a_flag_wakes_every_waiting_thread_and_times_out_like_an_event():
    flag = Flag()
    assert flag.wait(0) is False and flag.wait(-1) is False
    started = time.monotonic()
    assert flag.wait(0.05) is False and time.monotonic() - started >= 0.05
    woken: list[bool] = []
    waiters = [threading.Thread(target=lambda: woken.append(flag.wait(10))) for _ in range(8)]
    for waiter in waiters:
        waiter.start()
    while len(flag._waiters) < 8:
        time.sleep(0.001)
    flag.set()
    flag.clear()  # at once: woken waits still say True, as an Event's do
    for waiter in waiters:
        waiter.join(5)
    assert woken == [True] * 8
    assert not flag.is_set() and not flag._waiters
    flag.set()
    assert flag.wait() is True and flag.wait(0) is True


def test_two_stages_count_every_stop_once_across_threads():
    stages = TwoStages()
    later: list[bool] = []
    threads = [threading.Thread(target=lambda: later.append(stages.stop())) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert later.count(False) == 1 and len(later) == 50
    assert stages.stopping.is_set() and stages.aborted.is_set()


def test_within_one_ctrl_c_the_first_raises_and_the_later_ones_do_not_cut_the_cleanup():
    out = run_child("""
        import os, signal, time
        from echomq_django.core.stopping import one_ctrl_c

        steps = []
        try:
            with one_ctrl_c():
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(5)  # the first: cut short
                finally:
                    for step in range(3):  # the cleanup the first began: the later ones land in it
                        os.kill(os.getpid(), signal.SIGINT)
                        time.sleep(0.05)
                        steps.append(step)
        except KeyboardInterrupt:
            print("raised once, cleaned up", steps)
        print("Python's own again:", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    """)
    assert out.splitlines() == ["raised once, cleaned up [0, 1, 2]", "Python's own again: True"]


def test_within_one_ctrl_c_a_ctrl_c_after_the_grace_raises_again():
    out = run_child("""
        import os, signal, time
        from echomq_django.core import stopping

        stopping.CLEANUP_GRACE_S = 0.2
        raised = 0
        with stopping.one_ctrl_c():
            for _ in range(2):
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.05)  # the handler runs here
                except KeyboardInterrupt:
                    raised += 1
                time.sleep(0.5)  # past the grace: the next one is not dropped
        print(raised)
    """)
    assert out == "2"
