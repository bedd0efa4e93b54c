"""The one place that handles SIGINT and SIGTERM: run workers, sweepers and beats until signalled.

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
    """The signals' Python handler: nothing (the wake-up fd has recorded the signal already)."""


def run_until_signalled(*runners: Runner, grace_s: float = SECOND_STOP_GRACE_S) -> list[Any]:
    """Run each runner's run() on a thread of its own until every one returns; return what each returned.

    The first SIGINT or SIGTERM calls every runner's stop(), the second their
    abort(); `grace_s` after the second this returns even if some run() has
    not (a call waiting out a Redis outage would hold the exit for minutes),
    leaving its daemon thread behind. What a run() raised, or a stop() or an
    abort() (the other runners are still told), is raised here once every
    runner has returned. Call it on the main thread (Python handles
    signals there only); the handlers from before come back when it returns.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("run_until_signalled must be called on the main thread, where Python handles signals")
    results: list[Any] = [None] * len(runners)
    raised: list[BaseException] = []
    returned: list[int] = []  # the runners whose run() has returned, noted before the byte that says so
    wake_read, wake_write = socket.socketpair()
    wake_write.setblocking(False)  # the interpreter's write from a signal must never block

    def run(index: int, runner: Runner) -> None:
        try:
            results[index] = runner.run()
        except BaseException as error:  # raised on the main thread below
            raised.append(error)
        finally:
            # Noted first: the main thread that reads the byte may find this thread still alive
            # (it is ending), and must not wait on for a byte that will not come.
            returned.append(index)
            try:
                wake_write.send(_RETURNED)
            except OSError:  # the helper returned already (after a second signal's grace)
                pass

    threads = [threading.Thread(target=run, args=(index, runner), name=f"echomq-{type(runner).__name__.lower()}",
                                daemon=True) for index, runner in enumerate(runners)]
    before_fd = signal.set_wakeup_fd(wake_write.fileno(), warn_on_full_buffer=False)
    before = {signum: signal.signal(signum, _record) for signum in STOP_SIGNALS}
    try:
        for thread in threads:
            thread.start()
        _wait(returned, runners, wake_read, grace_s, raised)
    finally:
        signal.set_wakeup_fd(before_fd)
        for signum, handler in before.items():
            signal.signal(signum, handler)
        wake_read.close()
        wake_write.close()
    if raised:
        raise raised[0]
    return results


def _wait(returned: list[int], runners: tuple[Runner, ...], wake: socket.socket, grace_s: float,
          raised: list[BaseException]) -> None:
    """Until every run() has `returned`, or `grace_s` after a second signal: stop them, then abort them."""
    received = 0
    deadline: float | None = None
    while len(returned) < len(runners):
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            return
        if not select.select([wake], [], [], timeout)[0]:
            continue
        for byte in wake.recv(64):
            if byte == _RETURNED[0] or byte not in STOP_SIGNALS:
                continue
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
