"""The figures a user feels, echomq beside Huey, Dramatiq, Celery, RQ and BullMQ, in one run.

    pip install -e ".[bench]"    # the peers; a peer that is not installed is skipped, and said so
    python bench/everyday.py [--redis-url URL] [--rounds 3] [--quick] [--json]
                             [--only echomq,huey,...] [--figures enqueue,latency,c1,c8,c32,sleep]

Each system is used through its own public API, with its documented fast settings:
  echomq               core API: Queue.add, Worker(concurrency=c) on threads
  echomq, pool         the same with its fast path off (ECHOMQ_OWN_CONNECTIONS=0): redis-py's pool and
                       pipelines only, what the fast path (core/protocol/own_connections.py) is measured against
  echomq @job          the demo's greet.enqueue("Ada") (Django set up in a subprocess of its own)
  echomq Task.enqueue  the demo's Django @task add.enqueue(i, -1), outside any transaction (ditto)
  Django Tasks, no queue  the same add.enqueue(i, -1) on Django's DummyBackend, which keeps the results
                       in a list: Django's own part of Task.enqueue, the floor for any Tasks backend
  huey                 RedisHuey(results=False), blocking dequeue (its default); huey_consumer -k thread -w c
  dramatiq             RedisBroker, default middleware; dramatiq --processes 1 --threads c
  celery prefork/threads  Redis broker, task_ignore_result, no result backend; celery worker -P prefork|threads
                       -c c --without-gossip --without-mingle --without-heartbeat
  rq                   Queue.enqueue; rq.SimpleWorker (no fork per job, one job at a time: so only the
                       latency and concurrency 1 figures; the others are n/a)
  bullmq               the Python package: await Queue.add; Worker(concurrency=c), removeOnComplete 1,000
                       (echomq keeps 1,000 completed jobs by default too)
The Django rows only have the enqueue figures: their worker is echomq's.

Figures, per system:
  enqueue   single enqueue: one call per job, in this process, on one thread: 200 warm-up calls,
            then N calls (5,000; --quick 200) timed in 5 slices; the round's figure is the best
            slice (jobs/s by time.perf_counter, CPU per call by time.process_time, which leaves out
            waiting for Redis or a core: steadier on a busy machine).
  latency   pickup at light load: one idle worker at concurrency 1, warmed by 3 jobs run one
            after the other; then one job every 20 ms (300; --quick 20), each carrying the
            time.time() taken right before its enqueue call. The handler's first act is
            time.time(); it RPUSHes the difference to Redis after that. p50, p99 and max in ms.
  c1/c8/c32 no-op jobs/s at concurrency 1, 8, 32: N jobs enqueued first (a bulk API where the
            system has one; not timed), then one worker process is started. The rate is N over
            the time from the first job's start to the last job's end, as the handlers report
            them (job 0 records time.time() as it starts, job N-1 as it ends; every other job
            does nothing): the worker's start-up is left out. N is 20,000 for echomq, 5,000 for
            Huey and BullMQ, 3,000 for Dramatiq and Celery, 2,000 for RQ: a few seconds of work
            each; --quick 300.
            Caveat: job N-1 is the last one taken (every queue here is FIFO), but at concurrency
            8 or 32 up to 31 other no-op jobs may still be ending when it ends; no-op jobs take
            microseconds, so that error is far below the noise.
            At concurrency 1 the table also gives Redis's time per job (INFO commandstats, every
            command from the worker's start to the last job's end, over N): one job at a time, it
            is part of every job's cycle, beside the round trip and the worker's own work.
  sleep     1,280 jobs of time.sleep(0.05) (bullmq: await asyncio.sleep(0.05), as its processor is a
            coroutine) at concurrency 32 (--quick 64), timed as the no-op jobs (job 0's start to job
            N-1's end: the jobs of the last wave all started before job N-1); jobs/s and % of the
            ideal 32 / 0.05 s = 640/s.
Physical limits, once per run: redis-benchmark with one client (PING_INLINE, SET, LPUSH and
EVALSHA of a script that returns 1), and redis-py's own ping() rate: the floor for any Python
producer that makes one round trip per job.

Every round measures every system once, in an order rotated each round; the tables give the
median of the rounds. A private redis-server (no persistence, free loopback port) is started
unless --redis-url is given. Every measurement has a key prefix (or queue name) of its own,
deleted at the end, and its worker process is stopped by its id (SIGTERM, then SIGKILL to its
own process group). The second table gives echomq against the fastest peer on each figure,
with the targets of the issue.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]

import redis  # noqa: E402
from beat_cost import percentile, start_redis, stop_process  # noqa: E402
from measure import drop, parse_rate  # noqa: E402

from echomq_django.core import NewJob, Queue, Scripts, connect  # noqa: E402

FIGURES = ("enqueue", "latency", "c1", "c8", "c32", "sleep")
DJANGO_FLOOR = "Django Tasks, no queue"  # Task.enqueue on Django's DummyBackend
CONCURRENCY = {"c1": 1, "c8": 8, "c32": 32}
SLEEP_S, SLEEP_CONCURRENCY = 0.05, 32
IDEAL = SLEEP_CONCURRENCY / SLEEP_S  # 640 jobs/s
GAP_S = 0.02  # between two jobs of the latency figure
SLICES = 5  # the enqueue figure's calls are timed in this many slices; the best one counts
STOP_WAIT_S = 1.0  # a worker gets this long to stop after SIGTERM


def sizes(quick: bool) -> dict[str, Any]:
    if quick:
        return {"calls": 200, "warm": 50, "latency": 20, "jobs": {}, "default_jobs": 300, "sleep": 64,
                "limit_requests": 5_000, "pings": 2_000}
    # No-op jobs per worker run: a few seconds of work for each system (the slow ones get fewer).
    slow = {"dramatiq": 3_000, "celery-prefork": 3_000, "celery-threads": 3_000, "rq": 2_000}
    return {"calls": 5_000, "warm": 200, "latency": 300, "jobs": {"echomq": 20_000, "echomq-pool": 20_000, **slow},
            "default_jobs": 5_000, "sleep": 1_280, "limit_requests": 50_000, "pings": 20_000}


# ---------------------------------------------------------------- the jobs, as each system's module

# Every system's tasks module starts with this (after "URL, TAG = ..."); its tasks call these.
# Marks go to Redis through a plain client, made once per process (forked children of Celery's
# prefork pool get their own connections: redis-py checks the pid).
_PRELUDE = '''
import time

import redis

_marks = redis.Redis.from_url(URL)


def _noop(n, last):
    if n == 0 or n == last:  # the time is taken before the write
        _marks.rpush(TAG + (":first" if n == 0 else ":last"), time.time())


def _ping(sent):
    picked = time.time()
    _marks.rpush(TAG + ":lat", picked - sent)


def _nap(n, last, seconds):
    started = time.time()
    time.sleep(seconds)
    if n == 0 or n == last:
        _marks.rpush(TAG + (":first" if n == 0 else ":last"), started if n == 0 else time.time())
'''

_ECHOMQ_TASKS = '''
HANDLERS = {"noop": _noop, "ping": _ping, "nap": _nap}


def handle(job):
    HANDLERS[job.name](*job.data["args"])
'''

_HUEY_TASKS = '''
from huey import RedisHuey

huey = RedisHuey(TAG, url=URL, results=False)


@huey.task()
def noop(n, last):
    _noop(n, last)


@huey.task()
def ping(sent):
    _ping(sent)


@huey.task()
def nap(n, last, seconds):
    _nap(n, last, seconds)
'''

_DRAMATIQ_TASKS = '''
import dramatiq
from dramatiq.brokers.redis import RedisBroker

broker = RedisBroker(url=URL, namespace=TAG)
dramatiq.set_broker(broker)


@dramatiq.actor
def noop(n, last):
    _noop(n, last)


@dramatiq.actor
def ping(sent):
    _ping(sent)


@dramatiq.actor
def nap(n, last, seconds):
    _nap(n, last, seconds)
'''

_CELERY_TASKS = '''
from celery import Celery

app = Celery(TAG, broker=URL)
app.conf.update(task_ignore_result=True, task_default_queue=TAG, broker_connection_retry_on_startup=True,
                broker_transport_options={"global_keyprefix": TAG + ":"})


@app.task(name="noop")
def noop(n, last):
    _noop(n, last)


@app.task(name="ping")
def ping(sent):
    _ping(sent)


@app.task(name="nap")
def nap(n, last, seconds):
    _nap(n, last, seconds)
'''

_RQ_TASKS = '''
def noop(n, last):
    _noop(n, last)


def ping(sent):
    _ping(sent)


def nap(n, last, seconds):
    _nap(n, last, seconds)
'''

# BullMQ's processor is a coroutine: its marks go through redis.asyncio, so they never block the
# event loop the other jobs share, and its sleep is asyncio.sleep.
_BULLMQ_TASKS = '''
import asyncio

import redis.asyncio

_async_marks = None


async def process(job, token):
    global _async_marks
    picked = time.time()
    if _async_marks is None:
        _async_marks = redis.asyncio.Redis.from_url(URL)
    args = job.data["args"]
    if job.name == "ping":
        await _async_marks.rpush(TAG + ":lat", picked - args[0])
        return
    if job.name == "nap":
        await asyncio.sleep(args[2])
    n, last = args[0], args[1]
    if n == 0 or n == last:
        await _async_marks.rpush(TAG + (":first" if n == 0 else ":last"), picked if n == 0 else time.time())
'''

# The worker processes. argv: the tasks module's folder, its name, the concurrency.
_ECHOMQ_WORKER = """
import importlib, sys
sys.path.insert(0, sys.argv[1])
tasks = importlib.import_module(sys.argv[2])
from echomq_django.core import Worker, connect, run_until_signalled
try:
    from echomq_django.core import WorkerOptions
    def options(**given): return {"options": WorkerOptions(**given)}
