"""`manage.py echomq_demo`: the stalled-job story, then the admin to look at it."""

import json
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
from django.urls import reverse

from demo_project.demo_app import tasks
from demo_project.demo_app.jobs import API, HEAVY, QUEUE, STORY, add_up, call_api, export, import_rows, stuck
from demo_project.demo_app.relay import Relay, SweepNarrator
from demo_project.shop.tasks import place_order
from echomq_django.conf import get_settings
from echomq_django.core import connect
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.worker.sweeper import last_sweep
from echomq_django.queues import get_queue
from echomq_django.workflows import chord, group

MANAGE = str(Path(__file__).resolve().parents[4] / "manage.py")
FINISHED = ("completed", "failed")
INTRODUCTION = """\
Each line of a worker or of the sweeper starts with its name. A worker says when a job starts,
completes or fails; the sweeper sweeps every configured queue, says what each sweep did, and
keeps the admin's copy of the failed and stalled jobs (the "mirror", in the database) in step.
"Task id=... state=..." lines are Django's Tasks framework reporting the task add(2, 3), which
runs on echomq like the jobs. Two schedulers (beat 1, beat 2) fire the schedule "heartbeat" of
ECHOMQ["SCHEDULES"] every 3 s: each tick becomes one job, added by whichever beat decides it first."""


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
        self.children: list[tuple[subprocess.Popen, Relay | None]] = []
        redis_dir: tempfile.TemporaryDirectory | None = None
        try:
            if not os.environ.get("ECHOMQ_REDIS_URL"):
                redis_dir = tempfile.TemporaryDirectory(prefix="echomq-demo-redis-")
                self.start_private_redis(redis_dir.name)
            call_command("migrate", verbosity=0)
            password = self.create_admin(port)
            sweeper = self.tell_the_story()
            sweeper.quiet.set()  # from here on its routine lines would bury what follows
            admin = f"http://127.0.0.1:{port}/admin/"
            if no_serve:
                self.stdout.write(self.style.SUCCESS(
                    f"\nThe admin user is admin, password {password}: `python manage.py runserver {port}` "
                    f"serves the admin at {admin}"))
                return
            runserver = self.start("runserver", f"127.0.0.1:{port}", "--noreload", label="runserver")
            runserver.quiet.set()  # its banner would bury the address; its request log (stderr) shows
            self.stdout.write(self.style.SUCCESS(
                f"\nThe admin is at {admin} (user admin, password {password}); logged in, the Prometheus "
                f"metrics are at http://127.0.0.1:{port}/echomq/metrics/. The worker and the sweeper "
                "keep running (the sweeper now shows only warnings); Ctrl-C stops everything the demo started."))
            runserver.process.wait()
        except KeyboardInterrupt:
            self.stdout.write("\nstopping the demo")
        finally:
            self.stop_children()
            if redis_dir is not None:
                redis_dir.cleanup()

    def start(self, *args: str, label: str, annotate: Any = None) -> Relay:
        """Run `manage.py *args` in a session of its own, its output relayed under `label`."""
        process = subprocess.Popen([sys.executable, "-u", MANAGE, *args], start_new_session=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        relay = Relay(process, label, self.stdout, self.stderr, annotate)
        self.children.append((process, relay))
        return relay

    def stop_children(self) -> None:
        for _process, relay in self.children:
            if relay:
                relay.quiet.set()  # their goodbyes would only bury the last message
        for process, relay in reversed(self.children):
            if process.poll() is None:
                process.terminate()
                process.wait(15)
            if relay:
                relay.join(5)

    def start_private_redis(self, directory: str) -> None:
        """A throwaway redis-server on a free loopback port, used by every child process."""
        binary = shutil.which("redis-server")
        if not binary:
            raise CommandError("redis-server is not installed: install it, or set ECHOMQ_REDIS_URL")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            redis_port = probe.getsockname()[1]
        process = subprocess.Popen(
            [binary, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", directory, "--maxmemory-policy", "noeviction"],
            stdout=subprocess.DEVNULL, start_new_session=True)
        self.children.append((process, None))
        url = f"redis://127.0.0.1:{redis_port}/0"
        os.environ["ECHOMQ_REDIS_URL"] = url  # for the child processes
        settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": url}
        setting_changed.send(sender=type(self), setting="ECHOMQ", value=settings.ECHOMQ, enter=True)
        client = connect(url, retry=None, retry_on_error=[])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                client.ping()
                self.stdout.write(f"started a private redis-server for the demo at {url}")
                return
            except Exception:
                time.sleep(0.05)
        raise CommandError(f"the private redis-server on port {redis_port} did not start")

    def create_admin(self, port: int) -> str:
        password = secrets.token_urlsafe(9)
        user, _ = get_user_model().objects.get_or_create(
            username="admin", defaults={"is_staff": True, "is_superuser": True})
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"admin user: admin / {password}  (for http://127.0.0.1:{port}/admin/)")
        return password

    def tell_the_story(self) -> Relay:
        """Enqueue the jobs, let a worker die on one, watch the sweeper and a second worker; returns the sweeper."""
        queue = get_queue(QUEUE)
        queue.obliterate()
        ids = [function.enqueue(*args) for function, args in STORY]
        names = {job_id: function.func.__name__ for job_id, (function, _) in zip(ids, STORY)}
        task_result = tasks.add.using(queue_name=QUEUE).enqueue(2, 3)  # Django's Tasks framework, on echomq
        self.stdout.write(f"enqueued {len(ids)} jobs on queue {QUEUE!r}: " + ", ".join(
            f"{job_id} {name}" for job_id, name in names.items()))
        self.stdout.write(f"\n{INTRODUCTION}\n")
        config = get_settings().queue(QUEUE)
        for number in (1, 2):
            self.start("echomq_beat", label=f"beat {number}")
        first = self.start("echomq_worker", "--queue", QUEUE, label="worker 1")
        process = first.process
        process.wait(60)
        first.join(5)
        died_in = ", ".join(f"job {job.id} ({names.get(job.id, job.name)})" for job in queue.get_jobs("active"))
        self.stdout.write(self.style.WARNING(
            f"worker 1 died (exit {process.returncode}) in the middle of {died_in or 'a job'}; its lock lapses "
            f"within {config.lock_duration_ms / 1000:g} s, then a sweep marks the job and the next one recovers it"))
        sweeper = self.start("echomq_sweep", label="sweeper", annotate=SweepNarrator(queue, names))
        self.start("echomq_worker", "--queue", QUEUE, label="worker 2")
        self.wait_for(lambda: all(queue.get_state(i) in FINISHED for i in ids), "the jobs to finish")
        finished_ms = now_ms()
        # The sweep after that brings the admin's copy up to date.
        self.wait_for(lambda: (last_sweep(queue.client, queue.keys) or {}).get("finished_at_ms", 0) > finished_ms,
                      "a sweep after the jobs finished")
        self.show(queue, ids)
        self.wait_for(lambda: process.pid not in [worker.pid for worker in queue.workers()],
                      "worker 1's record to lapse")
        self.stdout.write(f"\nworkers of {QUEUE!r} in the registry now (the admin's Workers page): " + "; ".join(
            f"pid {worker.pid}, {worker.pool} x{worker.concurrency}, {worker.done} done"
            for worker in queue.workers()) + f"; worker 1 (pid {process.pid}) dropped out with its lock duration")
        self.wait_for(lambda: heartbeats(queue), "a heartbeat job to complete")
        self.stdout.write(f"\nschedule heartbeat: {heartbeats(queue)} of its jobs completed so far, one per tick "
                          "though two schedulers run (ids heartbeat@<tick ms>)")
        task_result.refresh()
        self.stdout.write(f"\nDjango task add(2, 3) through the Tasks framework: {task_result.status}, "
                          f"return value {task_result.return_value if task_result.is_finished else '-'}")
        self.workflow()
        self.celery_checkout()
        self.durable_approval()
        self.limit_and_cancel()
        self.rate_limits_and_groups()
        return sweeper

    def workflow(self) -> None:
        """A chord: three imports at once, then their sum, once, decided in the script that ends the last one."""
        result = chord(group(import_rows.s(rows) for rows in (10, 20, 30)), add_up.s()).enqueue()
        self.wait_for(lambda: result.status in ("succeeded", "failed"), "the workflow")
        self.stdout.write(
            f"\nworkflow {result.id}: a chord of three import_rows jobs, then add_up once with their results: "
            f"{result.status}, {result.results() if result.status == 'succeeded' else result.reason} rows "
            f"(its page: /admin/echomq/job/{QUEUE}/workflow/{result.id}/)")

    def celery_checkout(self) -> None:
        """A Celery project's tasks (demo_project/shop/tasks.py, only its imports changed), on this queue."""
        receipt = place_order([(250, 2), (100, 1)], "busy-once", "ada@example.com", queue=QUEUE)
        self.wait_for(receipt.ready, "the Celery-style checkout")
        self.stdout.write(
            f"\nCelery-style checkout (demo_project/shop/tasks.py: shared_task, self.retry, a chord piped into a "
            f"chain, link_error; only its imports changed): {receipt.state}, {receipt.get(timeout=5)!r}; the "
            f"charge ran {receipt.parent.parent.get(timeout=5)['attempt']} times (self.retry once)")

    def durable_approval(self) -> None:
        """A durable task: a recorded step, then parked with no worker held until its signal comes."""
        queue = get_queue(QUEUE)
        result = tasks.approve_order.using(queue_name=QUEUE).enqueue(7)
        self.wait_for(lambda: queue.get_state(result.id) == "parked", "the durable task to park")
        self.stdout.write(
            f"\ndurable task approve_order(7) (demo_app/tasks.py: step, then wait_for_signal): job {result.id} is "
            f"parked, holding no worker slot (its page: /admin/echomq/job/{QUEUE}/job/{result.id}/, where "
            "\"Send signal\" delivers one too)")
        queue.signal(result.id, "approved", {"by": "the demo"})
        self.wait_for(lambda: queue.get_state(result.id) == "completed", "the durable task to resume")
        self.stdout.write(f"signal \"approved\" sent: it resumed and returned {queue.get_job(result.id).returnvalue!r}")

    def limit_and_cancel(self) -> None:
        """A job stopped by its time limit and one cancelled while it runs, on the processes pool."""
        queue = get_queue(HEAVY)
        queue.obliterate()
        hung, long = stuck.enqueue(), export.enqueue(600)
        self.stdout.write(
            f"\nQueue {HEAVY!r} runs its jobs in child processes (POOL \"processes\"). Job {hung} (stuck) hangs "
            f"past its time limit of 2 s; job {long} (export) runs for minutes, and is cancelled while it runs.")
        self.start("echomq_worker", "--queue", HEAVY, label="worker 3")
        self.wait_for(lambda: (queue.get_job(long).progress or {}).get("rows", 0) >= 3, "the export to start")
        answer = queue.cancel(long, "not needed any more")
        self.stdout.write(f"cancel of job {long} (export) while it runs: {answer.value}; its worker stops it at its "
                          "next lock renewal, by killing the child that runs it")
        self.wait_for(lambda: all(queue.get_state(i) in FINISHED for i in (hung, long)), "the heavy jobs to end")
        for job_id, name in ((hung, "stuck"), (long, "export")):
            job = queue.get_job(job_id)
            self.stdout.write(f"job {job_id} ({name}) of {HEAVY!r}: {queue.get_state(job_id)}, {job.failed_reason}")

    def rate_limits_and_groups(self) -> None:
        """A rate limit and groups that hold across workers, and a job told to slow down (RateLimited)."""
        queue = get_queue(API)
        queue.obliterate()
        first = [call_api.enqueue_with(args=("tenant-a", n), group="tenant-a") for n in range(12)]
        second = [call_api.enqueue_with(args=("tenant-b", n), group="tenant-b") for n in range(3)]
        self.stdout.write(
            f"\nQueue {API!r} starts at most 5 jobs a second and one per tenant at a time, across all its workers "
            f"(RATE_LIMIT, GROUP_MAX_ACTIVE). tenant-a queued its 12 calls first, tenant-b its 3 after; tenant-b's "
            f"first call (job {second[0]}) gets a 429 and raises RateLimited(retry_after=1).")
        for number in (4, 5):
            self.start("echomq_worker", "--queue", API, label=f"worker {number}")
        self.wait_for(lambda: all(queue.get_state(i) == "completed" for i in first + second), "the API calls")
        order = [job_id for _, job_id in sorted(
            (int(entry_id.split("-")[0]), fields["jobId"])
            for entry_id, fields in queue.client.xrange(queue.keys.events) if fields["event"] == "active")]
        started = [queue.get_job(job_id).started_on or 0 for job_id in first + second]
        limited = queue.get_job(second[0])
        self.stdout.write(
            f"queue {API!r}: 15 calls started over {(max(started) - min(started)) / 1000:.1f} s by two workers; "
            f"tenant-b's calls were starts {', '.join(str(order.index(i) + 1) for i in second)} of {len(order)} "
            f"(a retry after the pause counts as a start); job {second[0]} paused the whole queue for 1 s and "
            f"completed with {limited.attempts_made} attempt made, {limited.attempts_started} started")

    def wait_for(self, condition: Any, what: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                raise CommandError(f"gave up waiting for {what} after {timeout_s:g} s")
            time.sleep(0.2)

    def show(self, queue: Any, ids: list[str]) -> None:
        self.stdout.write(f"\n{'id':<8} {'job':<11} {'state':<10} {'attempts':>8} {'stalls':>6}  outcome")
        for job_id in ids:
            job, state = queue.get_job(job_id), queue.get_state(job_id)
            outcome = job.failed_reason if state == "failed" else repr(job.returnvalue)
            short_name = job.name.rsplit(".", 1)[-1]
            self.stdout.write(f"{job_id:<8} {short_name:<11} {state:<10} {job.attempts_made:>8} "
                              f"{job.stall_count:>6}  {outcome}")
        for job_id in ids:
            job = queue.get_job(job_id)
            if job.logs:
                self.stdout.write(
                    f"\njob {job_id} ({job.name.rsplit('.', 1)[-1]}) logged {len(job.logs)} lines and last reported "
                    f"{json.dumps(job.progress)}: see its page, "
                    f"{reverse('admin:echomq_job_detail', args=[queue.name, job_id])}")


def heartbeats(queue: Any) -> int:
    """The heartbeat jobs completed (the schedule's jobs have ids heartbeat@<tick>)."""
    return sum(job_id.startswith("heartbeat@") for job_id in queue.client.zrange(queue.keys.completed, 0, -1))
