"""The app's own pages; a project mounts them with `path("echomq/", include("echomq_django.urls"))`."""

from django.urls import path

from . import views

app_name = "echomq"
urlpatterns = [path("metrics/", views.metrics, name="metrics")]
