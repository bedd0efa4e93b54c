"""The demo's view of its child processes: their output lines, labelled, and the jobs behind the sweep lines."""

import re
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from django.core.management.base import OutputWrapper

# SweepReport.summary() of a sweep that did its work.
SWEEP_LINE = re.compile(r"^queue (?P<queue>\S+): marked (?P<marked>\d+), recovered (?P<recovered>\d+) to wait, "
                        r"failed (?P<failed>\d+)")


class Relay:
    """Copy a child's stdout and stderr lines into the demo's, each behind the child's label.

    `annotate` may add to a stdout line; once `quiet` is set, stdout lines
    (routine progress) are dropped and only stderr (warnings, errors) shows.
    """

    def __init__(self, process: subprocess.Popen, label: str, stdout: OutputWrapper, stderr: OutputWrapper,
                 annotate: Callable[[str], str] | None = None) -> None:
        self.process = process
        self.label = label
        self.annotate = annotate or (lambda line: line)
        self.quiet = threading.Event()
        self.threads = [threading.Thread(target=self._copy, args=(stream, out, is_stdout), daemon=True)
                        for stream, out, is_stdout in ((process.stdout, stdout, True), (process.stderr, stderr, False))]
        for thread in self.threads:
            thread.start()

    def _copy(self, stream: Any, out: OutputWrapper, is_stdout: bool) -> None:
        for line in stream:
            line = line.rstrip("\n")
            if is_stdout and self.quiet.is_set():
                continue
            out.write(f"[{self.label}] {self.annotate(line) if is_stdout else line}")

    def join(self, timeout_s: float) -> None:
        """Wait until the child's output has been copied (it exited and its pipes closed)."""
        for thread in self.threads:
            thread.join(timeout_s)


class SweepNarrator:
    """Name the jobs behind a sweep line's `marked N`, `recovered N` and `failed N` of one queue.

    The marks are read from Redis right after the line (they last until the
    next sweep); a job whose mark a later sweep's recovery or failure ended
    is named with that sweep.
    """

    def __init__(self, queue: Any, names: dict[str, str]) -> None:
        self.queue = queue
        self.names = names  # job id -> what the demo calls it
        self.marked: set[str] = set()

    def __call__(self, line: str) -> str:
        match = SWEEP_LINE.match(line)
        if not match or match["queue"] != self.queue.name:
            return line
        marked_now = self.queue.stalled_ids()
        notes = []
        if int(match["recovered"]) or int(match["failed"]):
            for job_id in sorted(self.marked - marked_now):
                verb = "failed" if self.queue.get_state(job_id) == "failed" else "recovered"
                notes.append(f"{verb} {self.job(job_id)}")
        if int(match["marked"]):
            notes += [f"marked {self.job(job_id)}" for job_id in sorted(marked_now - self.marked)]
        self.marked = marked_now
        return f"{line}: {', '.join(notes)}" if notes else line

    def job(self, job_id: str) -> str:
        return f"job {job_id} ({self.names.get(job_id, 'not one of the demo')})"
