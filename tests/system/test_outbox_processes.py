"""The outbox with real processes: a committing process killed at the worst moment, Redis away at the commit,
and several relays at once over one table."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from echomq_django.core import Queue, connect
from echomq_django.outbox import OutboxJob
from tests.helpers import script_calls, wait_until
from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Forks one process per transaction: each commits a job through the outbox and is killed (SIGKILL) by an
# on_commit callback registered before the enqueue's, so after the commit and before the send ("before");
# every third one is killed after the send instead ("after"), leaving Redis with the job and no row.
KILLED_AT_THE_COMMIT = textwrap.dedent("""
    import os, signal, sys
    import django
    django.setup()
    from django.db import connections, transaction
    from demo_project.demo_app.jobs import greet

    prefix, count = sys.argv[1], int(sys.argv[2])
    connections.close_all()
    for n in range(count):
        pid = os.fork()
        if pid == 0:
            kill = lambda: os.kill(os.getpid(), signal.SIGKILL)
            with transaction.atomic():
                if n % 3:
                    transaction.on_commit(kill)
                greet.enqueue_with(args=(f"#{n}",), job_id=f"{prefix}-{n}")
                if not n % 3:
                    transaction.on_commit(kill)
            os._exit(3)  # never reached: the process is killed at its commit
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (n, status)
    print("done", flush=True)
""")


def manage(env: dict[str, str], *args: str, timeout: float = 300) -> str:
    result = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def each_ran_once(queue: Queue, job_ids: list[str]) -> None:
    for job_id in job_ids:
        job, state = queue.get_job_with_state(job_id)
        assert job is not None and state == "completed", (job_id, state)
        assert job.attempts_started == 1, (job_id, job.attempts_started)


def test_a_process_killed_at_each_commit_200_times_loses_no_job_and_runs_none_twice(subprocess_env, redis_client,
                                                                                   prefix):
    env = {**subprocess_env, "ECHOMQ_OUTBOX": "1", "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    count = 200
    result = subprocess.run([sys.executable, "-c", KILLED_AT_THE_COMMIT, "k", str(count)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.stdout == "done\n", result.stderr[-3000:]
    demo = Queue("demo", redis_client, prefix=prefix)
    left = OutboxJob.objects.count()
    assert left == count - len(range(0, count, 3)), "each process killed before its send left its row"
    assert demo.counts()["wait"] == len(range(0, count, 3))
    assert "outbox: sent" in manage(env, "echomq_relay", "--once", "--after", "0.001")
    assert OutboxJob.objects.count() == 0
    manage(env, "echomq_worker", "--queue", "demo", "--burst", "-v", "0")
    each_ran_once(demo, [f"k-{n}" for n in range(count)])
    assert demo.counts()["completed"] == count


def test_redis_away_at_the_commit_for_20_s_every_request_succeeds_and_every_job_runs_once(
        subprocess_env, settings, prefix):
    from django.db import transaction

    from demo_project.demo_app.jobs import greet

    server = RedisServer("--save", "")
    server.start()
    env = {**subprocess_env, "ECHOMQ_OUTBOX": "1", "ECHOMQ_REDIS_URL": server.url}
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": server.url, "PREFIX": prefix, "OUTBOX": True,
                       "ENQUEUE_TIMEOUT": 0.5}
    try:
        relay = subprocess.Popen([sys.executable, "manage.py", "echomq_relay", "--after", "1"], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert relay.stdout.readline().startswith("relaying the outbox"), relay.stderr.read()[-3000:]
            server.stop()
            stopped = time.monotonic()
            ids = []
            for n in range(10):  # requests while Redis is away: each commits, none raises
                with transaction.atomic():
                    ids.append(greet.enqueue_with(args=(n,), job_id=f"o-{n}"))
            assert OutboxJob.objects.count() == 10
            # The outage the scenario is about: 20 s from the stop, measured, not a synchronisation.
            assert wait_until(lambda: time.monotonic() - stopped >= 20, 30)
            server.start()
            assert wait_until(lambda: not OutboxJob.objects.exists(), 60), "the relay sent them once Redis was back"
        finally:
            relay.send_signal(signal.SIGTERM)
            _out, err = relay.communicate(timeout=30)
        assert relay.returncode == 0, err[-3000:]
        manage(env, "echomq_worker", "--queue", "demo", "--burst", "-v", "0")
        each_ran_once(Queue("demo", connect(server.url), prefix=prefix), ids)
    finally:
        server.stop()
        server.workdir.cleanup()


ROWS = int(os.environ.get("ECHOMQ_OUTBOX_RELAY_ROWS", "50000"))


def test_three_relays_over_many_rows_add_each_job_once_in_a_call_per_timestamp_or_more(subprocess_env, prefix):
    from django.db import connection

    from echomq_django.core import now_ms

    server = RedisServer("--save", "")
    server.start()
    try:
        env = {**subprocess_env, "ECHOMQ_OUTBOX": "1", "ECHOMQ_REDIS_URL": server.url}
        then = now_ms() - 10_000  # ROWS rows over 1,000 timestamps: no script call sends rows of two
        OutboxJob.objects.bulk_create(
            [OutboxJob(queue="demo", job_id=f"r-{n}", name="demo_project.demo_app.jobs.greet",
                       data='{"args": ["x"], "kwargs": {}}', opts='{"attempts": 3}', timestamp_ms=then + n % 1000)
             for n in range(ROWS)], batch_size=5000)
        relays = [subprocess.Popen([sys.executable, "manage.py", "echomq_relay", "-v", "2"], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
        try:
            assert wait_until(lambda: not OutboxJob.objects.exists(), 400), OutboxJob.objects.count()
        finally:
            outputs = []
            for relay in relays:
                relay.send_signal(signal.SIGTERM)
                outputs.append(relay.communicate(timeout=60))
        assert all(relay.returncode == 0 for relay in relays), [err[-2000:] for _, err in outputs]
        client = redis.Redis.from_url(server.url, decode_responses=True, encoding_errors="replace")
        demo = Queue("demo", client, prefix=prefix)
        assert demo.counts()["wait"] == ROWS
        assert client.zcard(demo.keys.sent) == ROWS
        sent = sum(int(line.split("sent ")[1].split(" ")[0]) for out, err in outputs
                   for line in (out + err).splitlines() if "outbox relay: sent" in line)
        if connection.features.has_select_for_update_skip_locked:
            assert sent == ROWS, "with SKIP LOCKED, no row is sent by two relays"
        assert sent >= ROWS
        # Counted, not timed (a slow log's 50 ms is a busy machine's stall as often as a long call): each call is
        # short because it carries one timestamp's rows, at most SEND_JOBS_PER_CALL (tests/django/test_outbox.py).
        assert script_calls(client) >= min(ROWS, 1000), "a script call sent the rows of more than one timestamp"
    finally:
        server.stop()
        server.workdir.cleanup()


# Forks one process per transaction: each commits a workflow through the outbox and is killed (SIGKILL) after the
# commit, before its add (even n: an on_commit callback registered before the enqueue's) or after its add and before
# its row's delete (odd n: Django's pre_delete signal for the row), printing the workflow's id first.
KILLED_WITH_A_WORKFLOW = textwrap.dedent("""
    import os, signal, sys
    import django
    django.setup()
    from django.db import connections, transaction
    from django.db.models.signals import pre_delete
    from demo_project.demo_app.jobs import greet
    from echomq_django.outbox import OutboxWorkflow
    from echomq_django.workflows import chain

    count = int(sys.argv[1])
    connections.close_all()
    for n in range(count):
        pid = os.fork()
        if pid == 0:
            kill = lambda **_: os.kill(os.getpid(), signal.SIGKILL)
            if n % 2:
                pre_delete.connect(kill, sender=OutboxWorkflow, weak=False)
            with transaction.atomic():
                if not n % 2:
                    transaction.on_commit(kill)
                print(chain(greet.si(f"#{n}"), greet.si("again")).enqueue().id, flush=True)
            os._exit(3)  # never reached: the process is killed at its commit
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (n, status)
    print("done", flush=True)
