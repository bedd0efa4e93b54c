"""The app's settings: one `ECHOMQ` dict, read when asked (never at import time)."""

from typing import Any

from django.conf import settings

from .core import DEFAULT_REDIS_URL

DEFAULTS: dict[str, Any] = {
    "REDIS_URL": DEFAULT_REDIS_URL,
    "PREFIX": "emq",
    "QUEUES": {"default": {}},
}


def echomq_setting(name: str) -> Any:
    """One key of `settings.ECHOMQ`, or its documented default."""
    return getattr(settings, "ECHOMQ", {}).get(name, DEFAULTS[name])
