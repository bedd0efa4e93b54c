"""The demo's job handlers, one per act of the story the demo tells."""

import os

from echomq_django.core import Backoff, Job, JobOptions

QUEUE = "demo"

# (name, data, options) of every job the demo enqueues, in order.
STORY = [
    ("greet", {"who": "Ada"}, JobOptions(attempts=3)),
    ("greet", {"who": "Grace"}, JobOptions(attempts=3)),
    ("flaky", {"what": "fails once, retried after 0.5 s"}, JobOptions(attempts=3, backoff=Backoff("fixed", 500))),
    ("crash", {"what": "its worker dies mid-job; the sweeper marks, then recovers it"}, JobOptions(attempts=3)),
    ("doomed", {"what": "fails every attempt, ends in failed"}, JobOptions(attempts=2)),
    ("greet", {"who": "Linus"}, JobOptions(attempts=3)),
]


def handle(job: Job) -> object:
    """Run one demo job; the job's name picks what happens."""
    if job.name == "greet":
        return f"hello, {job.data['who']}"
    if job.name == "flaky" and job.attempts_made == 0:
        raise ConnectionError("simulated outage of a downstream service")
    if job.name == "crash" and job.attempts_made == 0:
        os._exit(1)  # the whole worker process dies, holding this job's lock
    if job.name == "doomed":
        raise ValueError(f"bad input, attempt {job.attempts_made + 1}")
    return "done"
