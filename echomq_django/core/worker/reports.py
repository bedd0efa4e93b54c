"""A process slot's report writer: its child's progress, log lines and durable steps, written to Redis off the job's
thread."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import pickle
import queue as threadqueue
import threading
from multiprocessing.connection import Connection
from typing import Any

from ..protocol.job import Job, Reporter

logger = logging.getLogger("echomq.worker")
STALE = object()  # ReportWriter.answer's for an answer the running job no longer waits for


class ReportWriter:
    """Writes the reports of a slot's child on a thread of its own; each answer comes back on a pipe.

    The thread that runs the job must stay free to end it: a write that waits for Redis
    (an outage, a frozen server: the client's retries take minutes) would hold a time
    limit off for as long. One writer per slot keeps a job's reports in order.
    """

    def __init__(self, reporter: Reporter, name: str) -> None:
        self._reporter = reporter
        self._name = name  # of the writer's thread
        self._reports: threadqueue.SimpleQueue[tuple[int, Job, str, Any] | None] = threadqueue.SimpleQueue()
        self._answers: Connection | None = None  # where the writer's answers come back
        self._asks = 0  # reports asked for so far, each one's number
        self._asked = 0  # the number of the report the running job waits for; 0: none

    @property
    def awaited(self) -> Connection | None:
        """The pipe the answer of the report the running job waits for comes back on; None when it waits for none."""
        return self._answers if self._asked else None

    def ask(self, job: Job, kind: str, text: Any) -> None:
        """Have a report of the child's job written off this thread; its answer comes back on `awaited`."""
        if self._answers is None:
            self._answers, answers = multiprocessing.Pipe(duplex=False)
            threading.Thread(target=self._write_reports, args=(answers,), name=f"{self._name}-reports",
                             daemon=True).start()
        self._asks += 1
        self._asked = self._asks
        self._reports.put((self._asks, job, kind, text))

    def answer(self) -> Any:
        """Take the next answer off the pipe: whether the awaited report was written (a durable step: its reply, or
        the error it met); STALE for an earlier one's."""
        assert self._answers is not None
        number, written = self._answers.recv()
        if number != self._asked:
            return STALE
        self._asked = 0
        return written

    def forget(self) -> None:
        """The attempt ended: a report of it not written yet never will be."""
        self._asked = 0

    def close(self) -> None:
        """Let the writer's thread end, after the reports already asked for."""
        self._reports.put(None)  # the report writer's last

    def _write_reports(self, answers: Connection) -> None:
        """The slot's report writer: each report the job still waits for, written and answered in turn."""
        while (report := self._reports.get()) is not None:
            number, job, kind, text = report
            if number == self._asked:  # else its attempt ended meanwhile
                written = self._report(job, kind, text)
                with contextlib.suppress(OSError, ValueError):
                    answers.send((number, written))
        answers.close()

    def _report(self, job: Job, kind: str, text: Any) -> Any:
        """Write a report of the child's job; False when it was not written (the job goes on). A durable step's
        answer is its reply, or the error it met (raised in the child)."""
        if kind == "step":
            try:
                return self._reporter.step(job, *text)
            except Exception as error:
                return error if _picklable(error) else RuntimeError(f"{type(error).__name__}: {error}")
        try:
            return (self._reporter.progress if kind == "progress" else self._reporter.log)(job, text)
        except Exception as error:  # a report is not the job's result: the child must get its answer
            logger.warning("job %s of queue %s: its %s was not recorded (%s)", job.id, job.queue, kind, error)
            return False


def _picklable(error: Exception) -> bool:
    try:
        pickle.dumps(error)
    except Exception:
        return False
    return True
