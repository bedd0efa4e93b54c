"""core.signals.run_until_signalled: signals recorded by a handler that does nothing, acted on by the main thread.

Each case runs a child process of its own and sends it real signals, in bursts
where the old design hung: handlers landing inside a stop(), inside a wait,
inside the end of run().
"""

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from echomq_django.core import run_until_signalled

ROOT = Path(__file__).resolve().parents[2]

# A runner whose run() waits for its stop (or, "deaf", ignores it as a call to a frozen Redis would),
# whose stop() takes a lock and logs, as Worker's may, and which reports who called what.
CHILD = textwrap.dedent("""
    import logging, os, random, signal, sys, threading, time
    from echomq_django.core import run_until_signalled

    logging.basicConfig(level=logging.INFO)
    case, count = sys.argv[1], int(sys.argv[2])

    class Runner:
        def __init__(self):
            self.stopping, self.aborted, self.lock = threading.Event(), threading.Event(), threading.Lock()
            self.calls = []
            self.started = threading.Event()

        def run(self):
            self.started.set()
            if case == "raises":
                raise LookupError("from run")
            if case == "deaf":
                time.sleep(60)
            (self.aborted if case == "finishing" else self.stopping).wait(30)
            return case

        def stop(self):
            with self.lock:
                logging.info("stop")
                self.calls.append(("stop", threading.current_thread() is threading.main_thread()))
                time.sleep(0.01)  # the next signal of a burst lands in here
                self.stopping.set()

        def abort(self):
            with self.lock:
                self.calls.append(("abort", threading.current_thread() is threading.main_thread()))
                self.aborted.set()

    runners = [Runner(), Runner()]

    def burst():
        for runner in runners:
            runner.started.wait(10)
        time.sleep(0.05)
        for n in range(count):
            os.kill(os.getpid(), random.choice([signal.SIGTERM, signal.SIGINT]))
            if n < 2:
                # Two signals of a kind pending at once are one (the kernel keeps one of each): the first two
                # wait until their stage reached a runner (its call is recorded as it starts, so the next
                # signal still lands inside it); CI on a loaded machine merged them and the child hung.
                stage = ("stop", "abort")[n]
                deadline = time.monotonic() + 10
                while not any(call[0] == stage for runner in runners for call in runner.calls) \
                        and time.monotonic() < deadline:
                    time.sleep(0.001)
            else:
                time.sleep(random.random() * 0.003)

    # The burst goes on after run_until_signalled returned: its handlers restored, a default
    # one would kill this process (SIGTERM) or raise in it (SIGINT) before it reports.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: None)
    threading.Thread(target=burst, daemon=True).start()
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM), signal.set_wakeup_fd(-1)
    started = time.monotonic()
    try:
        print("returned", run_until_signalled(*runners, grace_s=0.5), flush=True)
    except LookupError as error:
        print("raised", error, flush=True)
    print("calls", [runner.calls for runner in runners], flush=True)
    print("restored", before == (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM),
                                 signal.set_wakeup_fd(-1)), flush=True)
""")


def run_child(case: str, signals: int, timeout_s: float = 30) -> dict[str, str]:
    """The child's lines, keyed by their first word; {"hung": ...} when it outlived the timeout."""
    process = subprocess.Popen([sys.executable, "-c", CHILD, case, str(signals)], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return {"hung": process.communicate()[1][-2000:]}
    lines = dict(line.split(" ", 1) for line in out.splitlines() if " " in line)
    return {**lines, "stderr": err[-2000:]}


@pytest.mark.slow
def test_one_signal_stops_every_runner_once_from_the_main_thread():
    lines = run_child("stopping", 1)
    assert lines.get("returned") == "['stopping', 'stopping']", lines
    assert lines["calls"] == "[[('stop', True)], [('stop', True)]]", lines
    assert lines["restored"] == "True"


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(5))
def test_a_burst_of_signals_stops_then_aborts_every_runner_once(attempt):
    lines = run_child("finishing", 2 + attempt * 7)  # "finishing" runners return only on abort()
    assert lines.get("returned") == "['finishing', 'finishing']", lines
    assert lines["calls"] == "[[('stop', True), ('abort', True)], [('stop', True), ('abort', True)]]", lines
    assert lines["restored"] == "True"


@pytest.mark.slow
def test_a_runner_deaf_to_its_abort_is_left_behind_after_the_grace():
    lines = run_child("deaf", 2)
    assert lines.get("returned") == "[None, None]", lines  # their run() never returned
    assert lines["restored"] == "True"


@pytest.mark.slow
def test_what_a_run_raises_is_raised_to_the_caller():
    lines = run_child("raises", 0)
    assert lines.get("raised") == "from run", lines


def test_it_refuses_to_run_off_the_main_thread():
    refused: list[BaseException] = []

    def call() -> None:
        try:
            run_until_signalled()
        except RuntimeError as error:
            refused.append(error)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert refused and "main thread" in str(refused[0])


def test_no_runner_returns_at_once_and_restores_the_handlers():
    before = signal.getsignal(signal.SIGTERM)
    assert run_until_signalled() == []
    assert signal.getsignal(signal.SIGTERM) is before


# Found: signals.py _wait: it waited while a runner's thread was alive, and a thread sends its "returned"
# byte before it ends: the main thread that read the byte could still find it alive and wait on
# for a byte that never came (run() returning at once hung within a few hundred calls).
INSTANT = textwrap.dedent("""
    import sys
    from echomq_django.core import run_until_signalled

    class Instant:
        def run(self):
            return "ran"

        def stop(self):
            pass

        def abort(self):
            pass

    for _ in range(int(sys.argv[1])):
        assert run_until_signalled(Instant()) == ["ran"]
    print("done", flush=True)
""")


