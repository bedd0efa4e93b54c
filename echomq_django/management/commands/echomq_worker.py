"""`manage.py echomq_worker`: run the registered job functions of one or more queues."""

import functools
import logging
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from echomq_django import child
from echomq_django.command_output import echomq_logs_shown
from echomq_django.core import (
    POOLS,
    InvalidNameError,
    Job,
    RecordedSignals,
    Worker,
    WorkerOptions,
    run_until_signalled,
    seconds_text,
)
from echomq_django.jobs import discover_jobs, registered_jobs, run_job
from echomq_django.queues import make_worker, queue_names, worker_options

from ._options import CommandRunner, connect_or_fail, non_negative_int, positive_int

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
            help="Jobs run at once per queue, on threads or child processes "
                 "(default: the queue's CONCURRENCY, 1 unless configured).",
        )
        parser.add_argument(
            "--pool", choices=POOLS, default=None,
            help="Run jobs on threads of this process, or in child processes that use every core and are "
                 "killed at a job's time limit (default: the queue's POOL, threads unless configured).",
        )
        parser.add_argument(
            "--max-jobs-per-child", type=non_negative_int, default=None, metavar="N",
            help="Processes pool: replace a child after it ran N jobs; 0 never "
                 "(default: the queue's MAX_JOBS_PER_CHILD).",
        )
        parser.add_argument(
            "--max-memory-per-child", type=non_negative_int, default=None, metavar="MB",
            help="Processes pool: replace a child, after its job, once its memory passes MB megabytes; 0 never "
                 "(default: the queue's MAX_MEMORY_PER_CHILD).",
        )
        parser.add_argument("--burst", action="store_true",
                            help="Run what is ready, then exit 0 once nothing is ready or running.")
        parser.add_argument("--max-jobs", type=positive_int, default=None, metavar="N",
                            help="Exit after taking N jobs from each queue.")

    def handle(self, **options: Any) -> None:
        with RecordedSignals() as recorded:  # a signal during start-up stops the workers as soon as they run
            self.work(recorded, **options)

    def work(self, recorded: RecordedSignals, *, queues: list[str] | None, concurrency: int | None,
             pool: str | None, max_jobs_per_child: int | None, max_memory_per_child: int | None, burst: bool,
             max_jobs: int | None, verbosity: int, **options: Any) -> None:
        discover_jobs()
        overrides = {"concurrency": concurrency, "pool": pool, "max_jobs_per_child": max_jobs_per_child,
                     "max_memory_per_child_kb": None if max_memory_per_child is None else max_memory_per_child * 1024,
                     # Children show the job lines (run_and_report's) as this command does (left out on threads).
                     "child_init": functools.partial(child.setup, verbosity=verbosity)}
        try:
            names = queue_names(queues)
            configured = {name: worker_options(name, **overrides) for name in names}
            refuse_recycling_on_threads(configured, max_jobs_per_child, max_memory_per_child)
            workers = [make_worker(name, run_and_report, queues=tuple(names), **overrides) for name in names]
        except (InvalidNameError, ValueError) as error:
            raise CommandError(str(error)) from None
        connect_or_fail(lambda message: self.stderr.write(self.style.WARNING(message)))
        if verbosity >= 1:
            functions = ", ".join(sorted(registered_jobs())) or "none (add @job functions to an app's jobs.py)"
            described = ", ".join(f"{name} ({describe(configured[name])})" for name in names)
            self.stdout.write(f"worker on {described}; job functions: {functions}")

        with echomq_logs_shown(self, verbosity):
            processed, crashed = run_all(workers, burst=burst, max_jobs=max_jobs, recorded=recorded)
        if crashed:
            raise CommandError(f"the worker of queue(s) {', '.join(crashed)} stopped on an error (logged above)")
        if verbosity >= 1:
            self.stdout.write("worker finished: " + ", ".join(
                f"{queue} {count} job attempt(s)" for queue, count in sorted(processed.items())))


def refuse_recycling_on_threads(configured: dict[str, WorkerOptions], max_jobs_per_child: int | None,
                                max_memory_per_child: int | None) -> None:
    """ValueError when --max-jobs-per-child or --max-memory-per-child is given for a queue that runs on threads."""
    given = [flag for flag, value in (("--max-jobs-per-child", max_jobs_per_child),
                                      ("--max-memory-per-child", max_memory_per_child)) if value is not None]
    on_threads = [name for name, options in configured.items() if options.pool != "processes"]
    if given and on_threads:
        raise ValueError(f"{' and '.join(given)} recycle the child processes of the processes pool, but queue(s) "
                         f"{', '.join(on_threads)} run on threads: add --pool processes, or set their POOL")


def describe(options: WorkerOptions) -> str:
    """A worker's pool and limits, as its start-up line gives them: "processes x4, time limit 30 s, ..."."""
    parts = [f"{options.pool} x{options.concurrency}"]
    if options.time_limit_ms:
        parts.append(f"time limit {seconds_text(options.time_limit_ms)} s"
                     + (" (a thread is not killed: echomq.W017)" if options.pool == "threads" else ""))
    else:
        parts.append("no queue time limit")
    if options.soft_time_limit_ms:
        parts.append(f"soft time limit {seconds_text(options.soft_time_limit_ms)} s")
    jobs = options.max_jobs_per_child
    recycle = [f"{jobs} job{'' if jobs == 1 else 's'}" if jobs else "",
               f"{options.max_memory_per_child_kb / 1024:g} MB" if options.max_memory_per_child_kb else ""]
    if any(recycle):
        parts.append("a child replaced after " + " or ".join(filter(None, recycle)))
    if rate := options.rate_limit:
        parts.append(f"at most {rate.max} job{'' if rate.max == 1 else 's'} started per "
                     f"{seconds_text(rate.duration_ms)} s")
    if options.max_active:
        parts.append(f"{options.max_active} running at once")
    if options.group_max_active:
        parts.append(f"{options.group_max_active} per group")
    return ", ".join(parts)


def run_all(workers: list[Worker], *, burst: bool, max_jobs: int | None,
            recorded: RecordedSignals | None = None) -> tuple[dict[str, int], list[str]]:
    """Run each worker on a thread of its own until all return: (job attempts per queue, queues that crashed).

    SIGINT and SIGTERM stop them in two stages (run_until_signalled); after the
    second a worker still writes the results it holds, if Redis answers within the grace.
    """
    processed: dict[str, int] = {}
    crashed: list[str] = []

    def runner(worker: Worker) -> CommandRunner:
        def run() -> None:
            try:
                processed[worker.keys.queue] = worker.run(burst=burst, max_jobs=max_jobs)
            except BaseException:
                # A worker that can no longer work must not look like one that
                # finished: stop the others, then exit non-zero.
                logger.exception("the worker of queue %s stopped on an error", worker.keys.queue)
                crashed.append(worker.keys.queue)
                for other in workers:
                    other.stop()

        return CommandRunner(run, worker)

    run_until_signalled(*[runner(worker) for worker in workers], recorded=recorded)
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
