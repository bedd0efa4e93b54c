"""Settings of the echomq_beat processes tests start: the demo's, plus a queue `q`, with the schedules
given as JSON in ECHOMQ_TEST_SCHEDULES (DATABASE_URL, ECHOMQ_REDIS_URL and ECHOMQ_PREFIX as for the demo)."""

import json
import os

from demo_project.settings import *  # noqa: F403
from demo_project.settings import ECHOMQ, INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.beat_app"]  # its jobs.py has the job the schedules fire

ECHOMQ = {**ECHOMQ, "QUEUES": {**ECHOMQ["QUEUES"], "q": {}},
          "SCHEDULES": json.loads(os.environ.get("ECHOMQ_TEST_SCHEDULES", "{}"))}