""")


def test_a_process_killed_before_or_after_adding_its_workflow_loses_none_and_runs_none_twice(
        subprocess_env, redis_client, prefix):
    from echomq_django.outbox import OutboxWorkflow
    from echomq_django.workflows import WorkflowResult

    env = {**subprocess_env, "ECHOMQ_OUTBOX": "1", "DJANGO_SETTINGS_MODULE": "demo_project.settings"}
    count = 10
    result = subprocess.run([sys.executable, "-c", KILLED_WITH_A_WORKFLOW, str(count)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    *ids, done = result.stdout.split()
    assert done == "done" and len(ids) == count, result.stderr[-3000:]
    demo = Queue("demo", redis_client, prefix=prefix)
    assert OutboxWorkflow.objects.count() == count, "each process, killed before its row's delete, left it"
    added = ids[1::2]
    assert demo.counts()["wait"] == len(added), "those killed after their add, and only those, are in Redis"
    manage(env, "echomq_worker", "--queue", "demo", "--burst", "-v", "0")
    for workflow_id in added:  # they ran; retention trims their jobs
        assert WorkflowResult(demo, workflow_id).status == "succeeded"
        assert all(demo.remove(f"{workflow_id}-{number}") for number in range(2))
    assert "outbox: sent 10," in manage(env, "echomq_relay", "--once", "--after", "0")
    assert OutboxWorkflow.objects.count() == 0
    manage(env, "echomq_worker", "--queue", "demo", "--burst", "-v", "0")
    for workflow_id in ids:
        assert WorkflowResult(demo, workflow_id).status == "succeeded", workflow_id
    each_ran_once(demo, [f"{workflow_id}-{number}" for workflow_id in ids[0::2] for number in range(2)])
    assert demo.counts()["completed"] == 2 * len(ids[0::2]), "no workflow added twice ran again"
