"""Progress and log lines a running job writes: token-checked scripts, the cap, and their lifetime."""

import json
import threading

import pytest

from echomq_django.core import Job, JobOptions, NewJob, PayloadError, Retention, Sweeper, Worker, WorkerOptions
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.codec import MAX_LOG_LINE_CHARS
from echomq_django.core.protocol.job import MAX_PROGRESS_BYTES
from tests.helpers import kill_lock, take_jobs, wait_until


def make_worker(queue, handler, **options) -> Worker:
    options.setdefault("block_timeout_s", 0.2)
    return Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, **options))


def start(worker: Worker, **run_options) -> threading.Thread:
    thread = threading.Thread(target=worker.run, kwargs=run_options, daemon=True)
    thread.start()
    return thread


def events(queue, name: str, job_id: str | None = None) -> list[dict]:
    return [fields for _id, fields in queue.client.xrange(queue.keys.events)
            if fields["event"] == name and (job_id is None or fields["jobId"] == job_id)]


def keys_of_job(queue, job_id: str) -> list[str]:
    """Every key named after the job (its hash, lock, logs, ...)."""
    return sorted(queue.client.scan_iter(match=f"{queue.keys.job(job_id)}*", count=1000))


def recovered_attempt(queue, job_id: str, token: str = "old-token"):
    """Take `job_id` with `token`, let its lock lapse, and have two forced sweeps recover it.

    Returns the flat job hash the take answered with (the old attempt's view).
    """
    _due, [(taken, flat)] = take_jobs(queue, token, 30_000, now_ms(), 1, "old-worker")
    assert taken == job_id
    kill_lock(queue, job_id)
    sweeper = Sweeper(queue.client, [queue.name], prefix=queue.keys.prefix, scripts=queue.scripts)
    assert sweeper.sweep(sweeper.targets[0], force=True).marked == 1
    assert sweeper.sweep(sweeper.targets[0], force=True).recovered == 1
    assert queue.get_state(job_id) == "wait"
    return flat


def attached(queue, job_id: str, flat, reporter_worker: Worker) -> Job:
    """A Job for the attempt behind `flat`, able to report as a worker's job (never run)."""
    job = Job.from_flat(queue.name, job_id, flat)
    job.attach(reporter_worker._reporter)
    return job


# -- a real worker ---------------------------------------------------------


def test_a_running_job_reports_progress_and_log_lines(queue):
    job_id = queue.add("report", {"n": 3})
    returned = {}

    def handler(job):
        returned["first"] = job.update_progress(42)
        assert job.progress == 42
        returned["logs"] = [job.log(f"step {i} of {job.data['n']}") for i in range(job.data["n"])]
        returned["second"] = job.update_progress({"step": 2, "of": 5})
        return "done"

    assert make_worker(queue, handler).run(burst=True) == 1
    assert returned == {"first": True, "second": True, "logs": [True, True, True]}

    job = queue.get_job(job_id)
    assert job.progress == {"step": 2, "of": 5}
    assert job.logs == ["step 0 of 3", "step 1 of 3", "step 2 of 3"]
    assert job.returnvalue == "done"
    with_state, state = queue.get_job_with_state(job_id)
    assert state == "completed"
    assert (with_state.progress, with_state.logs) == (job.progress, job.logs)
    assert queue.client.hget(queue.keys.job(job_id), "progress") == '{"step":2,"of":5}'
    assert queue.client.lrange(queue.keys.logs(job_id), 0, -1) == job.logs

    progress = events(queue, "progress")
    assert [(e["jobId"], e["data"]) for e in progress] == [(job_id, "42"), (job_id, '{"step":2,"of":5}')]
    assert [json.loads(e["data"]) for e in progress] == [42, {"step": 2, "of": 5}]
    # In the stream, progress comes between the job's start and its completion.
    order = [f["event"] for _id, f in queue.client.xrange(queue.keys.events) if f["jobId"] == job_id]
    assert order == ["added", "active", "progress", "progress", "completed"]


