"""The app of the schedules tests: echomq_beat processes started by tests fire its job (tests/beat_settings.py)."""

from echomq_django.jobs import job


@job(queue="q")
def tick(*args, **kwargs) -> str:
    """Does nothing: the tests count the jobs the schedulers add, not what they do."""
    return "tick"
