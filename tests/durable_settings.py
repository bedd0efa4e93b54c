"""Settings of the worker processes tests/system/test_durable_processes.py starts: the demo's, plus the app whose
jobs.py holds the durable jobs (tests/durable_app) and its queue `dq` (DATABASE_URL, ECHOMQ_REDIS_URL and
ECHOMQ_PREFIX as for the demo)."""

from demo_project.settings import *  # noqa: F403
from demo_project.settings import ECHOMQ, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.durable_app"]

# A lock of 1 s (renewed every 0.5 s), as the other kill tests use: a killed worker's jobs are free again
# within a second or so of its death, for the test's own sweeper to recover.
ECHOMQ = {**ECHOMQ, "QUEUES": {"dq": {"LOCK_DURATION": 1}}}
