"""When the retries of many jobs that failed together come back: with Celery's full jitter and without, in one run.

    python bench/retry_spread.py [--jobs 1000] [--backoff 10] [--redis-url URL]

N jobs with an exponential backoff of B seconds (retry_backoff=B) all fail their first attempt on one worker
(core API, threads, concurrency 8); then the times their retries are due (their scores in `delayed`) are read,
as seconds after the worker started. The baseline is the same backoff without jitter, measured in the same
run: every retry is due B seconds after its failure, so the queue gets them all back within the run's length.
With jitter (a task's retry_jitter, on by default) each wait is drawn from 0 to B. A retry drawn shorter than
the run is made due and retried again before the read: it is counted as "already retried".
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from echomq_django.core import Backoff, JobOptions, NewJob, Queue, Worker, WorkerOptions, connect


def spread(url: str, jobs: int, backoff_s: float, jitter: bool) -> tuple[list[float], float]:
    """The retries' due times (s after the worker started) of `jobs` failing jobs, and how long the run took."""
    client = connect(url)
    prefix = f"spread-{uuid.uuid4().hex[:8]}"
    queue = Queue("q", client, prefix=prefix)
    try:
        opts = JobOptions(attempts=2, backoff=Backoff("exponential", round(backoff_s * 1000), jitter=jitter))
        for start in range(0, jobs, 500):
            queue.add_bulk([NewJob("fail", {"n": n}, opts) for n in range(start, min(start + 500, jobs))])

        def handler(job: object) -> None:
            raise RuntimeError("down")

        worker = Worker("q", handler, client, WorkerOptions(prefix=prefix, concurrency=8), scripts=queue.scripts)
        started = time.time()
        worker.run(burst=True, max_jobs=jobs)
        took = time.time() - started
        due = [score / 1000 - started for _, score in client.zrange(queue.keys.delayed, 0, -1, withscores=True)]
        return sorted(due), took
    finally:
        queue.obliterate()
        client.close()


def describe(label: str, due: list[float], jobs: int, took: float) -> str:
    if not due:
        return f"{label}: none in delayed"
    deciles = " ".join(f"{due[min(len(due) - 1, len(due) * k // 10)]:.2f}" for k in range(10))
    return (f"{label:<16} {len(due):>5} due in delayed ({jobs - len(due)} already retried); run {took:.2f} s; "
            f"due at (s, deciles) {deciles} .. {due[-1]:.2f}; stdev {statistics.pstdev(due):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--backoff", type=float, default=10, help="seconds (retry_backoff)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="a Redis (keys under a prefix "
                        "of the run's own, deleted after)")
    args = parser.parse_args()
    for label, jitter in (("without jitter", False), ("with jitter", True)):
        due, took = spread(args.redis_url, args.jobs, args.backoff, jitter)
        print(describe(label, due, args.jobs, took))


if __name__ == "__main__":
    main()
