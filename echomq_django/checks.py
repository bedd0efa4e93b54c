"""System checks of the ECHOMQ setting (`manage.py check`)."""

from typing import Any

from django.core import checks

from .conf import settings_problems


@checks.register("echomq")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Report every problem of the ECHOMQ setting, each with its id and a hint."""
    return [
        (checks.Warning if problem.warning else checks.Error)(problem.message, hint=problem.hint, id=problem.id)
        for problem in settings_problems()
    ]
