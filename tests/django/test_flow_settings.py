"""A queue's RATE_LIMIT and MAX_ACTIVE settings: parsing, the checks, and what its workers get."""

import pytest
from django.core import checks
from django.test import override_settings

from echomq_django.conf import get_settings, parse_settings
from echomq_django.core import RateLimit
from echomq_django.management.commands.echomq_worker import describe
from echomq_django.queues import worker_options


def messages(**queue) -> list[checks.CheckMessage]:
    with override_settings(ECHOMQ={"QUEUES": {"a": queue}}):
        return checks.run_checks(tags=["echomq"])


def test_by_default_a_queue_has_no_rate_limit_and_no_cap():
    config = parse_settings({"QUEUES": {"a": {}}})[0].queue("a")
    assert (config.rate_limit, config.max_active, config.group_max_active) == (None, 0, 0)


def test_each_option_is_read_in_its_unit_and_reaches_the_worker():
    queue = {"RATE_LIMIT": {"MAX": 10, "DURATION": 0.5}, "MAX_ACTIVE": 3, "GROUP_MAX_ACTIVE": 2}
    config, problems = parse_settings({"QUEUES": {"a": queue}})
    assert problems == []
    a = config.queue("a")
    assert (a.rate_limit, a.max_active, a.group_max_active) == (RateLimit(10, 500), 3, 2)
    with override_settings(ECHOMQ={"QUEUES": {"a": queue}}):
        options = worker_options("a")
        assert (options.rate_limit, options.max_active, options.group_max_active) == (RateLimit(10, 500), 3, 2)
        assert describe(options).endswith("at most 10 jobs started per 0.5 s, 3 running at once, 2 per group")


@pytest.mark.parametrize("queue, expected, words", [
    ({"RATE_LIMIT": 10}, "echomq.E006", "['RATE_LIMIT'] must be a dict with MAX and DURATION, not 10"),
    ({"RATE_LIMIT": {"MAX": 10}}, "echomq.E006", "must be a dict with MAX and DURATION"),
    ({"RATE_LIMIT": {"MAX": 10, "DURATION": 1, "BURST": 5}}, "echomq.E006", "must be a dict with MAX and DURATION"),
    ({"RATE_LIMIT": {"MAX": 0, "DURATION": 1}}, "echomq.E005", "['RATE_LIMIT']['MAX'] must be a whole number >= 1"),
    ({"RATE_LIMIT": {"MAX": 2.5, "DURATION": 1}}, "echomq.E005", "['MAX'] must be a whole number >= 1, not 2.5"),
    ({"RATE_LIMIT": {"MAX": True, "DURATION": 1}}, "echomq.E005", "['MAX'] must be a whole number"),
    ({"RATE_LIMIT": {"MAX": 10, "DURATION": 0}}, "echomq.E005",
     "['DURATION'] must be a positive number of seconds up to a day"),
    ({"RATE_LIMIT": {"MAX": 10, "DURATION": "1s"}}, "echomq.E005", "not '1s'"),
    ({"RATE_LIMIT": {"MAX": 10, "DURATION": float("nan")}}, "echomq.E005", "not nan"),
    ({"RATE_LIMIT": {"MAX": 10, "DURATION": 86_401}}, "echomq.E005", "up to a day (86,400), not 86401"),
    ({"MAX_ACTIVE": 0}, "echomq.E005", "['MAX_ACTIVE'] must be a whole number >= 1, not 0"),
    ({"MAX_ACTIVE": "3"}, "echomq.E005", "['MAX_ACTIVE'] must be a whole number >= 1, not '3'"),
    ({"GROUP_MAX_ACTIVE": 0}, "echomq.E005", "['GROUP_MAX_ACTIVE'] must be a whole number >= 1, not 0"),
    ({"GROUP_MAX_ACTIVE": 1.5}, "echomq.E005", "['GROUP_MAX_ACTIVE'] must be a whole number >= 1, not 1.5"),
])
def test_each_wrong_value_is_an_error_with_its_id_message_and_hint(queue, expected, words):
    found = messages(**queue)
    assert [message.id for message in found] == [expected], found
    [error] = found
    assert error.level == checks.ERROR and words in error.msg and "ECHOMQ['QUEUES']['a']" in error.msg and error.hint
    with override_settings(ECHOMQ={"QUEUES": {"a": queue}}), pytest.raises(Exception, match="RATE_LIMIT|MAX_ACTIVE"):
        get_settings()


def test_a_wrong_value_falls_back_to_no_limit():
    wrong, problems = parse_settings({"QUEUES": {"a": {"RATE_LIMIT": {"MAX": -1, "DURATION": 1}, "MAX_ACTIVE": -2}}})
    assert len(problems) == 2
    assert (wrong.queue("a").rate_limit, wrong.queue("a").max_active) == (None, 0)
