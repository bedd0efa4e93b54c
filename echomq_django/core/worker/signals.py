"""The one place that handles signals: run workers, sweepers and beats until signalled, and a child's.

A signal handler runs on the main thread between two of its steps, maybe
while that thread holds a lock the handler would need. So the handlers here
do nothing at all: `signal.set_wakeup_fd` has the interpreter write the
signal's number to a socket before any handler runs, and the main thread,
waiting on that socket in ordinary code, calls `stop()` on the first signal
and `abort()` on the second. `Worker`, `Sweeper` and `Beat` are therefore
only thread-safe (their `stop()` takes locks and logs); a script that runs
one and wants the two stages on its signals calls `run_until_signalled`.
"""

from __future__ import annotations

import select
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How long a worker has after the second signal to write the results it holds before
# run_until_signalled returns without them (its running jobs are left to the sweeper either way).
SECOND_STOP_GRACE_S = 2.0
_RETURNED = b"\0"  # written by a runner's thread when its run() has returned (no signal is numbered 0)


class Runner(Protocol):
    """What run_until_signalled runs: a Worker, a Sweeper, a Beat, or anything with these three."""

    def run(self) -> Any: ...

    def stop(self) -> None: ...  # finish what is running, start nothing new

    def abort(self) -> None: ...  # leave now: running jobs go to the sweeper


def _record(signum: int, frame: Any) -> None:
    """The stop signals' Python handler: nothing (a wake-up fd, where there is one, recorded the signal)."""


class RecordedSignals:
    """SIGINT and SIGTERM recorded, not acted on, from its `with` on: read by run_until_signalled.

    Entered early (a command's start-up), a signal that lands before the
    runners start is not lost, nor does it kill the process half set up:
    run_until_signalled acts on it as soon as they run.
    """

    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)  # the interpreter's write from a signal must never block
        self._before_fd: int | None = None
        self._before: dict[int, Any] = {}

    def __enter__(self) -> RecordedSignals:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("signals can be recorded on the main thread only, where Python handles them")
        # A handler from before (Ctrl-C's KeyboardInterrupt, a SIGTERM handler that exits) may raise
        # between any two steps, here and in __exit__. Ours go in first, SIGINT's first: once both are
        # in, no stop signal raises, so the wake-up fd set last is always undone (left behind, the
        # interpreter would write signal numbers into whatever file later gets its number). A signal
        # in the microseconds between the handlers and the fd is not recorded.
        try:
            for signum in STOP_SIGNALS:
                self._before[signum] = signal.getsignal(signum)
                signal.signal(signum, _record)
            self._before_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._before_fd is not None:
            signal.set_wakeup_fd(self._before_fd)
        self._read.close()
        self._write.close()
        self._restore(list(self._before))

    def _restore(self, signums: list[int]) -> None:
        """The handlers from before, SIGINT's last, each restored even if one restored earlier raises."""
        if signums:
            try:
                signal.signal(signums[-1], self._before[signums[-1]])
            finally:
                self._restore(signums[:-1])

    def returned(self) -> None:
        """Wake the reader: a runner's run() has returned (called on that runner's thread)."""
        try:
            self._write.send(_RETURNED)
        except OSError:  # closed: the reader left already (after a second signal's grace)
            pass

    def wait(self, timeout: float | None) -> list[int]:
        """The signals recorded since the last call, waiting up to `timeout` for one or a runner's return."""
        if not select.select([self._read], [], [], timeout)[0]:
            return []
        return [byte for byte in self._read.recv(64) if byte in STOP_SIGNALS]


def run_until_signalled(*runners: Runner, grace_s: float = SECOND_STOP_GRACE_S,
                        recorded: RecordedSignals | None = None) -> list[Any]:
    """Run each runner's run() on a thread of its own until every one returns; return what each returned.

    The first SIGINT or SIGTERM calls every runner's stop(), the second their
    abort(); `grace_s` after the second this returns even if some run() has
    not (a call waiting out a Redis outage would hold the exit for minutes),
    leaving its daemon thread behind. What a run() raised, or a stop() or an
    abort() (the other runners are still told), is raised here once every
    runner has returned; a run() that raises stops the others, as a first
    signal would. Call it on the main thread (Python handles
    signals there only); the handlers from before come back when it returns.
    `recorded`: signals recorded since earlier (a command's start-up), acted on first.
    """
    if recorded is None:
        with RecordedSignals() as own:
            return run_until_signalled(*runners, grace_s=grace_s, recorded=own)
    results: list[Any] = [None] * len(runners)
    raised: list[BaseException] = []
    returned: list[int] = []  # the runners whose run() has returned, noted before the byte that says so

    def run(index: int, runner: Runner) -> None:
        try:
            results[index] = runner.run()
        except BaseException as error:  # raised on the main thread below
            raised.append(error)
        finally:
            # Noted first: the main thread that reads the byte may find this thread still alive
            # (it is ending), and must not wait on for a byte that will not come.
            returned.append(index)
            recorded.returned()

    threads = [threading.Thread(target=run, args=(index, runner), name=f"echomq-{type(runner).__name__.lower()}",
                                daemon=True) for index, runner in enumerate(runners)]
    for thread in threads:
        thread.start()
    _wait(returned, runners, recorded, grace_s, raised)
    if raised:
        raise raised[0]
    return results


def _wait(returned: list[int], runners: tuple[Runner, ...], recorded: RecordedSignals, grace_s: float,
          raised: list[BaseException]) -> None:
    """Until every run() has `returned`, or `grace_s` after a second signal: stop them, then abort them."""
    received = 0
    deadline: float | None = None
    while len(returned) < len(runners):
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            return
        stages = len(recorded.wait(timeout))
        if raised and received == 0:
            # A run() that raised is a first stop for the others: a process whose worker crashed must
            # not sit on, its sweeper sweeping, until someone signals it (the error is raised once they return).
            stages = max(stages, 1)
        for _ in range(stages):
            received += 1
            if received > 2:
                continue
            for runner in runners:
                try:
                    runner.stop() if received == 1 else runner.abort()
                except Exception as error:  # the others must still be told; raised once every run() returned
                    raised.append(error)
            if received == 2:
                deadline = time.monotonic() + grace_s


# -- in a child process of the processes pool (see child_side.py) ------------------------------

SOFT_LIMIT_SIGNAL = signal.SIGUSR1  # what the worker sends a child whose job reached its soft time limit


def leave_stop_signals_to_the_parent() -> None:
    """Make SIGINT and SIGTERM do nothing in this child, and let them through (they came blocked).

    The worker decides what a stop does to its children's jobs. A handler that
    does nothing, not SIG_IGN, which a process the job starts would inherit
    (exec resets a handler, not an ignored signal).
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, _record)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(STOP_SIGNALS))


def on_soft_limit_signal(handler: Callable[[int, Any], None]) -> None:
    """Call `handler` in this child when its job reaches its soft limit (it raises SoftTimeLimitExceeded in the job)."""
    signal.signal(SOFT_LIMIT_SIGNAL, handler)
