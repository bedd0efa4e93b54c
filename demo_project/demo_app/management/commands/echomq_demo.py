"""`manage.py echomq_demo`: the stalled-job story, start to end, in one terminal."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from demo_project.demo_app.jobs import QUEUE, STORY, handle
from echomq_django.conf import echomq_setting
from echomq_django.core import Queue, Sweeper, Worker, connect

LOCK_MS = 3000
SWEEP_INTERVAL_MS = 2000
MANAGE = Path(__file__).resolve().parents[4] / "manage.py"


class Command(BaseCommand):
    help = "Enqueue the demo jobs, run workers (one of which dies) and a sweeper, and show the outcome."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--worker", action="store_true", help="Run one demo worker (used by the demo itself).")

    def handle(self, *, worker: bool, **options: Any) -> None:
        if worker:
            return self.run_worker()
        redis_server = None
        if not os.environ.get("ECHOMQ_REDIS_URL"):
            redis_server, url = start_private_redis()
            os.environ["ECHOMQ_REDIS_URL"] = url
            settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": url}
            self.stdout.write(f"started a private redis-server for the demo at {url}")
        try:
            self.tell_the_story()
        finally:
            if redis_server:
                redis_server.terminate()
                redis_server.wait(10)

    def run_worker(self) -> None:
        client = connect(echomq_setting("REDIS_URL"))
        worker = Worker(QUEUE, handle, client, prefix=echomq_setting("PREFIX"), lock_duration_ms=LOCK_MS,
                        block_timeout_s=0.5)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: worker.stop())
        worker.run()

    def spawn_worker(self) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(MANAGE), "echomq_demo", "--worker"])

    def tell_the_story(self) -> None:
        client = connect(echomq_setting("REDIS_URL"))
        queue = Queue(QUEUE, client, prefix=echomq_setting("PREFIX"))
        queue.obliterate()
        ids = [queue.add(name, data, opts=opts) for name, data, opts in STORY]
        self.stdout.write(f"enqueued {len(ids)} jobs on queue {QUEUE!r}: " + ", ".join(
            f"{job_id} {name}" for job_id, (name, _, _) in zip(ids, STORY)))

        first = self.spawn_worker()
        sweeper = Sweeper(client, [QUEUE], prefix=echomq_setting("PREFIX"), interval_ms=SWEEP_INTERVAL_MS)
        sweeping = threading.Thread(
            target=sweeper.run, args=(lambda report: self.stdout.write("sweeper: " + report.summary()),),
            daemon=True)
        second = None
        try:
            first.wait(60)
            self.stdout.write(self.style.WARNING(
                f"worker 1 died (exit {first.returncode}) in the middle of a job; its lock will lapse "
                f"in {LOCK_MS / 1000:.0f} s"))
            sweeping.start()
            second = self.spawn_worker()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(
                    queue.get_state(job_id) in ("completed", "failed") for job_id in ids):
                time.sleep(0.2)
        finally:
            sweeper.stop()
            for process in (first, second):
                if process and process.poll() is None:
                    process.terminate()
                    process.wait(10)
        self.show(queue, ids)

    def show(self, queue: Queue, ids: list[str]) -> None:
        self.stdout.write("")
        self.stdout.write(f"{'id':>3}  {'name':<7} {'state':<10} {'atm':>3} {'stalls':>6}  outcome")
        for job_id in ids:
            job = queue.get_job(job_id)
            state = queue.get_state(job_id)
            outcome = job.failed_reason if state == "failed" else repr(job.returnvalue)
            self.stdout.write(f"{job_id:>3}  {job.name:<7} {state:<10} {job.attempts_made:>3} "
                              f"{job.stall_count:>6}  {outcome}")
        unfinished = [job_id for job_id in ids if queue.get_state(job_id) not in ("completed", "failed")]
        if unfinished:
            raise CommandError(f"jobs {', '.join(unfinished)} did not finish within a minute")


def start_private_redis() -> tuple[subprocess.Popen, str]:
    """Start a throwaway redis-server on a free loopback port; returns it and its URL."""
    binary = shutil.which("redis-server")
    if not binary:
        raise CommandError("redis-server is not installed: install it, or set ECHOMQ_REDIS_URL")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    workdir = tempfile.mkdtemp(prefix="echomq-demo-redis-")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir, "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    client = connect(url)
    for _ in range(100):
        try:
            client.ping()
            return process, url
        except Exception:
            time.sleep(0.05)
    process.terminate()
    raise CommandError(f"the private redis-server on port {port} did not start")
