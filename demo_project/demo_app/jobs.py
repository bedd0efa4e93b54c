"""The demo's job functions: each plays one part of the story the demo tells."""

import os
import time

from django.contrib.auth import get_user_model

from echomq_django.core import Backoff, RateLimited
from echomq_django.jobs import current_job, job

QUEUE = "demo"


@job(queue=QUEUE, attempts=3)
def greet(who: str) -> str:
    return f"hello, {who}"


@job(queue=QUEUE, attempts=3, backoff=Backoff("fixed", 500))
def flaky() -> str:
    """Fails its first attempt, as a call to a briefly unavailable service would."""
    if current_job().attempts_made == 0:
        raise ConnectionError("simulated outage of a downstream service")
    return "done on the retry"


@job(queue=QUEUE, attempts=3)
def crash() -> str:
    """Kills its whole worker process on the first attempt; the sweeper recovers it."""
    if current_job().attempts_made == 0:
        os._exit(1)
    return "done after the sweeper recovered it"


@job(queue=QUEUE, attempts=2)
def doomed(reason: str) -> None:
    """Fails every attempt, so it ends in the failed set for the admin."""
    raise ValueError(f"{reason} (attempt {current_job().attempts_made + 1})")


@job(queue=QUEUE)
def import_rows(rows: int) -> int:
    """Logs a line per row and reports its progress: both show on the job's page in the admin."""
    running = current_job()
    for done in range(1, rows + 1):
        running.log(f"imported row {done} of {rows}")
        running.update_progress({"percent": round(100 * done / rows), "rows": done})
    return rows


@job(queue=QUEUE)
def add_up(counts: list[int]) -> int:
    """A chord's callback: the results of the import_rows before it, once all of them completed."""
    return sum(counts)


@job(queue=QUEUE)
def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@job(queue=QUEUE)
def count_users() -> int:
    """Uses the database inside a job."""
    return get_user_model().objects.count()


@job(queue=QUEUE)
def heartbeat() -> str:
    """Fired by the demo's schedule (ECHOMQ["SCHEDULES"]["heartbeat"]) every few seconds."""
    return f"alive at tick {current_job().id.rsplit('@', 1)[-1]}"


HEAVY = "heavy"


@job(queue=HEAVY, time_limit=2, attempts=1)
def stuck() -> str:
    """Hangs, as a call to a service that never answers would; its time limit of 2 s stops it."""
    time.sleep(3600)
    return "never"


@job(queue=HEAVY)
def export(rows: int) -> int:
    """A long export, cancelled in the admin (or by Queue.cancel) while it runs."""
    running = current_job()
    for done in range(1, rows + 1):
        time.sleep(0.2)
        running.update_progress({"rows": done})
    return rows


API = "api"


@job(queue=API)
def call_api(tenant: str, n: int) -> str:
    """A call to a rate-limited API for a tenant; tenant-b's first call is told to slow down (an HTTP 429)."""
    if tenant == "tenant-b" and n == 0 and current_job().attempts_started == 1:
        raise RateLimited(retry_after=1)
    return f"{tenant} call {n}"


STORY = [
    (greet, ("Ada",)),
    (greet, ("Grace",)),
    (import_rows, (5,)),
    (flaky, ()),
    (crash, ()),
    (doomed, ("the input is malformed",)),
    (greet, ("Linus",)),
]
