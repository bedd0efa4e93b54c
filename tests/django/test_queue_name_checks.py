"""`manage.py check` refuses configured queue names that cannot be keys and admin URL segments."""

import pytest
from django.core import checks
from django.test import override_settings


@pytest.mark.parametrize("name", ["a/b", "..", "a\u200bb", ".hidden", "a b", "ü"])
def test_a_queue_name_outside_the_alphabet_is_a_check_error(name):
    with override_settings(ECHOMQ={"QUEUES": {name: {}, "fine": {}}}):
        messages = checks.run_checks(tags=["echomq"])
    [error] = [message for message in messages if repr(name) in message.msg]
    assert error.level == checks.ERROR and error.id == "echomq.E003"
    assert "@" in error.hint, "the hint names the whole alphabet"