def test_the_log_keeps_the_newest_lines_up_to_the_workers_cap(queue):
    job_id = queue.add("chatty")
    written = []

    def handler(job):
        written.extend(job.log(f"line {i}") for i in range(5))

    make_worker(queue, handler, max_log_lines=3).run(burst=True)
    assert written == [True] * 5
    assert queue.get_job(job_id).logs == ["line 2", "line 3", "line 4"]
    assert queue.client.llen(queue.keys.logs(job_id)) == 3


def test_a_cap_below_one_line_is_refused(queue):
    with pytest.raises(ValueError, match="at least 1 log line"):
        make_worker(queue, lambda job: None, max_log_lines=0)


def test_long_lines_are_cut_and_other_values_are_strd(queue):
    job_id = queue.add("lines")

    class Thing:
        def __str__(self) -> str:
            return "a thing"

    def handler(job):
        job.log("x" * MAX_LOG_LINE_CHARS)  # exactly the limit: kept whole
        job.log("y" * (MAX_LOG_LINE_CHARS + 1))
        job.log("é" * (MAX_LOG_LINE_CHARS * 3))
        job.log(42)
        job.log({"a": [1, None]})
        job.log(Thing())
        job.log(None)

    make_worker(queue, handler).run(burst=True)
    logs = queue.get_job(job_id).logs
    assert logs[0] == "x" * MAX_LOG_LINE_CHARS
    assert logs[1] == "y" * (MAX_LOG_LINE_CHARS - 1) + "…"
    assert logs[2] == "é" * (MAX_LOG_LINE_CHARS - 1) + "…"
    assert [len(line) for line in logs[:3]] == [MAX_LOG_LINE_CHARS] * 3
    assert logs[3:] == ["42", "{'a': [1, None]}", "a thing", "None"]


def test_progress_too_large_or_not_json_raises_and_writes_nothing(queue):
    job_id = queue.add("bad-progress")
    raised = []

    def handler(job):
        for value in ("p" * (MAX_PROGRESS_BYTES - 1), object(), float("nan"), {"when": {1, 2}}):
            # MAX_PROGRESS_BYTES - 1 characters are MAX_PROGRESS_BYTES + 1 bytes of JSON with the quotes.
            try:
                job.update_progress(value)
            except PayloadError as error:
                raised.append(str(error))
        assert job.progress is None, "nothing written, nothing remembered"

    make_worker(queue, handler).run(burst=True)
    assert len(raised) == 4
    assert f"is {MAX_PROGRESS_BYTES + 1} bytes of JSON; the limit is {MAX_PROGRESS_BYTES}" in raised[0]
    assert all(f"progress of job {job_id}" in message for message in raised)
    assert all("JSON-serializable" in message for message in raised[1:])
    assert queue.get_state(job_id) == "completed", "the handler caught the errors"
    assert queue.get_job(job_id).progress is None
    assert not queue.client.hexists(queue.keys.job(job_id), "progress")
    assert events(queue, "progress") == []


def test_progress_of_exactly_the_limit_is_written(queue):
    job_id = queue.add("big-progress")
    value = "p" * (MAX_PROGRESS_BYTES - 2)  # with its quotes: MAX_PROGRESS_BYTES bytes

    make_worker(queue, lambda job: job.update_progress(value)).run(burst=True)
    job = queue.get_job(job_id)
    assert job.progress == value and job.returnvalue is True
    assert len(queue.client.hget(queue.keys.job(job_id), "progress")) == MAX_PROGRESS_BYTES


# -- the token check -------------------------------------------------------


