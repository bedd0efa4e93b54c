"""Django's Tasks contract, on EchoMQBackend.

The cases of Django's own Tasks tests (tests/tasks/) and of the reference
database backend's tests (django-tasks-db), rewritten for echomq: every task
that must run is run by the project's real worker (`echomq_worker --burst`)
against the real Redis. The few places where echomq differs on purpose are
the last tests here, and docs/tasks.md lists them.
"""

import dataclasses
import pickle
import time
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone

from echomq_django.backends import EchoMQBackend
from echomq_django.core import Queue
from echomq_django.tasks_compat import (
    InvalidTask,
    TaskContext,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)

try:
    from django.tasks import task
    from django.tasks.exceptions import TaskResultMismatch

    FRAMEWORK_LOGGER, BACKPORT = "django.tasks", False
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task
    from django_tasks.exceptions import TaskResultMismatch

    FRAMEWORK_LOGGER, BACKPORT = "django_tasks", True

pytestmark = pytest.mark.django_db(transaction=True)
BACKEND = "echomq_django.backends.EchoMQBackend"


# The tasks of Django's tests/tasks/tasks.py that these cases need. One attempt
# each, as in Django's backends, which do not retry.

@task
def noop_task(*args, **kwargs) -> None:
    return None


@task
async def noop_task_async(*args, **kwargs) -> None:
    return None


@task
def calculate_meaning_of_life() -> int:
    return 42


@task(attempts=1)
def failing_task_value_error() -> None:
    raise ValueError("This task failed due to ValueError")


@task(attempts=1)
def failing_task_system_exit() -> None:
    raise SystemExit("This task failed due to SystemExit")


@task(attempts=1)
def failing_task_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("This task failed due to KeyboardInterrupt")


@task(attempts=1)
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task(attempts=3)
def complex_return_value() -> object:
    return {"set": {1, 2}}


@task(attempts=2)
def fails_twice() -> None:
    raise ValueError("again")


@task(takes_context=True)
def get_task_id(context) -> str:
    return context.task_result.id


@task(takes_context=True)
def check_context(context, attempt: int) -> None:
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt


@task
def started_at_ns() -> int:
    return time.monotonic_ns()


@task(attempts=3)
def counted_run(path: str) -> str:
    """Record each run as a line of the file at `path`."""
    with open(path, "a") as file:
        file.write("ran\n")
    return "done"


@pytest.fixture(autouse=True)
def backends(settings, redis_url, prefix):
    """Two queues on this test's prefix, a second backend, and this module as an app (the worker runs only those)."""
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "tests"]
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "queue-1": {}}}
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": ["default", "queue-1"]},
                      "second": {"BACKEND": BACKEND, "QUEUES": ["default"]}}


def work(*queues: str) -> None:
    """Run what is ready with the project's worker, one job at a time."""
    options = [option for queue in queues or ("default",) for option in ("--queue", queue)]
    call_command("echomq_worker", *options, "--burst", "--concurrency", "1", "-v", "0")


@pytest.fixture
def signals():
    """Every Tasks signal sent, as (signal name, sender, status)."""
    seen = []
    names = {task_enqueued: "enqueued", task_started: "started", task_finished: "finished"}

    def record(sender, task_result, signal, **kwargs):
        seen.append((names[signal], sender, task_result.status))

    for signal in names:
        signal.connect(record)
    yield seen
    for signal in names:
        signal.disconnect(record)


# -- enqueue -----------------------------------------------------------------

@pytest.mark.parametrize("task_", [noop_task, noop_task_async])
def test_enqueue_returns_a_ready_result(task_, signals):
    result = task_.enqueue(1, two=3)
    assert (result.status, result.is_finished, result.attempts) == (TaskResultStatus.READY, False, 0)
    assert result.started_at is result.last_attempted_at is result.finished_at is None
    assert result.enqueued_at is not None
    with pytest.raises(ValueError, match="Task has not finished yet"):
        result.return_value
    assert (result.task, result.args, result.kwargs, result.backend) == (task_, [1], {"two": 3}, "default")
    assert signals == [("enqueued", EchoMQBackend, TaskResultStatus.READY)]


