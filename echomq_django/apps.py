from django.apps import AppConfig


class EchoMQConfig(AppConfig):
    name = "echomq_django"
    label = "echomq"
    verbose_name = "EchoMQ"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