except ImportError:  # a tree from before WorkerOptions: Worker took them as keyword arguments
    def options(**given): return given
worker = Worker("q", tasks.handle, connect(tasks.URL), **options(prefix=tasks.TAG, concurrency=int(sys.argv[3])))
run_until_signalled(worker)
"""

_RQ_WORKER = """
import importlib, sys
sys.path.insert(0, sys.argv[1])
tasks = importlib.import_module(sys.argv[2])
import redis
from rq import Queue, SimpleWorker
connection = redis.Redis.from_url(tasks.URL)
SimpleWorker([Queue(tasks.TAG, connection=connection)], connection=connection,
             name=tasks.TAG + "-worker").work(logging_level="WARNING")
"""

_BULLMQ_WORKER = """
import asyncio, importlib, signal, sys
sys.path.insert(0, sys.argv[1])
tasks = importlib.import_module(sys.argv[2])
from bullmq import Worker

async def main():
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    worker = Worker("q", tasks.process, {"connection": tasks.URL, "prefix": tasks.TAG,
                                         "concurrency": int(sys.argv[3]), "removeOnComplete": {"count": 1000}})
    await stop.wait()
    await worker.close()

asyncio.run(main())
"""

# The Django enqueue paths, in a process of their own (Django's setup is process-wide).
# argv: URL, key prefix, "job" or "task", calls, warm-up calls.
_DJANGO_ENQUEUE = """
import os, sys
url, prefix, path, calls, warm = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
os.environ.update({"DJANGO_SETTINGS_MODULE": "demo_project.settings", "ECHOMQ_REDIS_URL": url,
                   "ECHOMQ_PREFIX": prefix, "DATABASE_URL": "sqlite://:memory:"})