def test_aenqueue_and_aget_result():
    result = async_to_sync(noop_task.aenqueue)()
    assert result.status == TaskResultStatus.READY
    assert async_to_sync(noop_task.aget_result)(result.id) == result


def test_enqueue_logs_the_id(caplog):
    with caplog.at_level("DEBUG", logger=FRAMEWORK_LOGGER):
        result = noop_task.enqueue()
    assert any("enqueued" in line and result.id in line for line in caplog.messages)


def test_the_returned_arguments_are_the_stored_ones():
    """As Django's TaskResult normalizes them (tuples, UTF-8 bytes), and as JSON keeps them (int keys)."""
    result = noop_task.enqueue({1: 2}, b"bytes", (1, (2,)), key=b"x", mapping={None: 1.5})
    assert result.args == [{"1": 2}, "bytes", [1, [2]]]
    assert result.kwargs == {"key": "x", "mapping": {"null": 1.5}}
    assert noop_task.get_result(result.id) == result


def test_arguments_django_refuses_are_refused():
    with pytest.raises(ValueError, match="Unsupported value"):  # as Django's normalize_json: not UTF-8
        noop_task.enqueue(b"\xff")
    with pytest.raises(TypeError, match="Unsupported type"):
        noop_task.enqueue(key=object())


def test_a_non_json_argument_is_a_type_error_and_sends_nothing(redis_client, prefix):
    with pytest.raises(TypeError):
        noop_task.enqueue(datetime.now())
    with pytest.raises(TypeError):
        async_to_sync(noop_task.aenqueue)({1, 2})
    assert Queue("default", redis_client, prefix=prefix).counts()["wait"] == 0


# -- get_result and refresh --------------------------------------------------

def test_get_result_is_the_enqueued_result_and_refresh_changes_nothing():
    result = noop_task.enqueue(1, two=[3])
    assert noop_task.get_result(result.id) == result, "one enqueued_at, stored as returned"
    unchanged = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == unchanged
    async_to_sync(result.arefresh)()
    assert dataclasses.asdict(result) == unchanged


@pytest.mark.parametrize("result_id", ["123", "t" + "0" * 32, "meta", "id", "bad:id", ""])
def test_a_missing_result_does_not_exist(result_id):
    with pytest.raises(TaskResultDoesNotExist):
        noop_task.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        async_to_sync(noop_task.aget_result)(result_id)


def test_the_result_of_another_task_is_a_mismatch():
    result = noop_task_async.enqueue()
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        noop_task.get_result(result.id)


def test_refresh_after_the_worker_ran_it():
    result = calculate_meaning_of_life.enqueue()
    work()
    assert result.status == TaskResultStatus.READY, "the returned result is a snapshot"
    result.refresh()
    assert (result.status, result.is_finished, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL, True, 42, 1)
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at <= result.finished_at


@pytest.mark.skipif(BACKPORT, reason="the backport pickles a task's function by name, which a @task shadows")
def test_a_result_can_be_pickled():
    result = noop_task.enqueue()
    assert pickle.loads(pickle.dumps(result)) == result


# -- run_after, priority, backend, queues ------------------------------------

def test_run_after_is_kept_and_the_task_waits_for_it():
    run_after = timezone.now() + timedelta(hours=10)
    result = noop_task.using(run_after=run_after).enqueue()
    stored = noop_task.get_result(result.id)
    assert stored.task.run_after == run_after and stored == result
    work()
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.attempts == 0


def test_run_after_in_the_past_runs_now():
    result = noop_task.using(run_after=timezone.now() - timedelta(hours=2)).enqueue()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_higher_priorities_run_first():
    results = {priority: started_at_ns.using(priority=priority).enqueue() for priority in (-2, 2, 10, 0)}
    work()
    for result in results.values():
        result.refresh()
    order = sorted(results, key=lambda priority: results[priority].return_value)
    assert order == [10, 2, 0, -2]


