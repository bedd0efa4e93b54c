"""The pool and time-limit settings of a queue: parsing, the checks, what the worker gets, the command's flags."""

import functools
from dataclasses import replace
from io import StringIO

import pytest
from django.core import checks
from django.core.management import CommandError, call_command
from django.test import override_settings

from demo_project.demo_app import jobs as demo
from echomq_django import backends, child, jobs
from echomq_django.conf import get_settings, parse_settings
from echomq_django.core import WorkerOptions
from echomq_django.management.commands.echomq_worker import describe
from echomq_django.queues import worker_options
from echomq_django.tasks_compat import InvalidTask, task_backends


def problems_of(**queue) -> list:
    _, problems = parse_settings({"QUEUES": {"a": queue}})
    return problems


def messages(tags: list[str], **echomq) -> list[checks.CheckMessage]:
    with override_settings(ECHOMQ=echomq):
        return checks.run_checks(tags=tags)


def test_the_defaults_are_threads_without_limits_or_recycling():
    config = parse_settings({"QUEUES": {"a": {}}})[0].queue("a")
    assert (config.pool, config.time_limit_ms, config.soft_time_limit_ms) == ("threads", 0, 0)
    assert (config.max_jobs_per_child, config.max_memory_per_child_mb) == (0, 0)


def test_each_option_is_read_in_its_unit():
    resolved, problems = parse_settings({"QUEUES": {"a": {
        "POOL": "processes", "TIME_LIMIT": 2.5, "SOFT_TIME_LIMIT": 0.0004, "MAX_JOBS_PER_CHILD": 100,
        "MAX_MEMORY_PER_CHILD": 512}}})
    config = resolved.queue("a")
    assert problems == []
    assert (config.pool, config.time_limit_ms, config.soft_time_limit_ms) == ("processes", 2500, 1)
    assert (config.max_jobs_per_child, config.max_memory_per_child_mb) == (100, 512)
    assert parse_settings({"QUEUES": {"a": {"TIME_LIMIT": None, "SOFT_TIME_LIMIT": 5}}})[0].queue("a") \
        .soft_time_limit_ms == 5000, "a soft limit alone is allowed"


@pytest.mark.parametrize("queue, expected, words", [
    ({"POOL": "prefork"}, "echomq.E006", "must be one of 'threads', 'processes', not 'prefork'"),
    ({"POOL": None}, "echomq.E006", "['POOL'] must be one of"),
    ({"POOL": ["processes"]}, "echomq.E006", "['POOL'] must be one of"),
    ({"TIME_LIMIT": 0}, "echomq.E005", "['TIME_LIMIT'] must be a positive number of seconds up to"),
    ({"TIME_LIMIT": -1}, "echomq.E005", "['TIME_LIMIT'] must be a positive number"),
    ({"TIME_LIMIT": "30"}, "echomq.E005", "not '30'"),
    ({"TIME_LIMIT": True}, "echomq.E005", "not True"),
    ({"TIME_LIMIT": float("inf")}, "echomq.E005", "not inf"),
    ({"TIME_LIMIT": float("nan")}, "echomq.E005", "not nan"),
    ({"TIME_LIMIT": 10 * 365 * 86_400 + 1}, "echomq.E005", "(ten years)"),
    ({"SOFT_TIME_LIMIT": 0}, "echomq.E005", "['SOFT_TIME_LIMIT'] must be a positive number"),
    ({"SOFT_TIME_LIMIT": float("-inf")}, "echomq.E005", "['SOFT_TIME_LIMIT'] must be a positive number"),
    ({"TIME_LIMIT": 10, "SOFT_TIME_LIMIT": 10}, "echomq.E022", "SOFT_TIME_LIMIT of 10 s is not shorter than the "
                                                               "TIME_LIMIT of 10 s"),
    ({"TIME_LIMIT": 1, "SOFT_TIME_LIMIT": 1.5}, "echomq.E022", "is not shorter than the TIME_LIMIT of 1 s"),
    ({"MAX_JOBS_PER_CHILD": -1}, "echomq.E005", "['MAX_JOBS_PER_CHILD'] must be a whole number >= 0, not -1"),
    ({"MAX_JOBS_PER_CHILD": 2.0}, "echomq.E005", "['MAX_JOBS_PER_CHILD'] must be a whole number"),
    ({"MAX_JOBS_PER_CHILD": None}, "echomq.E005", "['MAX_JOBS_PER_CHILD'] must be a whole number"),
    ({"MAX_MEMORY_PER_CHILD": -5}, "echomq.E005", "['MAX_MEMORY_PER_CHILD'] must be a whole number >= 0"),
    ({"MAX_MEMORY_PER_CHILD": "512MB"}, "echomq.E005", "not '512MB'"),
])
def test_each_wrong_value_is_an_error_with_its_id_message_and_hint(queue, expected, words):
    found = [message for message in messages(["echomq"], QUEUES={"a": queue}) if message.level >= checks.ERROR]
    assert [message.id for message in found] == [expected], found
    [error] = found
    assert words in error.msg and "ECHOMQ['QUEUES']['a']" in error.msg and error.hint
    with override_settings(ECHOMQ={"QUEUES": {"a": queue}}), pytest.raises(Exception, match="QUEUES"):
        get_settings()


