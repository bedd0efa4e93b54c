"""Celery's calling API on every @job function and shared_task: `delay`, `apply_async`, `signature`, `map`,
`starmap` and `chunks`, on echomq's own enqueue and workflows.

    send_receipt.delay(order.pk)                                      # -> AsyncResult
    send_receipt.apply_async((order.pk,), countdown=60, queue="mail")
    charge.apply_async((order.pk,), link=ship.s(), link_error=refund.si(order.pk))
    add.chunks(zip(range(100), range(100)), 10).delay()              # 10 jobs of 10 calls each

A call with `link` or `link_error` is a small workflow (docs/workflows.md):
the callbacks are made ready by the script that ends the job, once. The
options a call can take are signatures.CALL_OPTIONS; any other is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .core import Job, Member, PayloadError, UnrecoverableError
from .signatures import CALL_OPTIONS, refuse_unknown
from .workflows import Signature, group

if TYPE_CHECKING:
    from .celery.result import AsyncResult, GroupResult

# The name of the job that runs a function over many argument lists (map, starmap, chunks).
MAP_JOB = "echomq.map"


class CeleryCalls:
    """Celery's calling API: the methods every @job function (jobs.JobFunction) has besides `enqueue`."""

    name: str

    def delay(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Add a job with these arguments (Celery's spelling of `enqueue`); its AsyncResult."""
        return self.apply_async(args, kwargs)

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> AsyncResult:
        """Add a job with Celery's options: countdown=, eta=, expires=, queue=, priority=, task_id=, link=,
        link_error=, time_limit=, soft_time_limit=, headers=. Its AsyncResult (a JobHandle)."""
        refuse_unknown(options, CALL_OPTIONS, f"{self.name}.apply_async()")
        return self.signature(args, kwargs, **options).apply_async()

    def signature(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                  **options: Any) -> Signature:
        """A signature of this function with these arguments and Celery's options (Celery's `task.signature`)."""
        if isinstance(args, (str, bytes)) or (args is not None and not isinstance(args, Iterable)):
            raise PayloadError(f"args is a list or tuple of arguments, not {args!r}")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise PayloadError(f"kwargs is a dict of keyword arguments, not {kwargs!r}")
        immutable = bool(options.pop("immutable", False))
        signature = Signature(self, tuple(args or ()), dict(kwargs or {}), immutable=immutable)
        return signature.set(**options) if options else signature

    def map(self, items: Iterable[Any]) -> Signature:
        """One job that calls this function with each item as its argument; its result is the list of theirs."""
        return Signature(MapTarget(self, star=False), (_items(items),))

    def starmap(self, items: Iterable[Iterable[Any]]) -> Signature:
        """One job that calls this function with each item's arguments (`fn(*item)`); the list of their results."""
        return Signature(MapTarget(self, star=True), (_items(items),))

    def chunks(self, items: Iterable[Iterable[Any]], n: int) -> Chunks:
        """The items in jobs of `n` calls each (`starmap` over each chunk): `.delay()`, or `.group()` to compose."""
        return Chunks(self, _items(items), n)


def _items(items: Iterable[Any]) -> list[Any]:
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise PayloadError(f"map, starmap and chunks take an iterable of items, not {items!r}")
    return [list(item) if isinstance(item, tuple) else item for item in items]


class MapTarget:
    """The target of a map or starmap signature: the MAP_JOB job on the function's queue."""

    def __init__(self, function: Any, *, star: bool) -> None:
        self.function, self.star = function, star
        self.name = f"{'starmap' if star else 'map'}({function.name})"

    def __repr__(self) -> str:
        return self.name

    def workflow_member(self, signature: Signature) -> Member:
        """The function's member, renamed MAP_JOB, with [its name, the items, star] as arguments."""
        inner = self.function.workflow_member(Signature(self.function, (), {}, signature.options,
                                                        immutable=signature.immutable))
        items = signature.args[-1] if signature.args else []
        # Immutable: a map in a workflow takes no previous result (its items are its arguments).
        return Member(inner.queue, MAP_JOB, {"args": [self.function.name, items, self.star], "kwargs": {}},
                      inner.opts, immutable=True, allow_failure=inner.allow_failure, job_id=inner.job_id)


def run_map(job_record: Job, functions: Mapping[str, Any]) -> list[Any]:
    """Run a MAP_JOB job: its function over its items, in order; the list of the results."""
    data = job_record.data if isinstance(job_record.data, dict) else {}
    arguments = data.get("args", [])
    if not isinstance(arguments, list) or len(arguments) != 3 or not isinstance(arguments[1], list):
        raise UnrecoverableError(f"job {job_record.id} is a map whose arguments are not [name, items, star]")
    name, items, star = arguments
    function = functions.get(name)
    if function is None:
        raise UnrecoverableError(f"no job function named {name!r} is registered in this worker")
    if star:
        for item in items:
            if not isinstance(item, list):
                raise UnrecoverableError(f"job {job_record.id} is a starmap with an item that is not a list: "
                                         f"{item!r}")
        return [function(*item) for item in items]
    return [function(item) for item in items]


class Chunks:
    """`fn.chunks(items, n)`: the items in jobs of `n` calls each, a group of starmaps."""

    def __init__(self, function: Any, items: list[Any], n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise PayloadError(f"chunks takes a chunk size from 1, not {n!r}")
        self.function, self.items, self.n = function, items, n

    def group(self) -> Any:
        """The group of starmap jobs, one per chunk (a workflow group, to compose or `.delay()`)."""
        return group([self.function.starmap(self.items[start:start + self.n])
                      for start in range(0, len(self.items), self.n)])

    def delay(self) -> GroupResult:
        return self.apply_async()

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> GroupResult:
        """Add the chunks' jobs: a GroupResult whose `.get()` is the list of each chunk's list of results."""
        if args or kwargs:
            raise PayloadError("chunks take their items when made, not when applied")
        return self.group().apply_async(**options)