if path == "dummy":  # Django's own work in Task.enqueue: its DummyBackend only keeps the results in a list
    import importlib, importlib.util
    import demo_project.settings as demo
    tasks = "django.tasks" if importlib.util.find_spec("django.tasks") else "django_tasks"
    demo.TASKS = {"default": {"BACKEND": tasks + ".backends.dummy.DummyBackend"}}
import django
django.setup()
import everyday
if path == "job":
    from demo_project.demo_app.jobs import greet

    def calls_of(indices):
        enqueue = greet.enqueue
        for _ in indices:
            enqueue("Ada")
else:
    if path == "dummy":  # the demo's tasks take echomq's options, which the DummyBackend's Task refuses
        task = importlib.import_module(tasks).task

        def add(a, b):
            return a + b

        add = task(add)
    else:
        from demo_project.demo_app.tasks import add

    assert type(add.get_backend()).__name__ == ("DummyBackend" if path == "dummy" else "EchoMQBackend")

    def calls_of(indices):
        enqueue = add.enqueue
        for i in indices:
            enqueue(i, -1)
rate, cpu_us = everyday.timed_calls(calls_of, calls, warm)
print(f"RATE {rate}")
print(f"CPU_US {cpu_us}")
"""


# ---------------------------------------------------------------- the systems

class System:
    """One system's producer side, built per measurement on a fresh tag (its key prefix or queue name)."""

    key = ""  # for --only
    label = ""  # in the tables
    needs: tuple[str, ...] = ()  # packages it cannot run without
    tasks_source = ""
    figures = FIGURES  # the others are n/a

    def __init__(self, url: str, workdir: Path) -> None:
        self.url, self.workdir = url, workdir
        self.tag = ""
        self.tasks: Any = None

    def open(self, tag: str) -> None:
        """Write the tasks module under the name `tag`, import it here and set the producer up."""
        self.tag = tag
        (self.workdir / f"{tag}.py").write_text(f"URL, TAG = {self.url!r}, {tag!r}\n" + _PRELUDE + self.tasks_source)
        importlib.invalidate_caches()  # the folder's listing may be cached from before the file was written
        self.tasks = importlib.import_module(tag)

    def close(self) -> None:
        self.tasks._marks.close()
        sys.modules.pop(self.tag, None)

    def enqueue_noops(self, indices: range) -> None:
        """One enqueue call per index: the single enqueue figure."""
        raise NotImplementedError

    def add(self, name: str, args: list[Any]) -> None:
        raise NotImplementedError

    def add_bulk(self, name: str, many: list[list[Any]]) -> None:
        """Enqueue before a worker starts (not timed): one call each, unless the system has a bulk API."""
        for args in many:
            self.add(name, args)

    def worker(self, concurrency: int) -> list[str]:
        """The argv of a worker process at `concurrency`."""
        raise NotImplementedError

    def _script(self, script: str, concurrency: int) -> list[str]:
        return [sys.executable, "-c", script, str(self.workdir), self.tag, str(concurrency)]


class EchoMQ(System):
    key, label, tasks_source = "echomq", "echomq", _ECHOMQ_TASKS

    def open(self, tag: str) -> None:
        super().open(tag)
        self.queue = Queue("q", connect(self.url), prefix=tag)

    def close(self) -> None:
        self.queue.client.close()
        super().close()

    def enqueue_noops(self, indices: range) -> None:
        add = self.queue.add
        for i in indices:
            add("noop", {"args": [i, -1], "kwargs": {}})

    def add(self, name: str, args: list[Any]) -> None:
        self.queue.add(name, {"args": args, "kwargs": {}})

    def add_bulk(self, name: str, many: list[list[Any]]) -> None:
        for at in range(0, len(many), 10_000):
            self.queue.add_bulk([NewJob(name, {"args": args, "kwargs": {}}) for args in many[at:at + 10_000]])

    def worker(self, concurrency: int) -> list[str]:
        return self._script(_ECHOMQ_WORKER, concurrency)


class EchoMQPool(EchoMQ):
    """echomq with each thread's own connections switched off, in this process and in its worker's."""

    key, label = "echomq-pool", "echomq, pool"
    figures = ("enqueue", "latency", "c1", "c8", "c32")

    def open(self, tag: str) -> None:
        System.open(self, tag)
        client = connect(self.url)
        self.queue = Queue("q", client, prefix=tag, scripts=Scripts(client, own_connections=False))

    def worker(self, concurrency: int) -> list[str]:
        return self._script('import os; os.environ["ECHOMQ_OWN_CONNECTIONS"] = "0"\n' + _ECHOMQ_WORKER, concurrency)


class EchoMQDjango(System):
    """A Django enqueue path: measured in a subprocess; there is no worker of its own."""

    figures = ("enqueue",)

    def __init__(self, url: str, workdir: Path, path: str) -> None:
        super().__init__(url, workdir)
        self.path = path
        self.key = f"echomq-{path}"
        self.label = {"job": "echomq @job", "task": "echomq Task.enqueue", "dummy": DJANGO_FLOOR}[path]