def test_a_wrong_value_falls_back_to_the_default():
    wrong, problems = parse_settings({"QUEUES": {"a": {
        "POOL": "fork", "TIME_LIMIT": 0, "SOFT_TIME_LIMIT": -1, "MAX_JOBS_PER_CHILD": -1,
        "MAX_MEMORY_PER_CHILD": 1.5}}})
    assert len(problems) == 5
    assert wrong == parse_settings({"QUEUES": {"a": {}}})[0]
    pair, problems = parse_settings({"QUEUES": {"a": {"POOL": "processes", "TIME_LIMIT": 5, "SOFT_TIME_LIMIT": 9}}})
    assert [problem.id for problem in problems] == ["echomq.E022"]
    assert (pair.queue("a").time_limit_ms, pair.queue("a").soft_time_limit_ms) == (0, 0), "the pair, not one half"


def test_a_hard_limit_on_threads_warns_and_says_why():
    [warning] = messages(["echomq"], QUEUES={"a": {"TIME_LIMIT": 30}})
    assert warning.id == "echomq.W017" and warning.level == checks.WARNING
    assert "ECHOMQ['QUEUES']['a']['TIME_LIMIT'] is 30 s" in warning.msg and "queue 'a'" in warning.msg
    assert "a thread cannot be killed" in warning.msg
    for words in ("fails the attempt", "stops renewing its lock", "runs on, keeping its worker slot taken",
                  '"processes"'):
        assert words in warning.hint
    explicit = messages(["echomq"], QUEUES={"a": {"TIME_LIMIT": 30, "POOL": "threads"}})
    assert [message.id for message in explicit] == ["echomq.W017"]


@pytest.mark.parametrize("queue", [
    {"TIME_LIMIT": 30, "POOL": "processes"},
    {"SOFT_TIME_LIMIT": 30},  # raised at the job's next check: what a thread can do
    {"POOL": "processes", "MAX_JOBS_PER_CHILD": 10, "MAX_MEMORY_PER_CHILD": 200},
    {"MAX_JOBS_PER_CHILD": 10},  # no use on threads, but echomq_worker --pool processes may use it
])
def test_no_warning_without_a_hard_limit_on_threads(queue):
    assert messages(["echomq"], QUEUES={"a": queue}) == []


@pytest.fixture
def registry(monkeypatch):
    """The @job registry and the tasks seen with a time limit as they are, restored after the test."""
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    monkeypatch.setattr(backends, "_time_limited", dict(backends._time_limited))


def limit_warnings(**queues) -> list[checks.CheckMessage]:
    return [message for message in messages(["echomq_jobs"], QUEUES=queues) if message.id == "echomq.W017"]


def report() -> str:
    return "report"


def test_a_job_with_a_hard_limit_on_a_threads_queue_warns(registry, project_jobs_only):
    jobs.job(name="reports.make", queue="reports", time_limit=60)(report)
    [warning] = limit_warnings(reports={})
    assert "@job reports.make has a time_limit of 60 s" in warning.msg and "queue 'reports'" in warning.msg
    assert warning.level == checks.WARNING and "processes" in warning.hint
    assert limit_warnings(reports={"POOL": "processes"}) == []


def test_a_job_without_a_hard_limit_does_not_warn(registry, project_jobs_only):
    jobs.job(name="reports.soft", queue="reports", soft_time_limit=60)(report)
    jobs.job(name="reports.plain", queue="reports")(report)
    assert limit_warnings(reports={}) == []


def test_a_job_on_an_unconfigured_queue_is_left_to_e013(registry, project_jobs_only):
    jobs.job(name="reports.make", queue="reports", time_limit=60)(report)
    with override_settings(ECHOMQ={"QUEUES": {"default": {}}}):
        found = {message.id for message in checks.run_checks(tags=["echomq_jobs"])}
    assert found == {"echomq.E013"}


def test_a_task_with_a_hard_limit_on_a_threads_queue_warns(registry, project_jobs_only, settings):
    from demo_project.demo_app import tasks

    settings.TASKS = {"default": {"BACKEND": "echomq_django.backends.EchoMQBackend", "QUEUES": []}}
    limited = task_backends["default"].task_class(func=tasks.add.func, queue_name="reports", time_limit=1.5)
    [warning] = limit_warnings(default={}, reports={})
    assert f"task {limited.module_path} has a time_limit of 1.5 s" in warning.msg
    assert "queue 'reports'" in warning.msg
    assert limit_warnings(default={}, reports={"POOL": "processes"}) == []
    limited.using(queue_name="default")  # the same task sent to another queue counts there too
    assert len(limit_warnings(default={}, reports={"POOL": "processes"})) == 1


def test_the_demo_passes_the_time_limit_check(project_jobs_only, settings):
    assert limit_warnings(**settings.ECHOMQ["QUEUES"]) == []