def test_a_task_of_another_backend_keeps_its_alias():
    result = calculate_meaning_of_life.using(backend="second").enqueue()
    assert result.backend == result.task.backend == "second"
    stored = task_backends["second"].get_result(result.id)
    assert stored.backend == stored.task.backend == "second" and stored == result
    work()
    result.refresh()  # asks the task's backend: "second"
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42


def test_an_unknown_queue_is_invalid_for_the_backend():
    with pytest.raises(InvalidTask, match="Queue 'queue-2' is not valid for backend"):
        noop_task.using(queue_name="queue-2")


def test_an_empty_queues_list_allows_every_echomq_queue_and_reads_their_results(settings):
    settings.TASKS = {"default": {"BACKEND": BACKEND, "QUEUES": []}}
    result = calculate_meaning_of_life.using(queue_name="queue-1").enqueue()
    assert calculate_meaning_of_life.get_result(result.id) == result
    work("queue-1")
    result.refresh()
    assert result.return_value == 42 and result.task.queue_name == "queue-1"
    assert task_backends["default"].check() == []


def test_a_correct_configuration_passes_the_backend_check():
    assert task_backends["default"].check() == []


@pytest.mark.parametrize("change, message", [
    ({"run_after": datetime.now()}, "run_after must be an aware datetime"),
    ({"priority": 101}, "priority must be a whole number between -100 and 100"),
    ({"priority": 3.1}, "priority must be a whole number between -100 and 100"),
    ({"priority": True}, "priority must be a whole number between -100 and 100"),
    ({"run_after": timezone.now() + timedelta(days=3651)}, r"run_after .* too far ahead: .*315360000000"),
])
def test_invalid_options_are_refused(change, message):
    with pytest.raises(InvalidTask, match=message):
        noop_task.using(**change)


# -- running: results, errors, signals ---------------------------------------

def test_signals_around_a_successful_run(signals):
    result = noop_task.enqueue()
    work()
    assert signals == [("enqueued", EchoMQBackend, TaskResultStatus.READY),
                       ("started", EchoMQBackend, TaskResultStatus.RUNNING),
                       ("finished", EchoMQBackend, TaskResultStatus.SUCCESSFUL)]
    assert noop_task.get_result(result.id).return_value is None


def test_a_raising_task_finished_receiver_neither_reruns_nor_fails_the_task(tmp_path, caplog):
    runs = tmp_path / "runs"

    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver broke")

    task_finished.connect(broken)
    try:
        with caplog.at_level("ERROR", logger="echomq.tasks"):
            result = counted_run.enqueue(str(runs))
            failed = failing_task_value_error.enqueue()
            work()
    finally:
        task_finished.disconnect(broken)
    assert runs.read_text() == "ran\n", "run once, not once per attempt"
    result.refresh()
    assert (result.status, result.attempts, result.return_value) == (TaskResultStatus.SUCCESSFUL, 1, "done")
    failed.refresh()
    assert failed.status == TaskResultStatus.FAILED and failed.attempts == 1
    assert [error.exception_class for error in failed.errors] == [ValueError], "the task's error, not the receiver's"
    logged = [record for record in caplog.records if record.name == "echomq.tasks"]
    assert len(logged) == 2 and all(record.exc_info[0] is RuntimeError for record in logged)
    assert result.id in logged[0].getMessage() and "receiver broke" in caplog.text


def test_a_raising_task_started_receiver_fails_the_attempt_before_the_task_runs(tmp_path):
    """As in Django's backends, which send task_started with send(): the task does not run."""
    runs = tmp_path / "runs"

    def broken(sender, task_result, **kwargs):
        raise RuntimeError("receiver broke")

    task_started.connect(broken)
    try:
        result = counted_run.enqueue(str(runs))
        work()
    finally:
        task_started.disconnect(broken)
    assert not runs.exists()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class is RuntimeError and "receiver broke" in result.errors[-1].traceback