class Huey(System):
    key, label, needs, tasks_source = "huey", "huey", ("huey",), _HUEY_TASKS

    def close(self) -> None:
        self.tasks.huey.storage.pool.disconnect()
        super().close()

    def enqueue_noops(self, indices: range) -> None:
        noop = self.tasks.noop
        for i in indices:
            noop(i, -1)

    def add(self, name: str, args: list[Any]) -> None:
        getattr(self.tasks, name)(*args)

    def worker(self, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "huey.bin.huey_consumer", f"{self.tag}.huey", "-k", "thread",
                "-w", str(concurrency)]


class Dramatiq(System):
    """Its defaults, prefetch included (2 messages per thread).

    At --threads 1, with both messages in hand its consumer sleeps a backoff of 5 ms and up, which
    caps it near 260 jobs/s (dramatiq_queue_prefetch=64 gave about 1,700/s in a one-off run).
    """

    key, label, needs, tasks_source = "dramatiq", "dramatiq", ("dramatiq",), _DRAMATIQ_TASKS

    def close(self) -> None:
        self.tasks.broker.close()
        super().close()

    def enqueue_noops(self, indices: range) -> None:
        send = self.tasks.noop.send
        for i in indices:
            send(i, -1)

    def add(self, name: str, args: list[Any]) -> None:
        getattr(self.tasks, name).send(*args)

    def worker(self, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "dramatiq", self.tag, "--processes", "1", "--threads", str(concurrency),
                "--path", str(self.workdir)]


class Celery(System):
    needs, tasks_source = ("celery",), _CELERY_TASKS

    def __init__(self, url: str, workdir: Path, pool: str) -> None:
        super().__init__(url, workdir)
        self.pool = pool
        self.key, self.label = f"celery-{pool}", f"celery {pool}"

    def close(self) -> None:
        self.tasks.app.close()
        super().close()

    def enqueue_noops(self, indices: range) -> None:
        delay = self.tasks.noop.delay
        for i in indices:
            delay(i, -1)

    def add(self, name: str, args: list[Any]) -> None:
        getattr(self.tasks, name).delay(*args)

    def worker(self, concurrency: int) -> list[str]:
        return [sys.executable, "-m", "celery", "-A", self.tag, "worker", "-P", self.pool, "-c", str(concurrency),
                "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING",
                "-n", f"{self.tag}@%h"]


class RQ(System):
    key, label, needs, tasks_source = "rq", "rq", ("rq",), _RQ_TASKS
    figures = ("enqueue", "latency", "c1")  # SimpleWorker runs one job at a time

    def open(self, tag: str) -> None:
        from rq import Queue as RQQueue

        super().open(tag)
        self.client = redis.Redis.from_url(self.url)  # RQ stores pickles: no decode_responses
        self.queue = RQQueue(tag, connection=self.client)
        self.ids = itertools.count()  # job ids carry the tag, so that the clean-up finds every key

    def close(self) -> None:
        self.client.srem("rq:queues", f"rq:queue:{self.tag}")
        self.client.srem("rq:workers", f"rq:worker:{self.tag}-worker")
        self.client.delete("rq:clean_groups")  # its worker's maintenance lock (a TTL of minutes)
        self.client.close()
        super().close()

    def enqueue_noops(self, indices: range) -> None:
        enqueue, noop, tag, ids = self.queue.enqueue, self.tasks.noop, self.tag, self.ids
        for i in indices:
            enqueue(noop, i, -1, job_id=f"{tag}-{next(ids)}")

    def add(self, name: str, args: list[Any]) -> None:
        self.queue.enqueue(getattr(self.tasks, name), *args, job_id=f"{self.tag}-{next(self.ids)}")

    def add_bulk(self, name: str, many: list[list[Any]]) -> None:
        from rq import Queue as RQQueue

        function = getattr(self.tasks, name)
        for at in range(0, len(many), 5_000):
            self.queue.enqueue_many([RQQueue.prepare_data(function, args, job_id=f"{self.tag}-{next(self.ids)}")
                                     for args in many[at:at + 5_000]])

    def worker(self, concurrency: int) -> list[str]:
        return self._script(_RQ_WORKER, concurrency)


class BullMQ(System):
    key, label, needs, tasks_source = "bullmq", "bullmq", ("bullmq",), _BULLMQ_TASKS

    def open(self, tag: str) -> None:
        from bullmq import Queue as BullQueue

        super().open(tag)
        self.loop = asyncio.new_event_loop()
        self.queue = BullQueue("q", {"connection": self.url, "prefix": tag})

    def close(self) -> None:
        self.loop.run_until_complete(self.queue.close())
        self.loop.close()
        super().close()

    async def _noops(self, indices: range) -> None:
        add = self.queue.add
        for i in indices:
            await add("noop", {"args": [i, -1]})

    def enqueue_noops(self, indices: range) -> None:
        self.loop.run_until_complete(self._noops(indices))

    def add(self, name: str, args: list[Any]) -> None:
        self.loop.run_until_complete(self.queue.add(name, {"args": args}))

    def add_bulk(self, name: str, many: list[list[Any]]) -> None:
        for at in range(0, len(many), 1_000):
            self.loop.run_until_complete(self.queue.addBulk([{"name": name, "data": {"args": args}}
                                                             for args in many[at:at + 1_000]]))

    def worker(self, concurrency: int) -> list[str]:
        return self._script(_BULLMQ_WORKER, concurrency)


