"""Where a project's job functions are: the `jobs` module of every installed app.

Apart from jobs.py so that what runs before any job (a processes-pool child's
set-up, the system checks) can import them without importing the queues.
"""

from django.utils.module_loading import autodiscover_modules


def discover_jobs() -> None:
    """Import every installed app's `jobs` module, so each @job in it is registered (as workers need)."""
    autodiscover_modules("jobs")
