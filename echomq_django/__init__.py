"""echomq-django: a Redis job queue for Django whose protocol lives in Lua scripts.

The queue runtime in `echomq_django.core` imports no Django; this package adds
the Django app (settings, management commands) around it.
"""

from .core import __version__

__all__ = ["__version__"]
