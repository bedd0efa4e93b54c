"""The ECHOMQ setting: defaults, per-queue options, re-reading, and the system checks."""

from dataclasses import replace

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.test import override_settings

from echomq_django.conf import get_settings, parse_settings
from echomq_django.settings_values import MIN_TOKEN_LENGTH
from tests.redis_servers import free_port, redis_server


def check_ids(**echomq) -> set[str]:
    with override_settings(ECHOMQ=echomq):
        return {message.id for message in checks.run_checks(tags=["echomq"])}


def test_defaults_apply_without_any_setting(settings):
    del settings.ECHOMQ
    resolved = get_settings()
    assert resolved.redis_url == "redis://127.0.0.1:6379/0" and resolved.prefix == "emq"
    default = resolved.queue("default")
    assert (default.lock_duration_ms, default.renew_interval_ms, default.sweep_interval_ms) == (30_000, 15_000, 30_000)
    assert (default.max_stalled_count, default.attempts) == (1, 3)


def test_the_runtime_without_settings_and_django_without_echomq_agree(settings):
    """A Queue, Worker and Sweeper built with no options behave as the Django app's defaults say."""
    from echomq_django.core import DEFAULT_REDIS_URL, Queue, Sweeper, Worker, connect
    from echomq_django.queues import get_queue, make_sweeper, make_worker

    del settings.ECHOMQ
    assert get_settings().redis_url == DEFAULT_REDIS_URL  # what connect() takes without a URL
    client = connect()  # nothing is sent to it
    bare_queue, django_queue = Queue("default", client), get_queue("default")
    assert (bare_queue.keys.base, bare_queue.max_payload_bytes, bare_queue.default_opts) == \
        (django_queue.keys.base, django_queue.max_payload_bytes, django_queue.default_opts)
    bare_worker, django_worker = Worker("default", print, client), make_worker("default", print)
    # Every option alike (the renewal interval as the worker resolves it: the settings give it, the runtime halves).
    assert replace(bare_worker.options, renew_interval_ms=bare_worker.options.renew_ms) == django_worker.options
    assert bare_worker.keys.base == django_worker.keys.base
    assert bare_worker._reporter.max_log_lines == django_worker._reporter.max_log_lines == 1000
    assert Sweeper(client, ["default"]).targets == make_sweeper(["default"]).targets
    assert Sweeper(client, ["default"]).metrics_minutes == make_sweeper(["default"]).metrics_minutes == 1440


def test_a_wrong_value_falls_back_to_the_default_not_to_another_number():
    wrong, _ = parse_settings({
        "PREFIX": "a b", "REDIS_URL": "http://x", "MAX_PAYLOAD_BYTES": 0, "CONFIRM_REPLICAS": -1,
        "ENQUEUE_TIMEOUT": 0, "METRICS_MINUTES": -1, "METRICS_TOKEN": 5,
        "QUEUES": {"a": {"ATTEMPTS": 0, "MAX_LOG_LINES": 0, "MAX_STALLED_COUNT": -1, "LOCK_DURATION": 0,
                         "SWEEP_INTERVAL": "x", "LOCK_RENEW_INTERVAL": -1, "CONCURRENCY": 0,
                         "BACKOFF": {"TYPE": "linear"}, "KEEP_COMPLETED": 5, "KEEP_FAILED": {"COUNT": -1}}}})
    defaults, problems = parse_settings({"QUEUES": {"a": {}}})
    assert problems == [] and wrong == defaults


def test_metrics_and_log_settings_reach_the_workers_and_sweepers():
    with override_settings(ECHOMQ={"METRICS_MINUTES": 0, "METRICS_TOKEN": "t" * 32,
                                   "QUEUES": {"a": {"MAX_LOG_LINES": 7}}}):
        from echomq_django.queues import make_sweeper, make_worker

        worker, sweeper = make_worker("a", print), make_sweeper(["a"])
        assert (worker.options.metrics_minutes, worker._reporter.max_log_lines, sweeper.metrics_minutes) == (0, 7, 0)
        assert get_settings().metrics_token == "t" * 32


def test_max_stalled_count_zero_is_kept():
    resolved, problems = parse_settings({"QUEUES": {"a": {"MAX_STALLED_COUNT": 0}}})
    assert problems == [] and resolved.queue("a").max_stalled_count == 0


def test_per_queue_options_and_rereading_on_change():
    with override_settings(ECHOMQ={"QUEUES": {"mail": {"LOCK_DURATION": 10, "SWEEP_INTERVAL": 0.5,
                                                        "BACKOFF": {"TYPE": "exponential", "DELAY": 2}}}}):
        mail = get_settings().queue("mail")
        assert (mail.lock_duration_ms, mail.renew_interval_ms, mail.sweep_interval_ms) == (10_000, 5_000, 500)
        assert (mail.backoff.kind, mail.backoff.delay_ms) == ("exponential", 2000)
        assert get_settings().queue("not-configured").lock_duration_ms == 30_000
    with override_settings(ECHOMQ={"PREFIX": "other"}):
        assert get_settings().prefix == "other"


