"""What the admin's mirror costs with many failed jobs, and how fast the failed list renders.

    python bench/mirror_cost.py [--jobs 100000] [--redis-url URL] [--database-url URL]

Stages N failed jobs (each with ~200 bytes of data and a 1 KiB stack trace)
under a key prefix of their own, then times: the first sync (everything is
new), a sync with no news, a sync after 100 new failures, a sync after one
job left the failed set (the whole-set comparison), and the failed changelist
rendered by the admin (first page, a search, a filter). The database defaults
to a fresh SQLite file; the Redis keys and the file are deleted at the end.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
STAGE_BATCH = 2000


def timed(function, repeat: int = 1) -> tuple[float, object]:
    """Median wall time in ms of `repeat` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = function()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


def stage_failed(queue, first: int, count: int, newest_ms: int) -> None:
    """Jobs first..first+count-1 failed, one a second, the first at `newest_ms`."""
    trace = "Traceback (most recent call last):\n" + "  File \"app/jobs.py\", line 12, in charge\n" * 15
    for start in range(first, first + count, STAGE_BATCH):
        pipe = queue.client.pipeline(transaction=False)
        members = {}
        for n in range(start, min(start + STAGE_BATCH, first + count)):
            job_id = f"job-{n}"
            pipe.hset(queue.keys.job(job_id), mapping={
                "name": f"billing.charge{n % 7}", "data": f'{{"args": [{n}, "EUR", "card-{n}"], "kwargs": {{}}}}',
                "opts": '{"attempts":3}', "timestamp": newest_ms - 60_000, "atm": 3, "ats": 3, "stc": 0,
                "processedOn": newest_ms - 1000, "finishedOn": newest_ms - (n - first) * 1000,
                "failedReason": f"card {n} declined",
                "stacktrace": json.dumps([trace])})
            members[job_id] = newest_ms - (n - first) * 1000
        pipe.zadd(queue.keys.failed, members)
        pipe.execute()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="echomq-bench-")
    prefix = f"bench{uuid.uuid4().hex[:8]}"
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "demo_project.settings", "ECHOMQ_REDIS_URL": args.redis_url,
        "ECHOMQ_PREFIX": prefix, "ALLOWED_HOSTS": "testserver",
        "DATABASE_URL": args.database_url or f"sqlite:///{workdir}/bench.sqlite3",
    })
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from echomq_django.core.producing.queue import now_ms
    from echomq_django.mirror import sync_queue
    from echomq_django.models import FailedJob
    from echomq_django.queues import get_queue

    call_command("migrate", verbosity=0)
    queue = get_queue("default")
    try:
        print(f"{args.jobs:,} failed jobs, database {connection.vendor}, Redis {queue.client.info()['redis_version']}")
        now = now_ms()
        stage_ms, _ = timed(lambda: stage_failed(queue, 0, args.jobs, now))
        print(f"staged in Redis in {stage_ms / 1000:.1f} s")
        rows = []
        ms, result = timed(lambda: sync_queue(queue))
        rows.append(("first sync (all new)", ms, result))
        ms, result = timed(lambda: sync_queue(queue), repeat=5)
        rows.append(("sync, no news (median of 5)", ms, result))
        stage_failed(queue, args.jobs, 100, now_ms() + 100_000)  # 100 failures after the last sync
        ms, result = timed(lambda: sync_queue(queue))
        rows.append(("sync after 100 new failures", ms, result))
        queue.retry("job-7")
        ms, result = timed(lambda: sync_queue(queue))
        rows.append(("sync after 1 job left failed", ms, result))
        for label, ms, result in rows:
            print(f"{label:<32} {ms:>9.1f} ms   {result.written} written, {result.deleted} deleted"
                  f"{', compared all ids' if result.compared_all else ''}")

        browser = Client()
        browser.force_login(User.objects.create_superuser(f"bench-{uuid.uuid4().hex[:6]}", password="x"))
        detail = FailedJob.objects.only("queue", "job_id").first()
        detail_url = reverse("admin:echomq_failedjob_job", args=[detail.queue, detail.job_id])
        for label, url in (("failed list, first page", "/admin/echomq/failedjob/"),
                           ("failed list, search", "/admin/echomq/failedjob/?q=declined"),
                           ("failed list, filter by name", "/admin/echomq/failedjob/?name=billing.charge3"),
                           ("failed job detail", detail_url)):
            ms, response = timed(lambda url=url: browser.get(url), repeat=5)
            assert response.status_code == 200, (url, response.status_code)
            print(f"{label:<32} {ms:>9.1f} ms   (median of 5, {len(response.content) // 1024} KiB)")
    finally:
        queue.obliterate()


if __name__ == "__main__":
    main()
