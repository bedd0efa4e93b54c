"""Where a project's job functions are: the `jobs` and `tasks` modules of every installed app (tasks.py is where
Celery's autodiscovery finds a project's shared_tasks, and where Django's Tasks framework puts @task functions).

Apart from jobs.py so that what runs before any job (a processes-pool child's
set-up, the system checks) can import them without importing the queues.
"""

from django.utils.module_loading import autodiscover_modules


def discover_jobs() -> None:
    """Import every installed app's `jobs` and `tasks` modules, so each @job and shared_task in them is registered
    (as workers need)."""
    autodiscover_modules("jobs", "tasks")
