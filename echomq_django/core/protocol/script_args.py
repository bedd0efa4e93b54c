"""Each script's ARGV by name: the wrappers in scripts.py build every call's arguments from these tables, and a
test holds them to the scripts' headers (`ARGV[i] name`), so a value can never land in the wrong place."""

from __future__ import annotations

from typing import Any

# The ARGV of each script, in order, named as its header names them (`ARGV[i]
# name`). A script that takes a list (jobs, locks) reads SCRIPT_ARGV_EACH's
# values once per item after these (its header's `ARGV[n+i] name`). The
# wrappers build ARGV from here with script_argv and script_argv_each.
SCRIPT_ARGV: dict[str, tuple[str, ...]] = {
    "addJob-9": ("prefix", "timestamp", "token", "record_ms", "sent_ms"),
    "addEdgePages-1": ("pages", "first"),
    "addLog-2": ("token", "line", "keep", "call_id"),
    "addWorkflow-8": ("prefix", "timestamp", "token", "record_ms", "workflow_id", "home", "ends", "ttl_ms", "jobs",
                      "tree", "queues"),
    "cancelJob-7": ("prefix", "job_id", "reason", "now", "record_ms", "running"),
    "cleanJobs-1": ("prefix", "cutoff_ms", "limit"),
    "deliverWorkflow-5": ("prefix", "now"),
    "extendLocks-1": ("prefix", "lock_ms"),
    "fireSchedule-6": ("prefix", "now", "tick", "job_id", "name", "data", "opts", "priority", "missed_after_ms",
                       "catch_up", "skip_if_running", "deadline", "group", "floor", "expires_ms"),
    "getCounts-11": (),
    "getJob-11": ("job_id", "log_lines", "prefix"),
    "moveStalledJobsToWait-8": ("prefix", "max_stalled_count", "now", "interval_ms", "phase", "cursor", "budget",
                                "default_attempts", "force", "lock_ms", "metrics_minutes"),
    "moveToActive-10": ("prefix", "token", "lock_ms", "now", "count", "worker_id", "metrics_minutes", "rate_max",
                        "rate_window_ms", "max_active", "group_max_active"),
    "moveToFinished-10": ("prefix", "now", "default_attempts", "keep_traces", "keep_completed_count",
                          "keep_completed_age_ms", "keep_failed_count", "keep_failed_age_ms", "metrics_minutes"),
    "pauseQueue-5": ("paused",),
    "promoteDelayed-6": ("prefix", "now", "limit", "job_id"),
    "recordStep-3": ("token", "name", "kind", "record", "max_steps", "now", "deadline"),
    "removeJob-10": ("prefix", "job_id", "only_from", "record_ms"),
    "retryJob-7": ("prefix", "job_id", "record_ms"),
    "signalJob-9": ("prefix", "job_id", "name", "payload", "call_id", "max_signals"),
    "taskRate-1": ("max", "window_ms", "job_id"),
    "updateProgress-1": ("prefix", "job_id", "token", "progress"),
}


SCRIPT_ARGV_EACH: dict[str, tuple[str, ...]] = {
    "addEdgePages-1": ("page",),
    "addJob-9": ("job_id", "name", "data", "opts", "delay_ms", "priority", "group", "expires_ms", "dedupe",
                 "dedupe_mode", "dedupe_ms"),
    "addWorkflow-8": ("job_id", "name", "data", "opts", "delay_ms", "priority", "group", "deps", "next_steps",
                      "inputs", "allow_failure"),
    "deliverWorkflow-5": ("target", "slot", "kind", "passed", "value", "origin"),
    "extendLocks-1": ("job_id", "token"),
    "getCounts-11": ("command",),
    "moveToFinished-10": ("job_id", "token", "outcome", "value", "stacktrace", "backoff_ms", "final", "error_class"),
}


def script_argv(script: str, /, **values: Any) -> list[Any]:
    """The ARGV of one call of `script`, each value named as SCRIPT_ARGV names it, in that order."""
    names = SCRIPT_ARGV[script]
    if len(values) == len(names):
        try:
            return [values[name] for name in names]
        except KeyError:
            pass
    raise _wrong_argv(script, names, values)


def script_argv_each(script: str, /, **values: Any) -> list[Any]:
    """The ARGV of one item (a job, a lock) of a call of `script`, named as SCRIPT_ARGV_EACH names them."""
    names = SCRIPT_ARGV_EACH[script]  # (script_argv's body again, not a call: a finish runs this once per job)
    if len(values) == len(names):
        try:
            return [values[name] for name in names]
        except KeyError:
            pass
    raise _wrong_argv(script, names, values)


def _wrong_argv(script: str, names: tuple[str, ...], values: dict[str, Any]) -> TypeError:
    missing, extra = [n for n in names if n not in values], [n for n in values if n not in names]
    return TypeError(f"{script} takes the ARGV {', '.join(names) or '(none)'}: "
                     f"missing {', '.join(missing) or 'none'}, unknown {', '.join(extra) or 'none'}")
