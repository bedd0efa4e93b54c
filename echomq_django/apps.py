from django.apps import AppConfig


class EchoMQConfig(AppConfig):
    name = "echomq_django"
    label = "echomq"
    verbose_name = "EchoMQ"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.apps import apps

        from . import checks  # noqa: F401  (registers the system checks)

        # A worker runs the steps of the admin's large bulk actions (bulk_steps.py registers their job), whether
        # or not anything in its process imports the admin; a step writes the admin's history, so only with it.
        if apps.is_installed("django.contrib.admin"):
            from . import bulk_steps  # noqa: F401

        # Importing the Tasks framework registers Django's check_tasks, which runs each TASKS
        # backend's check() (EchoMQBackend's E010-E014, W011); nothing else imports it before
        # `manage.py check` reads the registry. Without the framework (Django 5.2 without the
        # django-tasks backport) there is nothing to check.
        try:
            from . import tasks_compat  # noqa: F401
        except ImportError:
            pass
