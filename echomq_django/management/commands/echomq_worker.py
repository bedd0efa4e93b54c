"""`manage.py echomq_worker`: run the registered job functions of one or more queues."""

import logging
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import autodiscover_modules

from echomq_django.core import InvalidNameError, Job, Worker
from echomq_django.jobs import registered_jobs, run_job
from echomq_django.queues import make_worker, queue_names

from ._options import connect_or_fail, on_stop_signals, positive_int
from ._output import echomq_logs_shown

logger = logging.getLogger("echomq.worker")


class Command(BaseCommand):
    help = "Run jobs: the @job functions of every installed app's jobs.py, on the given queues."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue", action="append", dest="queues", metavar="NAME",
            help="Queue to work on; repeat for several (default: every queue in ECHOMQ['QUEUES']).",
        )
        parser.add_argument(
            "--concurrency", type=positive_int, default=None, metavar="N",
            help="Jobs run at once per queue, on threads (default: the queue's CONCURRENCY, 1 unless configured).",
        )
        parser.add_argument("--burst", action="store_true",
                            help="Run what is ready, then exit 0 once nothing is ready or running.")
        parser.add_argument("--max-jobs", type=positive_int, default=None, metavar="N",
                            help="Exit after taking N jobs from each queue.")

    def handle(self, *, queues: list[str] | None, concurrency: int | None, burst: bool,
               max_jobs: int | None, verbosity: int, **options: Any) -> None:
        autodiscover_modules("jobs")
        try:
            workers = [make_worker(name, run_and_report, concurrency=concurrency) for name in queue_names(queues)]
        except (InvalidNameError, ValueError) as error:
            raise CommandError(str(error)) from None
        connect_or_fail(lambda message: self.stderr.write(self.style.WARNING(message)))
        if verbosity >= 1:
            names = ", ".join(sorted(registered_jobs())) or "none (add @job functions to an app's jobs.py)"
            self.stdout.write(f"worker on {', '.join(w.keys.queue for w in workers)}; job functions: {names}")

        with echomq_logs_shown(self, verbosity):
            processed, crashed = run_all(workers, burst=burst, max_jobs=max_jobs)
        if crashed:
            raise CommandError(f"the worker of queue(s) {', '.join(crashed)} stopped on an error (logged above)")
        if verbosity >= 1:
            self.stdout.write("worker finished: " + ", ".join(
                f"{queue} {count} job attempt(s)" for queue, count in sorted(processed.items())))


def run_all(workers: list[Worker], *, burst: bool, max_jobs: int | None) -> tuple[dict[str, int], list[str]]:
    """Run each worker on a thread of its own until all return: (job attempts per queue, queues that crashed)."""
    processed: dict[str, int] = {}
    crashed: list[str] = []

    def run(worker: Worker) -> None:
        try:
            processed[worker.keys.queue] = worker.run(burst=burst, max_jobs=max_jobs)
        except BaseException:
            # A worker that can no longer work must not look like one that
            # finished: stop the others, then exit non-zero.
            logger.exception("the worker of queue %s stopped on an error", worker.keys.queue)
            crashed.append(worker.keys.queue)
            stop_all()

    def stop_all() -> None:
        for worker in workers:
            worker.stop()

    threads = [threading.Thread(target=run, args=(worker,), name=f"echomq-worker-{worker.keys.queue}",
                                daemon=True) for worker in workers]
    with on_stop_signals(stop_all):
        for thread in threads:
            thread.start()
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    return processed, crashed


def run_and_report(job: Job) -> Any:
    """Run a job as the worker's handler does, logging its start and its completion.

    Its failure is logged by the worker, which knows whether it will be retried.
    """
    logger.info("job %s of queue %s started: %s, attempt %d of %d",
                job.id, job.queue, job.name, job.attempts_made + 1, job.opts.attempts)
    started = time.monotonic()
    result = run_job(job)
    logger.info("job %s of queue %s completed in %.0f ms", job.id, job.queue, (time.monotonic() - started) * 1000)
    return result