def all_systems(url: str, workdir: Path) -> list[System]:
    return [EchoMQ(url, workdir), EchoMQPool(url, workdir), EchoMQDjango(url, workdir, "job"),
            EchoMQDjango(url, workdir, "task"), EchoMQDjango(url, workdir, "dummy"),
            Huey(url, workdir), Dramatiq(url, workdir), Celery(url, workdir, "prefork"),
            Celery(url, workdir, "threads"), RQ(url, workdir), BullMQ(url, workdir)]


def selected(system: System, only: list[str] | None) -> bool:
    """`--only echomq` takes every echomq row, `--only celery` both pools; `celery-threads` one."""
    return not only or any(system.key == name or system.key.startswith(name + "-") for name in only)


# ---------------------------------------------------------------- measuring

def timed_calls(calls_of: Callable[[range], None], calls: int, warm: int) -> tuple[float, float]:
    """(jobs/s, CPU µs per call) of the best of SLICES slices of `calls` calls, after `warm` calls."""
    calls_of(range(warm))
    per = max(1, calls // SLICES)
    best_wall = best_cpu = float("inf")
    for n in range(SLICES):
        wall, cpu = time.perf_counter(), time.process_time()
        calls_of(range(warm + n * per, warm + (n + 1) * per))
        best_wall = min(best_wall, time.perf_counter() - wall)
        best_cpu = min(best_cpu, time.process_time() - cpu)
    return per / best_wall, best_cpu / per * 1e6


class Measurement:
    """One figure of one system: a fresh tag, its worker process if any; everything removed at the end."""

    def __init__(self, system: System, client: redis.Redis) -> None:
        self.system, self.client = system, client
        self.tag = f"ev_{system.key.replace('-', '_')}_{uuid.uuid4().hex[:10]}"
        self.worker: subprocess.Popen | None = None
        self.log = system.workdir / f"{self.tag}.log"

    def __enter__(self) -> Measurement:
        if not isinstance(self.system, EchoMQDjango):
            self.system.open(self.tag)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.worker is not None:
                self.stop_worker()
        finally:
            try:
                if not isinstance(self.system, EchoMQDjango):
                    self.system.close()
            finally:
                drop(self.client, f"*{self.tag}*")

    def start_worker(self, concurrency: int) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(self.system.workdir), str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        with open(self.log, "w") as log:
            # A session of its own: its process group holds the worker's children too (Celery's, Dramatiq's).
            self.worker = subprocess.Popen(self.system.worker(concurrency), cwd=ROOT, env=env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)

    def stop_worker(self) -> None:
        """SIGTERM (a graceful stop), a short wait, then SIGKILL to what is left of its process group.

        The figure is measured by then and its keys are dropped next: a worker that stops slowly
        (Dramatiq and Celery take 2-3 s) need not be waited for.
        """
        assert self.worker is not None
        if self.worker.poll() is None:
            self.worker.terminate()
            try:
                self.worker.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.worker.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.worker.wait()

    def check_worker(self, what: str, deadline: float) -> None:
        """RuntimeError when the worker has exited or `deadline` (time.monotonic) has passed."""
        assert self.worker is not None
        if self.worker.poll() is not None or time.monotonic() > deadline:
            state = f"exited {self.worker.returncode}" if self.worker.returncode is not None else "timed out"
            raise RuntimeError(f"{self.system.label}: {what}: the worker {state}: {self.log.read_text()[-2000:]}")

    def wait_mark(self, suffix: str, timeout: float, what: str) -> float:
        """The first value the handlers RPUSHed to `<tag><suffix>` (a blocking pop: no polling load)."""
        deadline = time.monotonic() + timeout
        while (reply := self.client.blpop([self.tag + suffix], timeout=1)) is None:
            self.check_worker(what, deadline)
        return float(reply[1])

    def wait_count(self, suffix: str, count: int, timeout: float, what: str, every: float = 0.1) -> list[str]:
        deadline = time.monotonic() + timeout
        while self.client.llen(self.tag + suffix) < count:
            self.check_worker(what, deadline)
            time.sleep(every)
        return self.client.lrange(self.tag + suffix, 0, -1)


def measure_enqueue(system: System, client: redis.Redis, calls: int, warm: int) -> dict[str, float]:
    with Measurement(system, client) as m:
        if isinstance(system, EchoMQDjango):
            proc = subprocess.run([sys.executable, "-c", _DJANGO_ENQUEUE, system.url, m.tag, system.path,
                                   str(calls), str(warm)], capture_output=True, text=True, timeout=calls / 50 + 120,
                                  cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                      p for p in (str(BENCH), str(ROOT), os.environ.get("PYTHONPATH")) if p)})
            rate = parse_rate(proc)
            cpu_us = float(next(line.split()[1] for line in proc.stdout.splitlines() if line.startswith("CPU_US ")))
        else:
            rate, cpu_us = timed_calls(system.enqueue_noops, calls, warm)
    return {"enqueue": rate, "enqueue_cpu_us": cpu_us}


def measure_latency(system: System, client: redis.Redis, jobs: int) -> dict[str, float]:
    with Measurement(system, client) as m:
        m.start_worker(1)
        for n in range(3):  # the worker is up, connected and has run a job: it is idle now
            system.add("ping", [time.time()])
            m.wait_mark(":lat", 120 if n == 0 else 30, "warm-up job")
        client.delete(m.tag + ":lat")
        started = time.perf_counter()
        for n in range(jobs):
            time.sleep(max(0.0, started + n * GAP_S - time.perf_counter()))
            sent = time.time()
            system.add("ping", [sent])
        ms = [float(value) * 1000 for value in m.wait_count(":lat", jobs, 60, "latency jobs", every=0.05)]
    return {"latency_p50": percentile(ms, 50), "latency_p99": percentile(ms, 99), "latency_max": max(ms)}