@pytest.mark.slow
def test_a_run_that_returns_at_once_never_leaves_it_waiting():
    process = subprocess.Popen([sys.executable, "-c", INSTANT, "2000"], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=60)  # 2,000 calls take about a second
    except subprocess.TimeoutExpired:
        process.kill()  # SIGKILL: its SIGTERM would only be recorded
        process.communicate()
        pytest.fail("run_until_signalled waited on after its runner's run() had returned")
    assert out == "done\n", err[-2000:]


# Found: signals.py _wait: a stop() that raised went straight out of run_until_signalled: the runners
# after it were never stopped, and the caller's exit killed their threads mid-job.
RAISING_STOP = textwrap.dedent("""
    import os, signal, threading
    from echomq_django.core import run_until_signalled

    class Runner:
        def __init__(self, fails):
            self.fails, self.started, self.stopping, self.calls = fails, threading.Event(), threading.Event(), []

        def run(self):
            self.started.set()
            self.stopping.wait(30)
            return "stopped" if self.stopping.is_set() else "never stopped"

        def stop(self):
            self.calls.append("stop")
            self.stopping.set()
            if self.fails:
                raise LookupError("from stop")

        def abort(self):
            self.calls.append("abort")

    runners = [Runner(fails=True), Runner(fails=False)]

    def signal_once_running():  # their run() started: run_until_signalled's handler is in
        for runner in runners:
            runner.started.wait(30)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_once_running, daemon=True).start()
    try:
        run_until_signalled(*runners)
    except LookupError as error:
        print("raised", error, flush=True)
    print("calls", [runner.calls for runner in runners], flush=True)
""")


def test_a_stop_that_raises_still_stops_the_other_runners_and_is_raised_once_they_returned():
    result = subprocess.run([sys.executable, "-c", RAISING_STOP], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.stdout == "raised from stop\ncalls [['stop'], ['stop']]\n", result.stderr[-2000:]


# Found (hostile test of issue 25): signals.py run_until_signalled: a run() that raised was kept until
# every other runner returned, and they were never told: a script running a worker and a sweeper whose
# worker crashed sat there, sweeping, with nothing logged, until someone signalled it.
ONE_RAISES = textwrap.dedent("""
    import threading
    from echomq_django.core import run_until_signalled

    class Crashing:
        def run(self):
            raise LookupError("from run")

        def stop(self):
            pass

        def abort(self):
            pass

    class Waiting:
        def __init__(self):
            self.stopped, self.calls = threading.Event(), []

        def run(self):
            self.stopped.wait(20)
            return "stopped" if self.stopped.is_set() else "never stopped"

        def stop(self):
            self.calls.append("stop")
            self.stopped.set()

        def abort(self):
            self.calls.append("abort")
            self.stopped.set()

    waiting = Waiting()
    try:
        run_until_signalled(Crashing(), waiting)
    except LookupError as error:
        print("raised", error, flush=True)
    print("calls", waiting.calls, flush=True)
""")


def test_a_run_that_raises_stops_the_other_runners_and_is_raised_once_they_returned():
    result = subprocess.run([sys.executable, "-c", ONE_RAISES], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)  # the other runner gives up after 20 s: a hang fails, not blocks
    assert result.stdout == "raised from run\ncalls ['stop']\n", result.stderr[-2000:]


# Found (hostile test of issue 25): the handler from before (Ctrl-C's KeyboardInterrupt) raising
# between two steps of RecordedSignals' enter or exit left the wake-up fd set to a socket about to be
# closed (the interpreter then writes signal numbers into whatever file reuses its number: a Redis
# connection) or one of its do-nothing handlers in place (Ctrl-C ignored from then on).
ENTERED_UNDER_FIRE = textwrap.dedent("""
    import signal, sys
    from echomq_django.core import RecordedSignals

    class Interrupt(Exception):
        pass

    armed = False

    def interrupt(signum, frame):  # raises once per arming, as Ctrl-C's default handler would
        global armed
        if armed:
            armed = False
            raise Interrupt

    signal.signal(signal.SIGINT, interrupt)
    interrupted = left_behind = 0
    print("ready", flush=True)
    for _ in range(int(sys.argv[1])):
        try:
            armed = True
            with RecordedSignals():
                pass
            armed = False
        except Interrupt:
            interrupted += 1
        wakeup_fd = signal.set_wakeup_fd(-1)
        if wakeup_fd != -1 or (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) \\
                != (interrupt, signal.SIG_DFL):
            left_behind += 1
            signal.signal(signal.SIGINT, interrupt)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(interrupted, left_behind, flush=True)
""")


@pytest.mark.slow
def test_an_interrupt_inside_recorded_signals_leaves_no_wakeup_fd_nor_handler_behind():
    child = subprocess.Popen([sys.executable, "-c", ENTERED_UNDER_FIRE, "20000"], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        sent = 0
        while child.poll() is None:  # SIGINTs at random moments of the child's 20,000 rounds
            try:
                os.kill(child.pid, signal.SIGINT)
            except ProcessLookupError:
                break
            sent += 1
            time.sleep(random.uniform(0, 0.0003))
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    interrupted, left_behind = map(int, out.split())
    assert interrupted > 100, (sent, out, err[-2000:])  # the enters and exits were under fire
    assert left_behind == 0, (sent, out, err[-2000:])
