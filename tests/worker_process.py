"""A worker in a process of its own, for tests that kill, stop or signal it.

    python tests/worker_process.py REDIS_URL PREFIX QUEUE LOCK_MS [CONCURRENCY] [--tag-starts]
        [--rate MAX/MS] [--max-active N] [--group-max-active N] [--block-timeout S]

Each attempt the handler starts is recorded in the list `<PREFIX>:starts` as
"<job id>:<pid>" before the job's work begins (tried until Redis answers).
With --tag-starts the entry is "<job id>:<pid>:<tag>", the tag new for every
handler call: an RPUSH that redis-py sent again after losing its reply then
shows as two equal entries, while two starts of one job never are. Job names:
  sleep     sleep data["seconds"] (only on the first attempt when data["first_only"])
  until     return once the key data["key"] exists (the test says when the job may end)
  jitter    sleep a random 0..data["ms"] milliseconds
  noop      return at once
  limited   raise RateLimited(retry_after=data["seconds"]) on its first start, then return
  value     sleep a random 0..data["ms"] (10) milliseconds, return data["n"] (a workflow's member)
  collect   return its workflow input (a chord's callback: the members' results)
--rate, --max-active and --group-max-active give the worker the queue's flow
control (RateLimit, max_active, group_max_active).
"""

import argparse
import os
import random
import time
import uuid

from echomq_django.core import (
    UNREACHABLE,
    Job,
    RateLimit,
    RateLimited,
    Retention,
    Worker,
    WorkerOptions,
    connect,
    run_until_signalled,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("prefix")
    parser.add_argument("queue")
    parser.add_argument("lock_ms", type=int)
    parser.add_argument("concurrency", type=int, nargs="?", default=1)
    parser.add_argument("--tag-starts", action="store_true")
    parser.add_argument("--rate", type=lambda text: RateLimit(*map(int, text.split("/"))), default=None)
    parser.add_argument("--max-active", type=int, default=0)
    parser.add_argument("--group-max-active", type=int, default=0)
    parser.add_argument("--block-timeout", type=float, default=0.2, help="how long an idle wait lasts, s")
    args = parser.parse_args()
    url, prefix, queue, lock_ms, concurrency = args.url, args.prefix, args.queue, args.lock_ms, args.concurrency
    client = connect(url)

    def handler(job: Job) -> dict:
        tag = f":{uuid.uuid4().hex[:12]}" if args.tag_starts else ""
        # Recorded however long Redis is away: a record that raised would fail the attempt, and its retry
        # would look like a job the queue ran twice (Redis restarted four times within the client's 15 s
        # of retries did that once). An RPUSH sent again after a lost reply gives two equal entries.
        while True:
            try:
                client.rpush(f"{prefix}:starts", f"{job.id}:{os.getpid()}{tag}")
                break
            except UNREACHABLE:
                time.sleep(0.1)
        if job.name == "sleep" and not (job.data.get("first_only") and job.attempts_made > 0):
            time.sleep(job.data["seconds"])
        if job.name == "until":
            while not client.exists(job.data["key"]):
                time.sleep(0.02)
        if job.name == "limited" and job.attempts_started == 1:
            raise RateLimited(retry_after=job.data["seconds"])
        if job.name == "jitter":
            time.sleep(random.random() * job.data["ms"] / 1000)
        if job.name == "value":
            time.sleep(random.random() * job.data.get("ms", 10) / 1000)
            return job.data["n"]
        if job.name == "collect":
            return job.workflow_args[0]
        return {"pid": os.getpid()}

    # Keep every completed job: the tests count them.
    worker = Worker(queue, handler, client, WorkerOptions(prefix=prefix, concurrency=concurrency,
                                                          lock_duration_ms=lock_ms, block_timeout_s=args.block_timeout,
                                                          keep_completed=Retention(), rate_limit=args.rate,
                                                          max_active=args.max_active,
                                                          group_max_active=args.group_max_active))
    print("ready", flush=True)
    run_until_signalled(Announced(worker))


class Announced:
    """The worker as run_until_signalled runs it, saying "stopping" on stdout at its first stop.

    A test that sends a second signal waits for that line: two signals sent before the first
    is taken count as one.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def run(self) -> int:
        return self.worker.run()

    def stop(self) -> None:
        print("stopping", flush=True)
        self.worker.stop()

    def abort(self) -> None:
        self.worker.abort()


if __name__ == "__main__":
    main()