def redis_usec(client: redis.Redis) -> int:
    """Redis's time in commands so far, all of them (INFO commandstats: a script counts whole, once)."""
    return sum(stats["usec"] for stats in client.info("commandstats").values())


def measure_rate(system: System, client: redis.Redis, jobs: int, concurrency: int,
                 sleep_s: float = 0.0) -> tuple[float, float]:
    """(jobs/s, Redis µs per job) of one worker process at `concurrency` through `jobs` jobs enqueued first.

    No-op jobs, or jobs sleeping `sleep_s`; from job 0's start to job N-1's end, as the handlers say.
    Redis's time is all its commands' from the worker's start to the last job's mark (the worker's own
    start-up and this harness's few waits included), over the jobs.
    """
    with Measurement(system, client) as m:
        if sleep_s:
            system.add_bulk("nap", [[n, jobs - 1, sleep_s] for n in range(jobs)])
        else:
            system.add_bulk("noop", [[n, jobs - 1] for n in range(jobs)])
        before = redis_usec(client)
        m.start_worker(concurrency)
        last = m.wait_mark(":last", jobs / 100 + 120, f"{jobs} jobs at concurrency {concurrency}")
        redis_us = (redis_usec(client) - before) / jobs
        first = float(client.lindex(m.tag + ":first", 0))
    return jobs / (last - first), redis_us


def measure_sleep(system: System, client: redis.Redis, jobs: int) -> dict[str, float]:
    rate, _ = measure_rate(system, client, jobs, SLEEP_CONCURRENCY, SLEEP_S)
    return {"sleep": rate, "sleep_pct": 100 * rate / IDEAL}


def measure_system(system: System, client: redis.Redis, figures: list[str], size: dict[str, Any]) -> dict[str, Any]:
    """Every selected figure of one system, once: a number, None (n/a) or "error"."""
    found: dict[str, Any] = {}
    jobs = size["jobs"].get(system.key, size["default_jobs"])
    for figure in figures:
        keys = {"enqueue": ["enqueue", "enqueue_cpu_us"], "latency": ["latency_p50", "latency_p99", "latency_max"],
                "sleep": ["sleep", "sleep_pct"], "c1": ["c1", "c1_redis_us"]}.get(figure, [figure])
        if figure not in system.figures:
            found.update(dict.fromkeys(keys, None))
            continue
        try:
            if figure == "enqueue":
                found.update(measure_enqueue(system, client, size["calls"], size["warm"]))
            elif figure == "latency":
                found.update(measure_latency(system, client, size["latency"]))
            elif figure == "sleep":
                found.update(measure_sleep(system, client, size["sleep"]))
            else:
                found[figure], redis_us = measure_rate(system, client, jobs, CONCURRENCY[figure])
                if figure == "c1":  # one job at a time: each job's Redis time is on its critical path
                    found["c1_redis_us"] = redis_us
        except Exception as error:  # one failed figure must not lose the run
            print(f"  {system.label}, {figure}: {type(error).__name__}: {str(error)[-1500:]}", file=sys.stderr)
            found.update(dict.fromkeys(keys, "error"))
    return found


# ---------------------------------------------------------------- physical limits

_RATE = re.compile(r"([\d.]+) requests per second")


def physical_limits(url: str, requests: int, pings: int) -> dict[str, float]:
    """One client's round trips a second: redis-benchmark's, and redis-py's ping() in this process."""
    limits: dict[str, float] = {}
    client = redis.Redis.from_url(url)
    tag = f"ev_limits_{uuid.uuid4().hex[:10]}"
    binary = shutil.which("redis-benchmark")
    parts = urlsplit(url)
    if binary is None:
        print("redis-benchmark is not installed: its limits are left out", file=sys.stderr)
    elif parts.scheme != "redis":
        print(f"redis-benchmark needs a redis:// URL, not {parts.scheme}://: its limits are left out", file=sys.stderr)
    else:
        base = [binary, "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 6379), "-c", "1",
                "-n", str(requests), "-q"]
        if parts.password:
            base += ["-a", unquote(parts.password), "--no-auth-warning"]
        if parts.path.strip("/"):
            base += ["--dbnum", parts.path.strip("/")]
        sha = client.script_load("return 1")
        try:
            for name, command in (("PING_INLINE", ["-t", "ping_inline"]), ("SET", ["SET", f"{tag}:k", "v"]),
                                  ("LPUSH", ["LPUSH", f"{tag}:l", "x"]), ("EVALSHA (return 1)", ["EVALSHA", sha, "0"])):
                proc = subprocess.run(base + command, capture_output=True, text=True, timeout=300)
                rates = _RATE.findall(proc.stdout)
                if proc.returncode != 0 or not rates:
                    print(f"redis-benchmark {name} failed: {proc.stdout[-500:]} {proc.stderr[-500:]}", file=sys.stderr)
                    continue
                limits[f"redis-benchmark {name}"] = float(rates[-1])
        finally:
            client.delete(f"{tag}:k", f"{tag}:l")
    for _ in range(200):
        client.ping()
    started = time.perf_counter()
    for _ in range(pings):
        client.ping()
    limits["redis-py ping()"] = pings / (time.perf_counter() - started)
    client.close()
    return limits


# ---------------------------------------------------------------- the run

