from django.apps import AppConfig


class EchoMQConfig(AppConfig):
    name = "echomq_django"
    label = "echomq"
    verbose_name = "EchoMQ"
    default_auto_field = "django.db.models.BigAutoField"
