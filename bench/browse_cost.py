"""How fast the job browser's first and last pages answer with many jobs in one state.

    python bench/browse_cost.py [--jobs 100000] [--repeat 20] [--page 50] [--redis-url URL] [--quick]

Stages `--jobs` completed jobs in one queue (added with Queue.add_bulk, then
taken and finished by the real scripts, 500 per call, keeping every completed
job) and as many waiting jobs in another, and prints how long that took. Then
times `browse(queue, state, start, page)` (echomq_django/core/reading/browse.py: the
window, the state's length and one HGETALL per job shown, then the Job
objects) for the first page (start 0) and the last (start = total - page) of
`completed` (a sorted set) and `wait` (a list), and, as the baseline, one
`Queue.counts()` of the same queue (one getCounts script). Each figure is the
median wall time of `--repeat` calls, the calls of all figures interleaved so
a busy moment of the machine costs them alike; printed beside it, its ratio
to the baseline. The admin's page around it (Django, templates) is not timed.
The keys go under a prefix of their own, deleted at the end.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

from measure import drop  # noqa: E402

from echomq_django.core import NewJob, Queue, browse, connect, now_ms  # noqa: E402
from echomq_django.core.protocol.scripts import Finish  # noqa: E402

ADD_BATCH = 10_000  # jobs per add_bulk
PER_CALL = 500  # jobs per fetch and per finish call while staging


def add(queue: Queue, jobs: int) -> None:
    for at in range(0, jobs, ADD_BATCH):
        queue.add_bulk([NewJob("bench.task", {"args": [at + n], "kwargs": {}})
                        for n in range(min(ADD_BATCH, jobs - at))])


def complete_all(queue: Queue, jobs: int) -> None:
    """Take and finish every waiting job with the real scripts, keeping all completed jobs (no metrics)."""
    scripts, keys, done = queue.scripts, queue.keys, 0
    while done < jobs:
        token = uuid.uuid4().hex
        [reply] = scripts.run_batch([scripts.fetch_call(keys, token, 60_000, now_ms(), PER_CALL, "bench",
                                                        metrics_minutes=0)], raise_on_error=True)
        ids = [job_id for job_id, _ in scripts.fetched(reply)[2]]
        if not ids:
            raise RuntimeError(f"nothing left to take after {done} of {jobs}")
        [codes] = scripts.run_batch([scripts.finish_call(
            keys, [Finish(job_id, token, True, "null") for job_id in ids], now_ms(), default_attempts=3,
            keep_completed=(-1, 0), keep_failed=(-1, 0), metrics_minutes=0)], raise_on_error=True)
        if codes != [1] * len(ids):
            raise RuntimeError(f"finish codes {codes}")
        done += len(ids)


def interleaved_medians(functions: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median wall ms of `repeat` calls of each function, one call of each per turn."""
    times: dict[str, list[float]] = {label: [] for label in functions}
    for _ in range(repeat):
        for label, function in functions.items():
            started = time.perf_counter()
            function()
            times[label].append((time.perf_counter() - started) * 1000)
    return {label: statistics.median(taken) for label, taken in times.items()}


def checked_page(queue: Queue, state: str, start: int, count: int, total: int) -> Callable[[], object]:
    """A call of browse() that fails the run unless it returns a full page of readable jobs."""
    def page() -> object:
        result = browse(queue, state, start, count)
        if result.total != total or len(result.entries) != count or not all(e.job for e in result.entries):
            raise RuntimeError(f"{state} page at {start}: {result.total} total, {len(result.entries)} entries")
        return result
    return page


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in completed, and in wait")
    parser.add_argument("--repeat", type=int, default=20, help="calls per figure (median)")
    parser.add_argument("--page", type=int, default=50, help="jobs per page")
    parser.add_argument("--quick", action="store_true", help="5,000 jobs, to check the script runs")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.repeat = 5_000, 5
    client = connect(args.redis_url)
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    done = Queue("done", client, prefix=prefix)
    waiting = Queue("waiting", client, prefix=prefix)
    print(f"Redis {client.info('server')['redis_version']} at {args.redis_url}; python {sys.version.split()[0]}; "
          f"{args.jobs:,} jobs per state, pages of {args.page}")
    try:
        started = time.perf_counter()
        add(done, args.jobs)
        added = time.perf_counter()
        complete_all(done, args.jobs)
        finished = time.perf_counter()
        add(waiting, args.jobs)
        print(f"staged: {args.jobs:,} completed in {finished - started:.1f} s (add_bulk {added - started:.1f} s, "
              f"fetch and finish {finished - added:.1f} s), {args.jobs:,} waiting in "
              f"{time.perf_counter() - finished:.1f} s")
        total = args.jobs
        last = total - args.page
        figures = {
            ("completed", "counts() (baseline)"): done.counts,
            ("completed", "first page"): checked_page(done, "completed", 0, args.page, total),
            ("completed", "last page"): checked_page(done, "completed", last, args.page, total),
            ("wait", "counts() (baseline)"): waiting.counts,
            ("wait", "first page"): checked_page(waiting, "wait", 0, args.page, total),
            ("wait", "last page"): checked_page(waiting, "wait", last, args.page, total),
        }
        medians = interleaved_medians(figures, args.repeat)
        print(f"{'state':<11}{'call':<28}{'ms (median of ' + str(args.repeat) + ')':>20}{'ratio to counts()':>19}")
        for (state, label), ms in medians.items():
            baseline = medians[state, "counts() (baseline)"]
            where = {"first page": " (start 0)", "last page": f" (start {last:,})"}.get(label, "")
            print(f"{state:<11}{label + where:<28}{ms:>20.2f}{ms / baseline:>19.1f}")
    finally:
        drop(client, f"{prefix}:*")


if __name__ == "__main__":
    main()