def run(url: str | None = None, rounds: int | None = None, quick: bool = False, only: list[str] | None = None,
        figures: list[str] | None = None, limits: bool = True) -> dict[str, Any]:
    """Measure every selected system and figure `rounds` times; a private Redis when `url` is None."""
    figures = [figure for figure in FIGURES if figure in (figures or FIGURES)]
    rounds = rounds or (1 if quick else 3)
    size = sizes(quick)
    workdir = Path(tempfile.mkdtemp(prefix="echomq-everyday-"))
    server = None
    try:
        if url is None:
            server, url = start_redis(workdir)
        sys.path.insert(0, str(workdir))  # the tasks modules
        client = redis.Redis.from_url(url, decode_responses=True)
        systems = []
        for system in all_systems(url, workdir):
            if not selected(system, only):
                continue
            missing = [name for name in system.needs if importlib.util.find_spec(name) is None]
            if missing:
                print(f"{system.label}: skipped, {', '.join(missing)} not installed (pip install -e '.[bench]')",
                      file=sys.stderr)
                continue
            systems.append(system)
        result: dict[str, Any] = {
            "redis": client.info("server")["redis_version"], "url_private": server is not None,
            "python": sys.version.split()[0], "cpus": os.cpu_count(), "quick": quick, "rounds": rounds,
            "figures": figures, "systems": [system.label for system in systems],
            "sizes": {"enqueue_calls": size["calls"], "latency_jobs": size["latency"], "sleep_jobs": size["sleep"],
                      "noop_jobs": {s.label: size["jobs"].get(s.key, size["default_jobs"]) for s in systems}},
            "limits": physical_limits(url, size["limit_requests"], size["pings"]) if limits else {},
            "by_round": [],
        }
        started = time.monotonic()
        for n in range(rounds):
            turn = n % len(systems) if systems else 0
            found = {}
            for system in systems[turn:] + systems[:turn]:
                began = time.monotonic()
                found[system.label] = measure_system(system, client, figures, size)
                print(f"round {n + 1}/{rounds}: {system.label:<20} {time.monotonic() - began:6.1f} s", file=sys.stderr)
            result["by_round"].append(found)
        result["seconds"] = round(time.monotonic() - started, 1)
        result["median"] = {system.label: medians([found[system.label] for found in result["by_round"]])
                            for system in systems}
        return result
    finally:
        if server is not None:
            stop_process(server)
        if str(workdir) in sys.path:
            sys.path.remove(str(workdir))
        shutil.rmtree(workdir, ignore_errors=True)


