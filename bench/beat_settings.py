"""Settings for bench/beat_cost.py: the demo project's, with one queue and many interval schedules.

    DJANGO_SETTINGS_MODULE=bench.beat_settings BENCH_BEAT_SCHEDULES=1000 BENCH_BEAT_EVERY=1,2,5 \
        python manage.py echomq_beat

Schedule n (named "s0000", "s0001", ...) adds the demo's greet job to the
"demo" queue every BENCH_BEAT_EVERY[n % len] seconds; the Redis URL, the key
prefix and the database come from the environment as for the demo project
(ECHOMQ_REDIS_URL, ECHOMQ_PREFIX, DATABASE_URL).
"""

import os

from demo_project.settings import *  # noqa: F403
from demo_project.settings import env

SCHEDULES = int(os.environ.get("BENCH_BEAT_SCHEDULES", "1000"))
EVERY = [float(seconds) for seconds in os.environ.get("BENCH_BEAT_EVERY", "1,2,5").split(",")]
QUEUE = "demo"  # the queue of demo_project.demo_app.jobs.greet

ECHOMQ = {
    "REDIS_URL": env.str("ECHOMQ_REDIS_URL", default="redis://127.0.0.1:6379/0"),
    "PREFIX": env.str("ECHOMQ_PREFIX", default="emq"),
    # The demo apps' other jobs and tasks are on "default", "heavy" and "api": configured, so they pass the checks
    # (a beat imports every app's jobs.py and tasks.py).
    "QUEUES": {QUEUE: {}, "default": {}, "heavy": {"POOL": "processes"}, "api": {}},
    "SCHEDULES": {
        f"s{n:04d}": {"TASK": "demo_project.demo_app.jobs.greet", "EVERY": EVERY[n % len(EVERY)],
                      "ARGS": [f"s{n:04d}"]}
        for n in range(SCHEDULES)
    },
}
TASKS = {"default": {"BACKEND": "echomq_django.backends.EchoMQBackend", "QUEUES": [QUEUE, "default"]}}
