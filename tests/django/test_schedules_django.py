"""Schedules in Django: ECHOMQ["SCHEDULES"] and its checks, database rows, and echomq_beat --once end to end."""

import io
import logging
from datetime import datetime

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

from demo_project.demo_app import tasks
from echomq_django.checks import check_schedules
from echomq_django.core import Beat, Queue
from echomq_django.models import Schedule as ScheduleRow
from echomq_django.schedules import load_schedules, parse_schedule
from echomq_django.tasks_compat import TaskResultStatus

pytestmark = pytest.mark.django_db(transaction=True)
GREET = "demo_project.demo_app.jobs.greet"  # @job(queue="demo", attempts=3)
ADD = "demo_project.demo_app.tasks.add"  # @task, queue "default"


@pytest.fixture
def with_schedules(settings, redis_url, prefix):
    def configure(schedules: dict) -> None:
        settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "demo": {}},
                           "SCHEDULES": schedules}
    configure({})
    return configure


def beat_once(verbosity: str = "1") -> str:
    out = io.StringIO()
    call_command("echomq_beat", "--once", "-v", verbosity, stdout=out)
    return out.getvalue()


def run_all_jobs(*queues: str) -> None:
    for name in queues:
        call_command("echomq_worker", "--queue", name, "--burst", "-v", "0")


def messages(schedules, settings, redis_url, prefix, queues=()) -> list[tuple[str, str]]:
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix,
                       "QUEUES": {"default": {}, "demo": {}, **{name: {} for name in queues}}, "SCHEDULES": schedules}
    return [(message.id, message.msg) for message in check_schedules()]


def test_a_job_schedule_and_a_task_schedule_each_fire_once_and_run(with_schedules, redis_client, prefix):
    with_schedules({
        "greeting": {"TASK": GREET, "EVERY": 3600, "ARGS": ["beat"]},
        "sum": {"TASK": ADD, "CRON": "* * * * *", "ARGS": [2, 3], "PRIORITY": 7, "ATTEMPTS": 5},
    })
    # A new schedule fires its newest tick only when that is on time, so make both on time.
    redis_client.hset(f"{prefix}:{{demo}}:schedule:greeting", "tick", 0)
    redis_client.hset(f"{prefix}:{{default}}:schedule:sum", "tick", 0)
    output = beat_once()
    assert "2 schedule(s)" in output and output.count(" fired job ") == 2
    assert "was decided before (fired)" in beat_once()  # a second scheduler: nothing new
    demo, default = Queue("demo", redis_client, prefix=prefix), Queue("default", redis_client, prefix=prefix)
    [greeting] = demo.get_jobs("wait")
    [task_job] = default.get_jobs("prioritized")
    assert greeting.id.startswith("greeting@") and greeting.name == GREET
    assert greeting.data == {"args": ["beat"], "kwargs": {}} and greeting.opts.attempts == 3  # the @job's own
    assert task_job.id.startswith("sum@") and task_job.name == ADD
    assert task_job.data["task"]["priority"] == 7 and task_job.opts.priority == 7 and task_job.opts.attempts == 5
    run_all_jobs("demo", "default")
    assert demo.get_job(greeting.id).returnvalue == "hello, beat"
    result = tasks.add.get_result(task_job.id)  # the result id is the job id, for scheduled tasks too
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5


def test_the_queue_option_and_a_disabled_schedule(with_schedules, redis_client, prefix):
    with_schedules({"here": {"TASK": GREET, "EVERY": 60, "QUEUE": "default"},
                    "off": {"TASK": GREET, "EVERY": 60, "ENABLED": False}})
    [schedule] = load_schedules()
    assert (schedule.name, schedule.queue) == ("here", "default")


