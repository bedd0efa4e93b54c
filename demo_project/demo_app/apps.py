from django.apps import AppConfig


class DemoAppConfig(AppConfig):
    name = "demo_project.demo_app"
    label = "demo_app"
    verbose_name = "EchoMQ demo"