def medians(found: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median of the rounds that measured it; None (n/a) or "error" when none did."""
    merged: dict[str, Any] = {}
    for key in dict.fromkeys(key for one in found for key in one):
        values = [one.get(key) for one in found]
        numbers = [value for value in values if isinstance(value, (int, float))]
        merged[key] = statistics.median(numbers) if numbers else "error" if "error" in values else None
    return merged


# ---------------------------------------------------------------- the tables

# (key, row title, format, higher is better)
ROWS = [
    ("enqueue", "single enqueue, jobs/s", "{:,.0f}", True),
    ("enqueue_cpu_us", "  CPU per enqueue, µs", "{:,.1f}", False),
    ("latency_p50", "pickup latency p50, ms", "{:,.2f}", False),
    ("latency_p99", "  p99, ms", "{:,.2f}", False),
    ("latency_max", "  max, ms", "{:,.2f}", False),
    ("c1", "no-op jobs/s, concurrency 1", "{:,.0f}", True),
    ("c1_redis_us", "  Redis time per job, µs", "{:,.1f}", False),
    ("c8", "no-op jobs/s, concurrency 8", "{:,.0f}", True),
    ("c32", "no-op jobs/s, concurrency 32", "{:,.0f}", True),
    ("sleep", "50 ms jobs/s, concurrency 32", "{:,.0f}", True),
    ("sleep_pct", "  % of ideal (640/s)", "{:.1f}%", True),
]
# Not peers: echomq's own rows, and the floor of any Tasks backend (Django's own work in Task.enqueue).
ECHOMQ = ("echomq", "echomq @job", "echomq Task.enqueue", DJANGO_FLOOR, "echomq, pool")


def cell(value: Any, form: str) -> str:
    if value is None:
        return "n/a"
    if value == "error":
        return "err"
    return form.format(value)


def best_peer(result: dict[str, Any], key: str, higher: bool) -> tuple[str, float] | None:
    """(label, value) of the peer with the best median on `key`, or None when no peer has one."""
    found = [(label, figures[key]) for label, figures in result["median"].items()
             if label not in ECHOMQ and isinstance(figures.get(key), (int, float))]
    if not found:
        return None
    return (max if higher else min)(found, key=lambda pair: pair[1])


def print_tables(result: dict[str, Any]) -> None:
    private = "private, no persistence" if result["url_private"] else "given by --redis-url"
    print(f"\nRedis {result['redis']} ({private}); python {result['python']}; {result['cpus']} CPUs; "
          f"median of {result['rounds']} round(s){' (--quick: the numbers mean little)' if result['quick'] else ''}")
    sizes_ = result["sizes"]
    noop = ", ".join(f"{label} {jobs:,}" for label, jobs in sizes_["noop_jobs"].items()
                     if label not in ECHOMQ[1:])
    print(f"enqueue {sizes_['enqueue_calls']:,} calls; latency {sizes_['latency_jobs']:,} jobs, one per "
          f"{GAP_S * 1000:.0f} ms; sleep {sizes_['sleep_jobs']:,} jobs; no-op jobs: {noop}")
    if result["limits"]:
        print("\nphysical limits, one client, round trips/s: " +
              "; ".join(f"{name} {rate:,.0f}" for name, rate in result["limits"].items()))

    labels = result["systems"]
    if not labels:
        return
    keys = {key for figures in result["median"].values() for key in figures}
    rows = [row for row in ROWS if row[0] in keys]
    first = max(len(title) for _, title, _, _ in rows) + 2
    widths = [max(len(label), 9) + 2 for label in labels]
    print()
    print(f"{'':<{first}}" + "".join(f"{label:>{width}}" for label, width in zip(labels, widths)))
    for key, title, form, _ in rows:
        print(f"{title:<{first}}" + "".join(f"{cell(result['median'][label].get(key, None), form):>{width}}"
                                            if key in result["median"][label] else f"{'-':>{width}}"
                                            for label, width in zip(labels, widths)))

    # echomq against the fastest peer: (row, echomq's label, key, higher is better, the target as a bound)
    targets = [
        ("single enqueue", "echomq", "enqueue", True, 1.2, ">="),
        ("single enqueue, @job", "echomq @job", "enqueue", True, 1.2, ">="),
        ("single enqueue, Task.enqueue", "echomq Task.enqueue", "enqueue", True, 1.2, ">="),
        ("pickup latency p50", "echomq", "latency_p50", False, 0.8, "<="),
        ("pickup latency p99", "echomq", "latency_p99", False, 1.0, "<="),
        ("no-op, concurrency 1", "echomq", "c1", True, 1.5, ">="),
        ("no-op, concurrency 8", "echomq", "c8", True, 1.0, ">"),
        ("no-op, concurrency 32", "echomq", "c32", True, 1.0, ">"),
    ]
    table = []
    for title, ours_label, key, higher, bound, relation in targets:
        form = next(form for row_key, _, form, _ in ROWS if row_key == key)
        ours = result["median"].get(ours_label, {}).get(key)
        peer = best_peer(result, key, higher)
        if not isinstance(ours, (int, float)) or peer is None:
            continue
        ratio = ours / peer[1] if peer[1] else float("inf")
        met = {">=": ratio >= bound, ">": ratio > bound, "<=": ratio <= bound}[relation]
        table.append((title, form.format(ours), f"{peer[0]} {form.format(peer[1])}", f"{ratio:.2f}",
                      f"{relation} {bound:g} x", "yes" if met else "NO"))
    ours = result["median"].get("echomq", {}).get("sleep_pct")
    if isinstance(ours, (int, float)):
        peer = best_peer(result, "sleep_pct", True)
        table.append(("50 ms jobs, concurrency 32", f"{ours:.1f}%", f"{peer[0]} {peer[1]:.1f}%" if peer else "-",
                      "", ">= 97% of ideal", "yes" if ours >= 97 else "NO"))
    if not table:
        return
    header = ("echomq vs the fastest peer", "echomq", "fastest peer", "ratio", "target", "met")
    widths = [max(len(row[n]) for row in table + [header]) for n in range(6)]
    print("\nratio = echomq / the fastest peer (latency: / the lowest peer; lower is better there)")
    for row in [header] + table:
        print(f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:>{widths[2]}}  {row[3]:>{widths[3]}}  "
              f"{row[4]:<{widths[4]}}  {row[5]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="use this Redis instead of a private redis-server (an idle one)")
    parser.add_argument("--rounds", type=int, help="rounds, each measuring every system once (3; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script runs")
    parser.add_argument("--only", help="systems, comma-separated: echomq (its rows, and Django's floor), "
                                       "echomq-job, echomq-task, echomq-dummy, huey, dramatiq, celery (both "
                                       "pools), celery-prefork, celery-threads, rq, bullmq")
    parser.add_argument("--figures", default=",".join(FIGURES), help="comma-separated, of " + ",".join(FIGURES))
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    parser.add_argument("--plot", type=Path, help="draw the figures against the fastest peer's to this PNG")
    args = parser.parse_args()
    figures = [figure.strip() for figure in args.figures.split(",") if figure.strip()]
    if unknown := set(figures) - set(FIGURES):
        parser.error(f"unknown figures: {', '.join(sorted(unknown))}")
    only = [name.strip() for name in args.only.split(",")] if args.only else None
    result = run(args.redis_url, args.rounds, args.quick, only, figures)
    print_tables(result)
    if args.json:
        print(json.dumps(result, indent=1))
    if args.plot:
        plot(result, args.plot)


def plot(result: dict[str, Any], path: Path) -> None:
    """Each system's figures as a share of the best peer's (1 = as good; above 1, better), one bar each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [("enqueue", "single enqueue", True), ("latency_p50", "pickup latency p50", False),
             ("latency_p99", "pickup latency p99", False), ("c1", "no-op, concurrency 1", True),
             ("c8", "no-op, concurrency 8", True), ("c32", "no-op, concurrency 32", True),
             ("sleep", "50 ms jobs, concurrency 32", True)]
    labels = [label for label in result["systems"] if label != DJANGO_FLOOR]
    figure, axis = plt.subplots(figsize=(10, 4.8), dpi=120)
    width = 0.8 / len(labels)
    for n, label in enumerate(labels):
        heights = []
        for key, _title, higher in shown:
            ours, best = result["median"][label].get(key), best_peer(result, key, higher)
            good = isinstance(ours, (int, float)) and best and ours
            heights.append((ours / best[1] if higher else best[1] / ours) if good else 0)
        axis.bar([i + n * width for i in range(len(shown))], heights, width, label=label)
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks([i + width * (len(labels) - 1) / 2 for i in range(len(shown))])
    axis.set_xticklabels([title for _, title, _ in shown], rotation=20, ha="right", fontsize=8)
    axis.set_ylabel("against the best peer (1 = as good, higher is better)")
    axis.set_title(f"The figures a user feels: median of {result['rounds']} rounds, one run")
    axis.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    figure.savefig(path)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
