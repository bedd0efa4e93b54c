"""Celery's canvas names on echomq's workflows (echomq_django.workflows): signature, chain, group, chord,
chunks, and `maybe_signature`."""

from __future__ import annotations

from typing import Any

from ..calling import Chunks
from ..core import PayloadError
from ..workflows import Signature, chain, chord, group
from ..workflows import signature as echomq_signature

__all__ = ["Signature", "chain", "chord", "chunks", "group", "maybe_signature", "signature"]


def signature(varies: Any, args: Any = None, kwargs: Any = None, options: Any = None, immutable: bool = False,
              **more_options: Any) -> Signature:
    """Celery's `signature(task_or_name, args=(), kwargs={}, options={}, immutable=False, **options)`: a signature of
    an @job function, a task, or the name of a registered one (a signature given is copied with the options)."""
    if (args is not None and not isinstance(args, (list, tuple))) or (kwargs is not None
                                                                      and not isinstance(kwargs, dict)):
        raise PayloadError(f"signature takes args= as a list or tuple and kwargs= as a dict, not {args!r}, {kwargs!r}")
    found = varies if isinstance(varies, Signature) else echomq_signature(varies)
    found = found.partial(tuple(args or ()), dict(kwargs or {})) if not isinstance(varies, Signature) else found
    options = {**dict(options or {}), **more_options}
    if immutable:
        options["immutable"] = True
    return found.set(**options) if options else found


def chunks(task: Any, items: Any, n: int) -> Chunks:
    """`task.chunks(items, n)`, spelled as Celery's `chunks(task, items, n)`."""
    return task.chunks(items, n)


def maybe_signature(value: Any) -> Any:
    """`value` if it is a signature or a canvas; None stays None."""
    return value