@pytest.mark.parametrize(("options", "check_id", "text"), [
    ({"TASK": GREET, "CRON": "0 25 * * *"}, "echomq.E017", "Bad hour"),
    ({"TASK": GREET, "CRON": "@daily"}, "echomq.E017", "five fields"),
    ({"TASK": GREET}, "echomq.E017", "exactly one of CRON and EVERY"),
    ({"TASK": GREET, "EVERY": 0}, "echomq.E017", "EVERY"),
    ({"TASK": GREET, "EVERY": float("nan")}, "echomq.E017", "EVERY"),
    ({"TASK": GREET, "EVERY": 60, "TIMEZONE": "Europe/Nowhere"}, "echomq.E017", "unknown time zone"),
    ({"TASK": GREET, "EVERY": 60, "TIMEZONE": "localtime"}, "echomq.E017", "each host's own"),
    ({"TASK": GREET, "EVERY": 2 ** 1100}, "echomq.E017", "not 1358298529049385849277351428359266778603."),
    ({"TASK": "demo_project.demo_app.nothing.here", "EVERY": 60}, "echomq.E018", "cannot import"),
    ({"TASK": "demo_project.demo_app.jobs.QUEUE", "EVERY": 60}, "echomq.E018", "neither a Django @task"),
    ({"TASK": "greet", "EVERY": 60}, "echomq.E018", "dotted path"),
    ({"TASK": GREET, "EVERY": 60, "ARGS": "beat"}, "echomq.E019", "must be a list"),
    ({"TASK": GREET, "EVERY": 60, "ARGS": [{1, 2}]}, "echomq.E019", "not JSON"),
    ({"TASK": GREET, "EVERY": 60, "KWARGS": {1: "a"}}, "echomq.E019", "string keys"),
    ({"TASK": GREET, "EVERY": 60, "QUEUE": "nowhere"}, "echomq.E020", "not in ECHOMQ['QUEUES']"),
    ({"TASK": GREET, "EVERY": 60, "QUEUE": "a:b"}, "echomq.E020", "may hold only"),
    ({"TASK": GREET, "EVERY": 60, "PRIORITY": 101}, "echomq.E021", "PRIORITY"),
    ({"TASK": GREET, "EVERY": 60, "ATTEMPTS": 0}, "echomq.E021", "ATTEMPTS"),
    ({"TASK": GREET, "EVERY": 60, "ENABLED": "yes"}, "echomq.E021", "True or False"),
    ({"TASK": GREET, "EVERY": 60, "SKIP_IF_RUNING": True}, "echomq.W016", "unknown option 'SKIP_IF_RUNING'"),
    ("every minute", "echomq.E016", "must be a dict"),
])
def test_check_reports_each_bad_option_with_its_id(settings, redis_url, prefix, options, check_id, text):
    found = messages({"s": options}, settings, redis_url, prefix)
    assert [message_id for message_id, _ in found] == [check_id], found
    assert text in found[0][1] and len(found[0][1]) < 300
    assert all(message.hint for message in check_schedules()), "every problem says what to do"


def test_check_reports_bad_names(settings, redis_url, prefix):
    found = messages({"a:b": {"TASK": GREET, "EVERY": 60}, "x" * 101: {"TASK": GREET, "EVERY": 60}},
                     settings, redis_url, prefix)
    assert [message_id for message_id, _ in found] == ["echomq.E016", "echomq.E016"]
    assert "may hold only" in found[0][1] and "limit is 100" in found[1][1]


def test_a_task_outside_the_installed_apps_is_refused(settings, redis_url, prefix):
    found = messages({"s": {"TASK": "tests.beat_app.jobs.tick", "EVERY": 60}}, settings, redis_url, prefix)
    assert [message_id for message_id, _ in found] == ["echomq.E018"] and "not inside an installed app" in found[0][1]


def test_a_job_that_no_jobs_py_imports_is_refused(settings, redis_url, prefix):
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "tests.beat_app"]
    schedules = {"ok": {"TASK": "tests.beat_app.jobs.tick", "EVERY": 60},
                 "lonely": {"TASK": "tests.beat_app.unlisted.lonely", "EVERY": 60}}
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"q": {}, "default": {}, "demo": {}}}
    for _ in range(2):  # read twice: the module imported for the first reading stays refused
        found = messages(schedules, settings, redis_url, prefix, queues=("q",))
        assert [message_id for message_id, _ in found] == ["echomq.E018"], found
        assert "not imported by an installed app's jobs.py" in found[0][1]


def test_schedules_that_are_not_a_dict_are_one_error(settings, redis_url, prefix):
    found = messages([{"TASK": GREET}], settings, redis_url, prefix)
    assert [message_id for message_id, _ in found] == ["echomq.E016"]


def test_a_valid_demo_configuration_has_no_problems(settings, redis_url, prefix):
    assert messages({"ok": {"TASK": GREET, "CRON": "0 3 * * 1-5", "TIMEZONE": "Europe/Berlin", "ARGS": ["x"],
                            "CATCH_UP": False, "SKIP_IF_RUNNING": True, "PRIORITY": -5, "ATTEMPTS": 2}},
                    settings, redis_url, prefix) == []