@pytest.mark.parametrize("use_tz", [True, False])
def test_the_signals_times_are_of_the_kind_get_result_gives(settings, use_tz):
    settings.USE_TZ = use_tz
    seen = {}

    def record(sender, task_result, signal, **kwargs):
        seen[signal] = task_result

    task_started.connect(record)
    task_finished.connect(record)
    try:
        result = noop_task.enqueue()
        work()
    finally:
        task_started.disconnect(record)
        task_finished.disconnect(record)
    stored = noop_task.get_result(result.id)
    finished = seen[task_finished]
    times = [result.enqueued_at, stored.enqueued_at, stored.started_at, stored.finished_at,
             seen[task_started].started_at, finished.started_at, finished.finished_at]
    assert all(timezone.is_aware(value) is use_tz for value in times), times
    assert all(value.microsecond % 1000 == 0 for value in times), "ms, as stored"
    assert finished.started_at == stored.started_at and finished.enqueued_at == stored.enqueued_at
    assert stored.started_at <= finished.finished_at <= stored.finished_at, "finishedOn is written just after"


@pytest.mark.parametrize("task_, exception, message", [
    (failing_task_value_error, ValueError, "This task failed due to ValueError"),
    (failing_task_system_exit, SystemExit, "This task failed due to SystemExit"),
    (failing_task_keyboard_interrupt, KeyboardInterrupt, "This task failed due to KeyboardInterrupt"),
])
def test_a_failing_task_is_recorded_and_task_finished_is_sent(task_, exception, message, signals):
    result = task_.enqueue()
    work()
    assert signals[-1] == ("finished", EchoMQBackend, TaskResultStatus.FAILED)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.is_finished
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value
    assert result.enqueued_at <= result.started_at <= result.finished_at
    [error] = result.errors
    assert error.exception_class is exception
    assert error.traceback.endswith(f"{exception.__name__}: {message}\n"), error.traceback


def test_a_complex_exception_is_recorded():
    result = complex_exception.enqueue()
    work()
    result.refresh()
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback


def test_a_non_json_return_value_fails_with_a_type_error():
    result = complex_return_value.enqueue()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result._return_value is None
    [error] = result.errors
    assert error.exception_class is TypeError
    assert "Unsupported type" in error.traceback  # Django's own words (normalize_json), as its test checks
    assert result.attempts == 1, "not run again: its work is done, only its value cannot be stored"


def test_takes_context():
    result = get_task_id.enqueue()
    attempt = check_context.enqueue(1)
    work()
    result.refresh()
    attempt.refresh()
    assert result.return_value == result.id
    assert attempt.status == TaskResultStatus.SUCCESSFUL


def test_an_async_task_runs():
    result = noop_task_async.enqueue()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.attempts == 1


def test_a_task_module_that_cannot_be_imported_keeps_the_import_error(redis_client, prefix):
    queue = Queue("default", redis_client, prefix=prefix)
    job_id = queue.add("tests.removed_module.some_task", {"args": [], "kwargs": {}, "task": {"backend": "default"}})
    work()
    job = queue.get_job(job_id)
    assert queue.get_state(job_id) == "failed"
    assert "ModuleNotFoundError: No module named 'tests.removed_module'" in job.failed_reason
    assert "ModuleNotFoundError: No module named 'tests.removed_module'" in job.stacktrace[-1]
    assert "UnrecoverableError" in job.stacktrace[-1]


# -- where echomq differs on purpose -----------------------------------------

def test_difference_the_send_waits_for_the_commit():
    """Django's database backend writes the task inside the transaction; echomq sends it on commit."""
    with transaction.atomic():
        result = noop_task.enqueue()
        with pytest.raises(TaskResultDoesNotExist):
            noop_task.get_result(result.id)
    assert noop_task.get_result(result.id) == result


def test_difference_equal_priorities_run_first_in_first_out():
    """Django's database backend orders equal priorities by run_after; echomq in the order they became ready."""
    results = [started_at_ns.using(priority=5).enqueue() for _ in range(3)]
    results.append(started_at_ns.using(priority=5, run_after=timezone.now() - timedelta(hours=2)).enqueue())
    work()
    for result in results:
        result.refresh()
    values = [result.return_value for result in results]
    assert values == sorted(values)


def test_difference_failed_attempts_are_retried():
    """Django's backends run a task once; echomq retries a failure up to the task's `attempts`."""
    result = fails_twice.enqueue()
    work()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 2 and len(result.errors) == 2
