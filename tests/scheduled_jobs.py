"""A job function for schedules in tests: echomq_beat processes started by tests fire it (tests/beat_settings.py)."""

from echomq_django.jobs import job


@job(queue="q")
def tick() -> None:
    """Does nothing: the tests count the jobs the schedulers add, not what they do."""