def test_database_rows_fire_beside_settings_and_a_name_clash_keeps_the_settings_one(with_schedules, caplog):
    with_schedules({"shared": {"TASK": GREET, "EVERY": 60}})
    ScheduleRow.objects.create(name="nightly", task=ADD, cron="0 3 * * *", args=[1, 2], timezone="Europe/Berlin")
    ScheduleRow.objects.create(name="shared", task=ADD, every=5, args=[1, 2])  # written around the form
    ScheduleRow.objects.create(name="off", task=ADD, every=5, args=[1, 2], enabled=False)
    ScheduleRow.objects.create(name="broken", task=ADD, cron="nonsense", args=[1, 2])
    with caplog.at_level(logging.ERROR, "echomq.beat"):
        loaded = {schedule.name: schedule for schedule in load_schedules()}
    assert sorted(loaded) == ["nightly", "shared"]
    assert loaded["shared"].every_ms == 60_000 and loaded["nightly"].timezone == "Europe/Berlin"
    assert "schedule broken (database) is not fired" in caplog.text
    assert "schedule shared of the database is not fired" in caplog.text


def test_a_row_is_checked_by_the_same_rules_on_the_fields_they_concern(with_schedules):
    with_schedules({"taken": {"TASK": GREET, "EVERY": 60}})
    row = ScheduleRow(name="taken", task="demo_project.demo_app.no_such_module.f", cron="0 3 * *", every=5,
                      args={"a": 1}, queue="nowhere")
    with pytest.raises(ValidationError) as raised:
        row.full_clean()
    errors = raised.value.message_dict
    assert "is not a registered @job or echomq @task" in " ".join(errors["task"])
    assert "exactly one of CRON and EVERY" in " ".join(errors["cron"])
    assert "must be a list" in " ".join(errors["args"])
    assert "not in ECHOMQ['QUEUES']" in " ".join(errors["queue"])
    assert "ECHOMQ['SCHEDULES'] has a schedule named 'taken'" in " ".join(errors["name"])


@pytest.mark.parametrize(("changed_at", "outcome"), [("10:20", "missed"), ("09:20", "fired")])
def test_a_row_changed_or_re_enabled_after_a_tick_does_not_catch_that_tick_up(
        with_schedules, redis_client, prefix, changed_at, outcome):
    with_schedules({})
    ScheduleRow.objects.create(name="hourly", task=GREET, cron="0 * * * *")
    # Enabled (as the admin's action does, setting updated_at) at `changed_at`; it fired long before.
    ScheduleRow.objects.update(updated_at=datetime.fromisoformat(f"2027-05-04T{changed_at}+00:00"))
    redis_client.hset(f"{prefix}:{{demo}}:schedule:hourly", "tick", 0)
    [schedule] = load_schedules()
    beat = Beat(redis_client, lambda: [schedule], prefix=prefix)
    beat.reload()
    # 10:30: the 10:00 tick is 30 minutes late. Caught up only when the row was enabled before it.
    [firing] = beat.fire_due(round(datetime.fromisoformat("2027-05-04T10:30+00:00").timestamp() * 1000))
    assert firing.outcome == outcome


def test_parse_schedule_ties_each_problem_to_its_option():
    entry = parse_schedule("s", {"TASK": GREET, "CRON": "x", "ARGS": 5})
    assert entry.schedule is None
    assert {option for option, _ in entry.problems} == {"CRON", "ARGS"}


def test_beat_refuses_to_start_without_redis(with_schedules, settings, prefix):
    settings.ECHOMQ = {**settings.ECHOMQ, "REDIS_URL": "redis://127.0.0.1:1/0"}
    with pytest.raises(CommandError, match="cannot reach Redis"):
        call_command("echomq_beat", "--once", stdout=io.StringIO())


def test_a_running_scheduler_takes_up_rows_added_and_disabled_in_the_database(with_schedules, redis_client, prefix):
    import threading

    from tests.helpers import wait_until

    with_schedules({})
    demo = Queue("demo", redis_client, prefix=prefix)
    beat = Beat(redis_client, load_schedules, prefix=prefix, reload_interval_ms=200,
                close_reader=connections.close_all)  # the reading thread's connection

    def run() -> None:
        try:
            beat.run(lambda firing: None)
        finally:
            connections.close_all()  # the thread's own connection, which would keep the test database open

    thread = threading.Thread(target=run)
    thread.start()
    try:
        row = ScheduleRow.objects.create(name="fast", task=GREET, every=0.2, args=["db"])
        assert wait_until(lambda: demo.counts()["wait"] >= 3, 10), "a new row fires within one reading"
        ScheduleRow.objects.filter(pk=row.pk).update(enabled=False)
        assert wait_until(lambda: "fast" not in beat.schedules, 10), "a disabled row stops within one reading"
        stopped_at = demo.counts()["wait"]
        assert not wait_until(lambda: demo.counts()["wait"] > stopped_at, 0.6)
    finally:
        beat.stop()
        thread.join(10)
    assert not thread.is_alive()