def test_a_correct_setting_passes_the_checks():
    assert check_ids(REDIS_URL="rediss://cache:6380/1", QUEUES={"a": {"LOCK_DURATION": 5}}) == set()
    assert check_ids(REDIS_URL="redis+cluster://a:7000,b:7001") == set()
    assert check_ids(REDIS_URL="redis+sentinel://a:26379,b:26379/mymaster/2") == set()


@pytest.mark.parametrize("echomq, expected", [
    ({"QUEUES": []}, "echomq.E001"),
    ({"REDIS_URL": "http://localhost"}, "echomq.E002"),
    ({"REDIS_URL": "redis+sentinel://127.0.0.1:26379"}, "echomq.E002"),
    ({"REDIS_URL": "redis+cluster://127.0.0.1:7000/3"}, "echomq.E002"),
    ({"QUEUES": {"bad:name": {}}}, "echomq.E003"),
    ({"PREFIX": "a b"}, "echomq.E003"),
    ({"QUEUES": {"a": {"LOCK_DURATION": 10, "LOCK_RENEW_INTERVAL": 10}}}, "echomq.E004"),
    ({"QUEUES": {"a": {"SWEEP_INTERVAL": 0}}}, "echomq.E005"),
    ({"QUEUES": {"a": {"LOCK_DURATION": -1}}}, "echomq.E005"),
    ({"QUEUES": {"a": {"ATTEMPTS": 0}}}, "echomq.E005"),
    # Values a worker or a job refuses must fail the check, not the worker's start or each enqueue.
    ({"QUEUES": {"a": {"ATTEMPTS": 1_000_001}}}, "echomq.E005"),
    ({"QUEUES": {"a": {"LOCK_DURATION": 0.001}}}, "echomq.E004"),
    ({"QUEUES": {"a": {"BACKOFF": {"TYPE": "linear"}}}}, "echomq.E006"),
    ({"QUEUES": {"a": "fast"}}, "echomq.E006"),
    ({"TRACE_AS_CHILD": "yes"}, "echomq.E006"),
    ({"CONFIRM_REPLICAS": -1}, "echomq.E005"),
    ({"CONFIRM_REPLICAS": 1, "CONFIRM_TIMEOUT": 0}, "echomq.E005"),
    ({"ENQUEUE_TIMEOUT": 0}, "echomq.E005"),
    ({"ENQUEUE_TIMEOUT": "3"}, "echomq.E005"),
    ({"ENQUEUE_TIMEOUT": float("inf")}, "echomq.E005"),
    ({"ENQUEUE_TIMEOUT": 1e300}, "echomq.E005"),
    ({"QUEUES": {"a": {"LOCK_DURATION": 1e15}}}, "echomq.E005"),
    ({"QUEUES": {"a": {"SWEEP_INTERVAL": float("nan")}}}, "echomq.E005"),
    ({"QUEUES": {"a": {"BACKOFF": {"TYPE": "fixed", "DELAY": float("inf")}}}}, "echomq.E005"),
    ({"QUEUES": {"a": {"KEEP_COMPLETED": {"AGE": float("inf")}}}}, "echomq.E005"),
    ({"METRICS_MINUTES": -1}, "echomq.E005"),
    ({"METRICS_MINUTES": 1.5}, "echomq.E005"),
    ({"METRICS_MINUTES": 10**15}, "echomq.E005"),
    ({"QUEUES": {"a": {"MAX_LOG_LINES": 0}}}, "echomq.E005"),
    ({"QUEUES": {"a": {"MAX_LOG_LINES": 10**6}}}, "echomq.E005"),
    ({"METRICS_TOKEN": 12345678901234567890123456}, "echomq.E015"),
    ({"METRICS_TOKEN": "a token with spaces in it, long enough"}, "echomq.E015"),
    ({"METRICS_TOKEN": "short"}, "echomq.E023"),  # DEBUG is False under pytest-django: production
    ({"REDIS_ULR": "redis://x"}, "echomq.W001"),
    ({"QUEUES": {"a": {"LOCK_DURATON": 5}}}, "echomq.W002"),
])
def test_each_problem_has_its_check_id(echomq, expected):
    assert expected in check_ids(**echomq)


def test_a_short_metrics_token_is_a_warning_under_debug_and_an_error_in_production(settings):
    settings.DEBUG = True
    assert "echomq.W015" in check_ids(METRICS_TOKEN="short") - {"echomq.E023"}
    settings.DEBUG = False
    assert "echomq.E023" in check_ids(METRICS_TOKEN="short") - {"echomq.W015"}
    assert not {"echomq.E023", "echomq.W015"} & check_ids(METRICS_TOKEN="x" * MIN_TOKEN_LENGTH)


@pytest.mark.parametrize("blank", ["", " ", "\t\n"])
def test_an_empty_or_blank_metrics_token_means_none(blank):
    resolved, problems = parse_settings({"METRICS_TOKEN": blank})
    assert resolved.metrics_token is None and not problems