def test_an_attempt_the_sweeper_recovered_writes_nothing(queue):
    job_id = queue.add("work")
    flat = recovered_attempt(queue, job_id)
    reporter = make_worker(queue, lambda job: None, max_log_lines=10)
    old = attached(queue, job_id, flat, reporter)
    assert old.token == "old-token"

    assert old.update_progress(50) is False
    assert old.log("too late") is False
    assert old.progress is None
    job = queue.get_job(job_id)
    assert (job.progress, job.logs) == (None, [])
    assert not queue.client.exists(queue.keys.logs(job_id))
    assert events(queue, "progress") == []

    # Another worker takes the job: the new token writes, the old one still does not.
    _due, [(again, new_flat)] = take_jobs(queue, "new-token", 30_000, now_ms(), 1, "new-worker")
    assert again == job_id
    new = attached(queue, job_id, new_flat, reporter)
    assert new.token == "new-token"
    assert old.update_progress(51) is False
    assert old.log("still too late") is False
    assert new.update_progress(60) is True
    assert new.log("fresh") is True
    assert old.update_progress(61) is False
    assert old.log("late again") is False

    job = queue.get_job(job_id)
    assert (job.progress, job.logs) == (60, ["fresh"])
    assert [e["data"] for e in events(queue, "progress", job_id)] == ["60"]


def test_a_finished_attempt_writes_nothing(queue):
    job_id = queue.add("work")
    kept = []
    make_worker(queue, lambda job: kept.append(job) or "ok").run(burst=True)
    [job] = kept
    assert queue.get_state(job_id) == "completed"
    assert job.update_progress(99) is False
    assert job.log("after the end") is False
    stored = queue.get_job(job_id)
    assert (stored.progress, stored.logs) == (None, [])
    assert not queue.client.exists(queue.keys.logs(job_id))


def test_a_job_removed_while_running_writes_nothing_and_leaves_no_key(queue):
    job_id = queue.add("work")
    started, release = threading.Event(), threading.Event()
    results = {}

    def handler(job):
        started.set()
        release.wait(10)
        results["progress"] = job.update_progress(1)
        results["log"] = job.log("into the void")

    worker = make_worker(queue, handler, lock_duration_ms=30_000)
    thread = start(worker)
    try:
        assert started.wait(5)
        kill_lock(queue, job_id)  # removeJob refuses a job while its lock lives
        assert queue.remove(job_id) is True
        assert keys_of_job(queue, job_id) == []
    finally:
        release.set()
        assert wait_until(lambda: "log" in results, 5)
        worker.stop()
        thread.join(5)
    assert not thread.is_alive()
    assert results == {"progress": False, "log": False}
    assert keys_of_job(queue, job_id) == [], "no <id>:logs or other key is created for a removed job"
    assert events(queue, "progress") == []
    assert queue.get_job(job_id) is None


def test_a_job_read_outside_a_worker_cannot_report(queue):
    job_id = queue.add("work")
    job = queue.get_job(job_id)
    with pytest.raises(RuntimeError, match=rf"job {job_id} can report progress only while a worker runs it"):
        job.update_progress(1)
    with pytest.raises(RuntimeError, match=rf"job {job_id} can log only while a worker runs it"):
        job.log("hello")
    assert not queue.client.hexists(queue.keys.job(job_id), "progress")
    assert not queue.client.exists(queue.keys.logs(job_id))


# -- logs go with the job --------------------------------------------------


def run_logging_jobs(queue, count: int, **worker_options) -> list[str]:
    ids = queue.add_bulk([NewJob("logs", {"i": i}) for i in range(count)])
    make_worker(queue, lambda job: job.log(f"job {job.data['i']}"), **worker_options).run(burst=True)
    return ids


def test_remove_deletes_the_log(queue):
    [job_id] = run_logging_jobs(queue, 1)
    assert queue.get_job(job_id).logs == ["job 0"]
    assert queue.remove(job_id) is True
    assert keys_of_job(queue, job_id) == []


def test_retention_after_a_finish_deletes_the_log(queue):
    first, second = run_logging_jobs(queue, 2, keep_completed=Retention(count=1))
    assert queue.get_job(first) is None
    assert keys_of_job(queue, first) == []
    assert queue.get_job(second).logs == ["job 1"]
    assert queue.client.exists(queue.keys.logs(second)) == 1


