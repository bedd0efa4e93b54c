"""Django's Tasks framework: `django.tasks` on Django 6, the `django-tasks` backport on 5.2."""

try:
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2: pip install "echomq-django[tasks]"
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

try:  # what TaskResult does to args and kwargs: tuples become lists, UTF-8 bytes str
    from django.utils.json import normalize_json
except ImportError:  # Django 5.2: the backport has the same function
    from django_tasks.utils import normalize_json

__all__ = [
    "BaseTaskBackend", "InvalidTask", "InvalidTaskBackend", "Task", "TaskContext", "TaskError", "TaskResult",
    "TaskResultDoesNotExist", "TaskResultStatus", "normalize_json", "task_backends", "task_enqueued",
    "task_finished", "task_started",
]