def test_every_check_message_carries_a_hint():
    with override_settings(ECHOMQ={"QUEUES": {"a": {"LOCK_DURATION": 1, "LOCK_RENEW_INTERVAL": 2}}}):
        [message] = checks.run_checks(tags=["echomq"])
    assert message.hint and "LOCK_RENEW_INTERVAL" in message.hint


def test_not_a_dict_is_an_error_and_reading_it_raises():
    with override_settings(ECHOMQ="redis://localhost"):
        assert {m.id for m in checks.run_checks(tags=["echomq"])} == {"echomq.E001"}
        with pytest.raises(ImproperlyConfigured, match="must be a dict"):
            get_settings()


@pytest.mark.django_db
@pytest.mark.parametrize("command", ["echomq_sweep", "echomq_worker"])
def test_unreachable_redis_is_a_one_line_error_at_start(command, settings):
    settings.ECHOMQ = {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    with pytest.raises(CommandError, match=r"cannot reach Redis at redis://127\.0\.0\.1:\d+/0") as caught:
        call_command(command, "--once" if command == "echomq_sweep" else "--burst")
    assert "\n" not in str(caught.value)


@pytest.mark.django_db
def test_an_evicting_redis_gets_a_loud_warning(settings, capsys):
    with redis_server("--maxmemory-policy", "allkeys-lru") as url:
        settings.ECHOMQ = {"REDIS_URL": url}
        call_command("echomq_sweep", "--once")
    assert "maxmemory-policy 'allkeys-lru'" in capsys.readouterr().err


@pytest.mark.django_db
def test_confirming_more_replicas_than_connected_gets_a_warning(settings, capsys, redis_url, prefix):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "CONFIRM_REPLICAS": 2, "CONFIRM_TIMEOUT": 0.05}
    call_command("echomq_sweep", "--once")
    assert "CONFIRM_REPLICAS'] is 2, but a primary has only 0 connected replica(s)" in capsys.readouterr().err


@pytest.mark.django_db
def test_the_project_passes_django_checks_and_has_every_migration(project_jobs_only):
    call_command("check", fail_level="WARNING")
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


def test_the_configuration_pages_table_matches_the_defaults():
    """Every key in docs/configuration.md's table with its default, and no other: the table restates conf.py."""
    import ast
    import re
    from pathlib import Path

    from echomq_django.conf import QUEUE_DEFAULTS, TOP_LEVEL_DEFAULTS

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    section = page.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    documented = {}
    for key, default in re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", section, re.MULTILINE):
        queue_option = re.fullmatch(r'QUEUES\[name\]\["(\w+)"\]', key)
        documented[("queue", queue_option[1]) if queue_option else ("top", key)] = default.strip().strip("`")
    in_code = {**{("top", k): v for k, v in TOP_LEVEL_DEFAULTS.items()},
               **{("queue", k): v for k, v in QUEUE_DEFAULTS.items()}}
    assert set(documented) == set(in_code)
    for where, text in documented.items():
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text  # words, such as "half the lock" for None
        assert value == in_code[where] or (in_code[where] is None and isinstance(value, str)), (where, text)


def test_a_retention_limit_left_out_keeps_its_default():
    from echomq_django.core import Retention

    resolved, problems = parse_settings({"QUEUES": {"q": {"KEEP_COMPLETED": {"AGE": 60}}}})
    assert problems == [] and resolved.queue("q").keep_completed == Retention(count=1000, age_ms=60_000)
    resolved, _ = parse_settings({"QUEUES": {"q": {"KEEP_COMPLETED": {"COUNT": None}}}})
    assert resolved.queue("q").keep_completed == Retention(count=-1, age_ms=0), "None: no limit"


def test_a_job_with_a_wrong_attempt_count_is_refused_where_it_is_declared():
    from echomq_django.core import PayloadError
    from echomq_django.jobs import job

    with pytest.raises(PayloadError, match="attempts must be a whole number from 1"):
        job(attempts=0)


# Found (hostile test of issue 25): a bad ECHOMQ_OWN_CONNECTIONS passed `manage.py check`; the commands
# refused it at start, but a web process started and then raised ValueError on every enqueue.
@pytest.mark.parametrize("value", ["yes", "", "true", " 1"])
def test_a_bad_own_connections_switch_fails_the_checks(monkeypatch, value):
    monkeypatch.setenv("ECHOMQ_OWN_CONNECTIONS", value)
    errors = [message for message in checks.run_checks(tags=["echomq"]) if message.id == "echomq.E024"]
    assert len(errors) == 1 and "ECHOMQ_OWN_CONNECTIONS" in errors[0].msg and repr(value) in errors[0].msg


@pytest.mark.parametrize("value", ["0", "1"])
def test_a_good_own_connections_switch_passes_the_checks(monkeypatch, value):
    monkeypatch.setenv("ECHOMQ_OWN_CONNECTIONS", value)
    assert "echomq.E024" not in {message.id for message in checks.run_checks(tags=["echomq"])}
