"""The queue runtime: Redis, the Lua protocol and Python, without Django.

Everything a producer, a worker, a sweeper or an operator's page needs is
importable from here, and the Django app around it imports nothing else of
core (tests/system/test_packaging.py checks); the app only adds settings, commands,
models and the admin.
"""

from . import defaults
from .defaults import __version__
from .errors import (
    MAX_WAIT_S,
    DurableError,
    EchoMQError,
    InvalidNameError,
    JobCancelled,
    JobFailedError,
    JobLockedError,
    JobNotFinishedError,
    JobNotFoundError,
    LockLostError,
    NotConfirmedError,
    PayloadError,
    Postponed,
    QueueStateError,
    RateLimited,
    RedisURLError,
    Retry,
    ScheduleError,
    SignalRefused,
    SignalTimeout,
    SoftTimeLimitExceeded,
    StepFailed,
    TimeLimitExceeded,
    UnrecoverableError,
    WorkflowError,
    fail_for_good,
)
from .producing.handle import JobHandle, deadline_of
from .producing.new_jobs import Dedupe, EncodedJob, NewJob
from .producing.outcomes import BULK_BATCH, GONE, STOPPING, BulkOutcome, Cancel
from .producing.queue import Queue
from .producing.tracing import send_traced, use_tracer_provider
from .producing.workflow import Canvas, Chain, Chord, Group, Linked, Member, Plan
from .producing.workflow_handle import WorkflowHandle
from .producing.workflow_tree import MAX_DEPTH, read_tree, tree_nodes
from .protocol.codec import TooDeep, decode_stored, encode_json, log_line
from .protocol.connection import DEFAULT_REDIS_URL, UNREACHABLE, connect, parse_redis_url, redacted_url
from .protocol.job import Job
from .protocol.keys import (
    ALPHABET,
    COUNTED,
    STATES,
    QueueKeys,
    validate_id,
    validate_job_id,
    validate_job_name,
    validate_name,
    validate_stored_id,
)
from .protocol.options import MAX_ATTEMPTS, MAX_DELAY_MS, MAX_PRIORITY, MIN_PRIORITY, Backoff, JobOptions
from .protocol.registry import WorkerInfo
from .protocol.scripts import MAX_RATE_WINDOW_MS, Confirm, RateLimit, Scripts
from .protocol.times import datetime_from_ms, delay_until, now_ms, seconds_text
from .protocol.transport import OWN_CONNECTIONS_ENV, own_connections_wanted
from .reading.browse import BROWSABLE, Entry, Page, browse, state_ids, state_size
from .reading.bulk_runs import BulkRun, read_run, run_step, start_run
from .reading.durable_steps import StepRecord, StepsRead, read_steps, waiting_for
from .reading.flow_control import FlowState, GroupState, flow_state
from .reading.inspection import (
    LiveJob,
    count_failed_older_than,
    count_failed_since,
    failed_by_rank,
    failed_count,
    failed_since,
    inspect_jobs,
    jobs_gone,
    read_jobs,
)
from .reading.metrics import Minute, oldest_waiting_age_ms, recent_minutes, totals
from .schedules.beat import Beat
from .schedules.records import Firing, Record, read_records, run_now, transient
from .schedules.ticks import MAX_SCHEDULE_NAME, MIN_EVERY_MS, Schedule, check_cron, zone
from .worker import durable
from .worker.options import Retention, WorkerOptions
from .worker.pool import POOLS, Handler, class_path
from .worker.signals import SECOND_STOP_GRACE_S, RecordedSignals, Runner, run_until_signalled
from .worker.sweeper import Sweeper, SweepReport, SweepTarget, last_sweep
from .worker.worker import Worker, abandoned_threads

__all__ = [
    "__version__", "WorkerOptions", "durable", "DurableError", "SignalTimeout", "StepFailed",
    "ALPHABET", "BROWSABLE", "MAX_SCHEDULE_NAME", "MIN_EVERY_MS", "COUNTED", "DEFAULT_REDIS_URL", "MAX_ATTEMPTS",
    "MAX_DELAY_MS", "MAX_RATE_WINDOW_MS", "OWN_CONNECTIONS_ENV", "own_connections_wanted", "POOLS", "STATES",
    "UNREACHABLE", "Backoff", "Beat", "Cancel", "Confirm", "EncodedJob", "Firing",
    "Record", "Schedule", "ScheduleError", "check_cron", "read_records", "run_now", "seconds_text", "transient",
    "zone", "EchoMQError", "Entry", "Handler", "InvalidNameError", "Job", "JobCancelled", "JobLockedError",
    "JobNotFoundError", "JobOptions", "LiveJob", "LockLostError", "Minute", "NewJob", "NotConfirmedError", "Page",
    "PayloadError", "Queue", "QueueKeys", "QueueStateError", "RateLimit", "RateLimited", "RedisURLError", "Retention",
    "Scripts", "SoftTimeLimitExceeded", "SweepReport", "SweepTarget", "Sweeper", "TimeLimitExceeded", "TooDeep",
    "UnrecoverableError", "Worker", "abandoned_threads", "browse", "class_path", "connect", "count_failed_older_than",
    "count_failed_since", "datetime_from_ms", "defaults", "encode_json", "fail_for_good", "failed_by_rank",
    "failed_count", "failed_since", "inspect_jobs", "jobs_gone", "last_sweep", "log_line", "now_ms",
    "oldest_waiting_age_ms",
    "parse_redis_url", "read_jobs", "recent_minutes", "redacted_url", "totals", "validate_id", "validate_job_id",
    "validate_name", "validate_stored_id", "FlowState", "GroupState", "flow_state", "RecordedSignals", "Runner",
    "SECOND_STOP_GRACE_S",
    "run_until_signalled", "MAX_PRIORITY", "MIN_PRIORITY", "validate_job_name", "delay_until", "Retry", "Chain",
    "Chord", "Group", "Member", "Plan", "WorkflowError", "WorkflowHandle", "read_tree", "tree_nodes", "JobHandle",
    "JobFailedError", "Linked", "Postponed", "Canvas", "deadline_of", "MAX_WAIT_S",
    "JobNotFinishedError", "Dedupe", "WorkerInfo", "BULK_BATCH", "GONE", "STOPPING", "BulkOutcome", "BulkRun",
    "read_run", "decode_stored", "run_step", "start_run", "MAX_DEPTH", "state_ids",
    "state_size", "send_traced", "use_tracer_provider",
    "SignalRefused", "StepRecord", "StepsRead", "read_steps", "waiting_for",
]
