"""The runtime objects the Django layer uses, built from the ECHOMQ setting."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import redis
from django.core.signals import setting_changed
from django.dispatch import receiver
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from . import child
from .conf import get_settings
from .core import Confirm, Handler, Queue, Scripts, Sweeper, SweepTarget, Worker, WorkerOptions, connect


@functools.cache
def _connection(url: str, call_timeout_s: float | None, wait_s: float = 0) -> tuple[Any, Scripts]:
    """A client for `url` and the scripts registered on it, built once per role and forgotten when ECHOMQ changes.

    `call_timeout_s` None: the client of workers and sweepers, which rides out
    outages of any length; else a producer's, whose calls fail within about
    that many seconds, retries included.
    """
    if call_timeout_s is None:
        client = connect(url)
        return client, Scripts(client)
    client = connect(url, **bounded_call_options(call_timeout_s, wait_s))
    return client, Scripts(client, reroute_s=call_timeout_s / 2)  # on a cluster, the failover wait fits too


def bounded_call_options(timeout_s: float, wait_s: float = 0) -> dict[str, Any]:
    """Client options under which a call Redis does not answer raises within about `timeout_s`.

    `wait_s`: how long Redis itself may take to answer on purpose (the WAIT of
    CONFIRM_REPLICAS), added to each try's reply time so a slow confirmation
    ends in NotConfirmedError, not in a timeout that hides whether the add happened.

    Three tries (a blip is retried, and a re-sent add is harmless), each
    connect or reply waited for a quarter of the budget, short pauses between.
    No health-check PING: it retries on its own, inside a try, and would
    multiply the tries; a dead pooled connection fails the first try instead.
    """
    per_try = timeout_s / 4
    return {"socket_connect_timeout": per_try, "socket_timeout": per_try + wait_s, "health_check_interval": 0,
            "retry": Retry(ExponentialBackoff(cap=timeout_s / 20, base=timeout_s / 60), retries=2)}


def _runtime(settings: Any, long_running: bool) -> tuple[Any, Scripts]:
    """The client and scripts of a long-running process, or of a producer (bounded by ENQUEUE_TIMEOUT)."""
    if long_running:
        return _connection(settings.redis_url, None)
    wait_s = settings.confirm.timeout_ms / 1000 if settings.confirm else 0
    return _connection(settings.redis_url, settings.enqueue_timeout_s, wait_s)


@functools.cache
def _scheduler_connection(url: str) -> tuple[Any, Scripts]:
    client = connect(url, retry=None, retry_on_error=[], socket_timeout=SCHEDULER_CALL_TIMEOUT_S)
    return client, Scripts(client)


# Seconds a scheduler's call may wait for Redis's answer.
SCHEDULER_CALL_TIMEOUT_S = 2.0


def scheduler_client() -> tuple[Any, Scripts]:
    """The client (and its scripts) of echomq_beat: a call is never re-sent inside redis-py.

    A call Redis does not take fails at once (or after SCHEDULER_CALL_TIMEOUT_S
    unanswered), and the scheduler's loop tries again with what is due by
    then: a tick built before an outage is not delivered after it, beside the
    newest one (core.Beat.run).
    """
    return _scheduler_connection(get_settings().redis_url)


@functools.cache
def get_queue(name: str, *, long_running: bool = False) -> Queue:
    """A producer handle on `name`, with that queue's default attempts and backoff.

    Its calls raise ConnectionError or TimeoutError once Redis has not answered
    for ENQUEUE_TIMEOUT, so a web request fails fast; `long_running` (a
    sweeper's or a worker's process) puts it on the client that waits out outages.
    Built once per name and role (every enqueue asks for one), and again when ECHOMQ changes.
    """
    settings = get_settings()
    config = settings.queue(name)
    client, scripts = _runtime(settings, long_running)
    return Queue(name, client, prefix=settings.prefix, scripts=scripts,
                 default_opts=config.job_options,
                 max_payload_bytes=settings.max_payload_bytes, confirm=settings.confirm)


def queue_names(requested: Iterable[str] | None = None) -> list[str]:
    """The queues a command works on: those requested, else every configured one."""
    return list(dict.fromkeys(requested or get_settings().queues))  # each once, in the order given


def make_sweeper(names: Iterable[str], *, long_running: bool = True, **overrides: Any) -> Sweeper:
    """A sweeper over `names`, each with its configured interval and ceilings.

    `overrides` (interval_ms, max_stalled_count) replace the configured values
    for every queue, as the command-line options do. Without `long_running`
    (the admin's "sweep now", in a web request) its calls give up after
    ENQUEUE_TIMEOUT instead of waiting out an outage.
    """
    settings = get_settings()
    targets = []
    for name in names:
        config = settings.queue(name)
        targets.append(SweepTarget(
            name,
            interval_ms=overrides.get("interval_ms") or config.sweep_interval_ms,
            max_stalled_count=(config.max_stalled_count if overrides.get("max_stalled_count") is None
                               else overrides["max_stalled_count"]),
            default_attempts=config.attempts,
            lock_duration_ms=config.lock_duration_ms,
        ))
    client, scripts = _runtime(settings, long_running)
    return Sweeper(client, targets, prefix=settings.prefix, scripts=scripts, metrics_minutes=settings.metrics_minutes)


def make_worker(name: str, handler: Handler, *, queues: tuple[str, ...] = (), **overrides: Any) -> Worker:
    """A worker on `name` with that queue's pool, lock, concurrency, time limit and retention settings.

    `overrides`: WorkerOptions fields that replace the configured values (None keeps them), as
    worker_options takes them; `queues`: every queue the worker's process serves.
    """
    client, scripts = _runtime(get_settings(), long_running=True)
    return Worker(name, handler, client, worker_options(name, **overrides), scripts=scripts, queues=queues)


def worker_options(name: str, **overrides: Any) -> WorkerOptions:
    """The WorkerOptions of queue `name`'s settings, with `overrides` (as QueueConfig.worker_options takes them).

    A worker on the processes pool gets child.setup as what its children run first (Django, the jobs
    modules), unless the overrides give a `child_init` of their own.
    """
    settings = get_settings()
    child_init = overrides.pop("child_init", None) or child.setup
    return settings.queue(name).worker_options(settings, child_init=child_init, **overrides)


@receiver(setting_changed)
def _forget_clients(*, setting: str, **kwargs: Any) -> None:
    if setting == "ECHOMQ":
        _connection.cache_clear()
        _scheduler_connection.cache_clear()
        get_queue.cache_clear()


def check_redis() -> list[str]:
    """Ping the configured Redis once, without retries; return warnings about its configuration.

    Raises one of core.connection.UNREACHABLE when it does not answer.
    """
    settings = get_settings()
    client = connect(settings.redis_url, retry=None, retry_on_error=[], socket_connect_timeout=3)
    try:
        client.ping()
        return [warning for warning in (_eviction_warning(client), _replicas_warning(client, settings.confirm))
                if warning]
    finally:
        client.close()


def _eviction_warning(client: Any) -> str | None:
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.exceptions.ResponseError:  # CONFIG may be renamed or denied by an ACL
        return None
    if policy and policy != "noeviction":
        return (f"Redis runs with maxmemory-policy {policy!r}, not 'noeviction': under memory pressure "
                "it may evict lock keys, and live jobs would then be recovered as stalled and run twice")
    return None


def _replicas_warning(client: Any, confirm: Confirm | None) -> str | None:
    if confirm is None:
        return None
    try:
        replicas = fewest_replicas(client)
    except redis.exceptions.ResponseError:  # INFO may be denied by an ACL
        return None
    if replicas < confirm.replicas:
        return (f"ECHOMQ['CONFIRM_REPLICAS'] is {confirm.replicas}, but a primary has only {replicas} connected "
                "replica(s): adds will wait CONFIRM_TIMEOUT and then raise NotConfirmedError")
    return None


def fewest_replicas(client: Any) -> int:
    """The number of replicas connected to the primary (on a cluster, to the master with fewest)."""
    if isinstance(client, RedisCluster):
        return min(client.get_redis_connection(node).info("replication")["connected_slaves"]
                   for node in client.get_primaries())
    return client.info("replication")["connected_slaves"]