def test_retention_of_failed_jobs_deletes_the_log(queue):
    ids = queue.add_bulk([NewJob("doomed", {"i": i}, JobOptions(attempts=1)) for i in range(2)])

    def handler(job):
        job.log(f"failing {job.data['i']}")
        raise RuntimeError("no")

    make_worker(queue, handler, keep_failed=Retention(count=1)).run(burst=True)
    assert keys_of_job(queue, ids[0]) == []
    assert queue.get_job(ids[1]).logs == ["failing 1"]


def test_clean_deletes_the_logs(queue):
    ids = run_logging_jobs(queue, 3)
    finished = max(queue.get_job(job_id).finished_on for job_id in ids)
    assert wait_until(lambda: now_ms() > finished, 2)  # clean takes jobs finished before now
    assert queue.clean("completed", 0) == 3
    for job_id in ids:
        assert keys_of_job(queue, job_id) == []


def test_clean_of_failed_jobs_deletes_the_logs(queue):
    job_id = queue.add("doomed", opts=JobOptions(attempts=1))

    def handler(job):
        job.log("about to fail")
        raise RuntimeError("no")

    make_worker(queue, handler).run(burst=True)
    assert queue.get_job(job_id).logs == ["about to fail"]
    finished = queue.get_job(job_id).finished_on
    assert wait_until(lambda: now_ms() > finished, 2)
    assert queue.clean("failed", 0) == 1
    assert keys_of_job(queue, job_id) == []


def test_logs_of_every_attempt_stay_with_a_retried_job(queue):
    job_id = queue.add("flaky", opts=JobOptions(attempts=2))

    def handler(job):
        job.log(f"attempt {job.attempts_made + 1}")
        if job.attempts_made == 0:
            raise RuntimeError("first attempt fails")
        return "ok"

    make_worker(queue, handler).run(burst=True)
    job = queue.get_job(job_id)
    assert job.returnvalue == "ok"
    assert job.logs == ["attempt 1", "attempt 2"]


# -- Django ----------------------------------------------------------------


@pytest.fixture
def registry(monkeypatch):
    """The @job registry as it is, restored after the test."""
    from echomq_django import jobs

    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))


def reporting_job(steps: int) -> int:
    from echomq_django.jobs import current_job

    job = current_job()
    for step in range(steps):
        job.log(f"django step {step}")
        job.update_progress({"done": step + 1, "of": steps})
    return steps


def run_django_worker(name: str = "q") -> int:
    from echomq_django.jobs import run_job
    from echomq_django.queues import make_worker as make_django_worker

    return make_django_worker(name, run_job, block_timeout_s=0.2).run(burst=True)


def test_a_django_job_reports_through_current_job(registry, echomq_settings, queue):
    from echomq_django import jobs

    function = jobs.job(name="tests.protocol.test_progress_logs.reporting_job", queue="q")(reporting_job)
    job_id = function.enqueue(4)
    assert run_django_worker() == 1
    job = queue.get_job(job_id)
    assert job.returnvalue == 4
    assert job.progress == {"done": 4, "of": 4}
    assert job.logs == [f"django step {step}" for step in range(4)]
    assert len(events(queue, "progress", job_id)) == 4
    assert jobs.current_job() is None, "set only while the job function runs"


def test_django_honours_max_log_lines_from_the_settings(registry, echomq_settings, queue):
    from echomq_django import jobs

    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"q": {"MAX_LOG_LINES": 2}}}
    function = jobs.job(name="tests.protocol.test_progress_logs.reporting_job_capped", queue="q")(reporting_job)
    job_id = function.enqueue(5)
    assert run_django_worker() == 1
    job = queue.get_job(job_id)
    assert job.logs == ["django step 3", "django step 4"]
    assert job.progress == {"done": 5, "of": 5}
