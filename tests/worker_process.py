"""A worker in a process of its own, for tests that kill, stop or signal it.

    python tests/worker_process.py REDIS_URL PREFIX QUEUE LOCK_MS [CONCURRENCY]

Each attempt the handler starts is recorded in the list `<PREFIX>:starts` as
"<job id>:<pid>" before the job's work begins. Job names:
  sleep     sleep data["seconds"] (only on the first attempt when data["first_only"])
  jitter    sleep a random 0..data["ms"] milliseconds
  noop      return at once
"""

import os
import random
import signal
import sys
import time

from echomq_django.core import Job, Retention, Worker, connect


def main() -> None:
    url, prefix, queue = sys.argv[1], sys.argv[2], sys.argv[3]
    lock_ms = int(sys.argv[4])
    concurrency = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    client = connect(url)

    def handler(job: Job) -> dict:
        client.rpush(f"{prefix}:starts", f"{job.id}:{os.getpid()}")
        if job.name == "sleep" and not (job.data.get("first_only") and job.attempts_made > 0):
            time.sleep(job.data["seconds"])
        if job.name == "jitter":
            time.sleep(random.random() * job.data["ms"] / 1000)
        return {"pid": os.getpid()}

    # Keep every completed job: the tests count them.
    worker = Worker(queue, handler, client, prefix=prefix, concurrency=concurrency,
                    lock_duration_ms=lock_ms, block_timeout_s=0.2, keep_completed=Retention())
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: worker.stop())
    print("ready", flush=True)
    worker.run()


if __name__ == "__main__":
    main()
