"""Celery's canvas names on echomq's workflows (echomq_django.workflows): signature, chain, group, chord,
chunks, and `maybe_signature`."""

from __future__ import annotations

from typing import Any

from ..calling import Chunks
from ..signatures import Signature
from ..workflows import chain, chord, group, signature

__all__ = ["Signature", "chain", "chord", "chunks", "group", "maybe_signature", "signature"]


def chunks(task: Any, items: Any, n: int) -> Chunks:
    """`task.chunks(items, n)`, spelled as Celery's `chunks(task, items, n)`."""
    return task.chunks(items, n)


def maybe_signature(value: Any) -> Any:
    """`value` if it is a signature or a canvas; None stays None."""
    return value