def test_a_bad_task_limit_is_refused_where_the_task_is_declared(settings):
    from demo_project.demo_app import tasks

    backend = task_backends["default"]
    for limits, words in [({"time_limit": 0}, "time_limit must be a positive number"),
                          ({"soft_time_limit": "5"}, "soft_time_limit must be a positive number"),
                          ({"time_limit": float("nan")}, "not nan"),
                          ({"time_limit": 2, "soft_time_limit": 2}, "must be shorter than the time limit")]:
        with pytest.raises(InvalidTask, match=words):
            backend.task_class(func=tasks.add.func, **limits)


def test_the_worker_gets_the_queues_pool_and_limits_in_its_units(settings):
    settings.ECHOMQ = {"QUEUES": {
        "cpu": {"POOL": "processes", "CONCURRENCY": 4, "TIME_LIMIT": 30, "SOFT_TIME_LIMIT": 25.5,
                "MAX_JOBS_PER_CHILD": 100, "MAX_MEMORY_PER_CHILD": 512},
        "io": {"TIME_LIMIT": 2, "MAX_JOBS_PER_CHILD": 100, "MAX_MEMORY_PER_CHILD": 512}}}
    cpu = worker_options("cpu")
    assert (cpu.pool, cpu.concurrency, cpu.time_limit_ms, cpu.soft_time_limit_ms) == \
        ("processes", 4, 30_000, 25_500)
    assert (cpu.max_jobs_per_child, cpu.max_memory_per_child_kb) == (100, 512 * 1024)
    assert cpu.child_init is child.setup
    io = worker_options("io")
    assert (io.pool, io.time_limit_ms, io.child_init) == ("threads", 2000, None)
    assert (io.max_jobs_per_child, io.max_memory_per_child_kb) == (0, 0), "children of no pool"
    overridden = worker_options("io", pool="processes", max_jobs_per_child=0, max_memory_per_child_kb=None)
    assert (overridden.pool, overridden.max_jobs_per_child, overridden.max_memory_per_child_kb) == \
        ("processes", 0, 512 * 1024), "0 overrides, None keeps the setting"
    assert overridden.child_init is child.setup
    init = functools.partial(child.setup, verbosity=2)
    assert worker_options("cpu", child_init=init).child_init is init
    assert worker_options("cpu", pool="threads", child_init=init).child_init is None


def test_the_start_up_line_names_the_pool_and_the_limits():
    options = WorkerOptions(pool="processes", concurrency=4, time_limit_ms=30_000, soft_time_limit_ms=25_500,
                            max_jobs_per_child=100, max_memory_per_child_kb=512 * 1024)
    assert describe(options) == ("processes x4, time limit 30 s, soft time limit 25.5 s, "
                                 "a child replaced after 100 jobs or 512 MB")
    assert describe(replace(options, max_jobs_per_child=0)).endswith("a child replaced after 512 MB")
    assert describe(replace(options, time_limit_ms=0, soft_time_limit_ms=0, max_jobs_per_child=0,
                             max_memory_per_child_kb=0)) == "processes x4, no queue time limit"
    threads = replace(options, pool="threads", concurrency=1, soft_time_limit_ms=0)
    assert describe(threads).startswith("threads x1, time limit 30 s (a thread is not killed: echomq.W017)")


@pytest.mark.django_db
def test_the_command_prints_its_pool_and_limits(echomq_settings, queue):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"q": {"TIME_LIMIT": 5, "SOFT_TIME_LIMIT": 4}}}
    job_id = queue.add(demo.greet.name, {"args": ["Ada"], "kwargs": {}})
    out = StringIO()
    call_command("echomq_worker", "--queue", "q", "--burst", "--concurrency", "2", stdout=out)
    first = out.getvalue().splitlines()[0]
    assert first.startswith("worker on q (threads x2, time limit 5 s (a thread is not killed: echomq.W017), "
                            "soft time limit 4 s); job functions: "), first
    assert queue.get_job(job_id).returnvalue == "hello, Ada"


@pytest.mark.parametrize("args, words", [
    (["--pool", "fork"], "invalid choice: 'fork'"),
    (["--max-jobs-per-child", "-1"], "invalid non_negative_int value"),
    (["--max-jobs-per-child", "x"], "invalid non_negative_int value"),
    (["--max-memory-per-child", "1.5"], "invalid non_negative_int value"),
])
def test_the_command_refuses_bad_flags(args, words):
    with pytest.raises(CommandError, match=words):
        call_command("echomq_worker", *args)


@pytest.mark.parametrize("args", [["--max-jobs-per-child", "5"], ["--max-memory-per-child", "100"],
                                  ["--pool", "threads", "--max-memory-per-child", "0"]])
def test_recycling_flags_need_the_processes_pool(echomq_settings, args):
    with pytest.raises(CommandError, match=r"recycle the child processes .* queue\(s\) q run on threads"):
        call_command("echomq_worker", "--queue", "q", "--burst", *args)
