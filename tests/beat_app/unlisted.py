"""A @job that no jobs.py imports: echomq_worker never registers it, so no schedule may name it."""

from echomq_django.jobs import job


@job(queue="q")
def lonely() -> None:
    """Never runs."""
