"""`manage.py echomq_demo`: the stalled-job story, then the admin to look at it."""

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.signals import setting_changed

from demo_project.demo_app import tasks
from demo_project.demo_app.jobs import QUEUE, STORY
from echomq_django.conf import get_settings
from echomq_django.core import connect
from echomq_django.queues import get_queue

MANAGE = str(Path(__file__).resolve().parents[4] / "manage.py")
FINISHED = ("completed", "failed")


class Command(BaseCommand):
    help = ("Migrate, create an admin user, enqueue the demo jobs, run a worker (which dies mid-job), "
            "a second worker and a sweeper, then serve the admin until Ctrl-C.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--no-serve", action="store_true",
                            help="Stop after the story instead of serving the admin.")
        parser.add_argument("--port", type=int, default=8000, help="Port of the admin (default: %(default)r).")

    def handle(self, *, no_serve: bool, port: int, **options: Any) -> None:
        # Ctrl-C and SIGTERM both end the demo through the `finally` below. The
        # children run in sessions of their own, so a Ctrl-C reaches only this
        # process, which stops them in order: the processes, then Redis.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        children: list[subprocess.Popen] = []
        try:
            if not os.environ.get("ECHOMQ_REDIS_URL"):
                children.append(self.start_private_redis())
            call_command("migrate", verbosity=0)
            self.create_admin(port)
            self.tell_the_story(children)
            if no_serve:
                return
            self.stdout.write(self.style.SUCCESS(
                f"\nThe admin is at http://127.0.0.1:{port}/admin/ (worker and sweeper keep running); "
                "Ctrl-C stops everything the demo started."))
            children.append(self.manage("runserver", f"127.0.0.1:{port}", "--noreload", "-v", "0"))
            children[-1].wait()
        except KeyboardInterrupt:
            self.stdout.write("\nstopping the demo")
        finally:
            for child in reversed(children):
                if child.poll() is None:
                    child.terminate()
                    child.wait(15)

    def manage(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, MANAGE, *args], start_new_session=True)

    def start_private_redis(self) -> subprocess.Popen:
        """A throwaway redis-server on a free loopback port, used by every child process."""
        binary = shutil.which("redis-server")
        if not binary:
            raise CommandError("redis-server is not installed: install it, or set ECHOMQ_REDIS_URL")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            redis_port = probe.getsockname()[1]
        process = subprocess.Popen(
            [binary, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", tempfile.mkdtemp(prefix="echomq-demo-redis-"), "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, start_new_session=True)
        url = f"redis://127.0.0.1:{redis_port}/0"
        os.environ["ECHOMQ_REDIS_URL"] = url  # for the child processes
        settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": url}
        setting_changed.send(sender=type(self), setting="ECHOMQ", value=settings.ECHOMQ, enter=True)
        client = connect(url, retry=None, retry_on_error=[])
        for _ in range(100):
            try:
                client.ping()
                self.stdout.write(f"started a private redis-server for the demo at {url}")
                return process
            except Exception:
                time.sleep(0.05)
        process.terminate()
        raise CommandError(f"the private redis-server on port {redis_port} did not start")

    def create_admin(self, port: int) -> None:
        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True})
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"admin user: admin / {password}  (for http://127.0.0.1:{port}/admin/)")

    def tell_the_story(self, children: list[subprocess.Popen]) -> None:
        queue = get_queue(QUEUE)
        queue.obliterate()
        ids = [function.enqueue(*args) for function, args in STORY]
        task_result = tasks.add.using(queue_name=QUEUE).enqueue(2, 3)  # Django's Tasks framework, on echomq
        self.stdout.write(f"enqueued {len(ids)} jobs on queue {QUEUE!r}: " + ", ".join(
            f"{job_id} {function.func.__name__}" for job_id, (function, _) in zip(ids, STORY)))
        config = get_settings().queue(QUEUE)
        first = self.manage("echomq_worker", "--queue", QUEUE, "-v", "0")
        children.append(first)
        first.wait(60)
        self.stdout.write(self.style.WARNING(
            f"worker 1 died (exit {first.returncode}) in the middle of a job; its lock lapses within "
            f"{config.lock_duration_ms / 1000:g} s, then a sweep marks the job and the next one recovers it"))
        children.append(self.manage("echomq_sweep", "--queue", QUEUE))
        children.append(self.manage("echomq_worker", "--queue", QUEUE, "-v", "0"))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(queue.get_state(i) in FINISHED for i in ids):
            time.sleep(0.2)
        time.sleep(config.sweep_interval_ms / 1000 + 0.5)  # one more sweep updates the admin's copy
        self.show(queue, ids)
        task_result.refresh()
        self.stdout.write(f"\nDjango task add(2, 3) through the Tasks framework: {task_result.status}, "
                          f"return value {task_result.return_value if task_result.is_finished else '-'}")

    def show(self, queue: Any, ids: list[str]) -> None:
        self.stdout.write(f"\n{'id':>3}  {'job':<7} {'state':<10} {'attempts':>8} {'stalls':>6}  outcome")
        unfinished = []
        for job_id in ids:
            job, state = queue.get_job(job_id), queue.get_state(job_id)
            if state not in FINISHED:
                unfinished.append(job_id)
            outcome = job.failed_reason if state == "failed" else repr(job.returnvalue)
            short_name = job.name.rsplit(".", 1)[-1]
            self.stdout.write(f"{job_id:>3}  {short_name:<7} {state:<10} {job.attempts_made:>8} "
                              f"{job.stall_count:>6}  {outcome}")
        if unfinished:
            raise CommandError(f"jobs {', '.join(unfinished)} did not finish within a minute")
