"""ECHOMQ["TASK_ROUTES"]: which queue a task's jobs go to, in the shapes of Celery's `task_routes`.

    ECHOMQ = {
        "QUEUES": {"default": {}, "mail": {}, "reports": {}},
        "TASK_ROUTES": {
            "shop.tasks.send_receipt": {"queue": "mail"},
            "reports.tasks.*": {"queue": "reports", "priority": 5},   # a glob of task names
            "audit.tasks.write": "default",                           # a queue's name alone
        },
    }

The value may also be a router function's dotted path (or the function),
called as Celery calls one, `router(name, args, kwargs, options, task=None)`,
returning {"queue": ...}, a queue's name or None; or a list of such dicts
and routers, tried in order until one answers. A route applies to a task or
@job that names no queue of its own; `queue=` on a call beats both.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Mapping
from typing import Any

from django.utils.module_loading import import_string

from .core import MAX_PRIORITY, MIN_PRIORITY, PayloadError

ROUTE_KEYS = ("queue", "priority")
# A route's keys that mean something only to an AMQP broker: refused by name (echomq.E025) with this why.
AMQP_KEYS = ("exchange", "exchange_type", "routing_key", "delivery_mode")


def parse(value: Any) -> tuple[Any, ...]:
    """The routers of a TASK_ROUTES value, checked; ValueError says what is wrong."""
    if value is None:
        return ()
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    routers: list[Any] = []
    for item in items:
        if isinstance(item, Mapping):
            routers.append({_pattern(name): _route(name, route) for name, route in item.items()})
        elif isinstance(item, str) or callable(item):
            routers.append(item)  # a dotted path is imported when first used, and by the check
        else:
            raise ValueError(f"a route is a dict of task name (or glob) to a route, a router function or its "
                             f"dotted path, not {item!r}")
    return tuple(routers)


def _pattern(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a route's key is a task's name or a glob of names, not {name!r}")
    return name


def _route(name: str, route: Any) -> dict[str, Any]:
    if isinstance(route, str):
        route = {"queue": route}
    if not isinstance(route, Mapping):
        raise ValueError(f"the route of {name!r} is {{'queue': ...}} or a queue's name, not {route!r}")
    if amqp := sorted(set(route) & set(AMQP_KEYS)):
        raise ValueError(f"the route of {name!r} gives {', '.join(amqp)}, which only an AMQP broker uses; echomq "
                         "routes by queue alone: keep 'queue' (and 'priority')")
    if unknown := sorted(set(route) - set(ROUTE_KEYS)):
        raise ValueError(f"the route of {name!r} has unknown key(s) {', '.join(map(repr, unknown))}; a route takes "
                         f"{', '.join(ROUTE_KEYS)}")
    if "queue" in route and (not isinstance(route["queue"], str) or not route["queue"]):
        raise ValueError(f"the route of {name!r} names its queue with a queue's name, not {route['queue']!r}")
    priority = route.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"the route of {name!r} has a priority that is not a whole number from {MIN_PRIORITY} "
                         f"to {MAX_PRIORITY}: {priority!r}")
    return dict(route)


def router_function(router: Any) -> Callable[..., Any]:
    """A router given as a function or its dotted path, imported (ImportError, AttributeError when it cannot be)."""
    function = import_string(router) if isinstance(router, str) else router
    if not callable(function):
        raise TypeError(f"{router!r} is not a function")
    return function


def route(routers: tuple[Any, ...], name: str, args: Any = (), kwargs: Any = None,
          task: Any = None) -> dict[str, Any] | None:
    """The first route the routers give the task `name` ({"queue": ..., "priority": ...}), or None."""
    for router in routers:
        if isinstance(router, dict):
            if name in router:
                return dict(router[name])
            for pattern, found in router.items():
                if fnmatch.fnmatchcase(name, pattern):
                    return dict(found)
            continue
        answer = router_function(router)(name, list(args), dict(kwargs or {}), {}, task=task)
        if answer is None:
            continue
        if isinstance(answer, str):
            return {"queue": answer}
        if isinstance(answer, Mapping):
            try:
                return _route(name, answer)
            except ValueError as error:
                raise PayloadError(f"the router {router!r}: {error}") from None
        raise PayloadError(f"the router {router!r} answered {answer!r} for task {name!r}: a router returns "
                           "{'queue': ...}, a queue's name or None")
    return None
