"""The queue runtime: Redis, the Lua protocol and Python, without Django.

Everything a producer, a worker or a sweeper needs is importable from here;
the Django app around it only adds settings, commands, models and the admin.
"""

from .connection import DEFAULT_REDIS_URL, RedisURLError, connect
from .errors import (
    EchoMQError,
    InvalidNameError,
    JobLockedError,
    JobNotFoundError,
    LockLostError,
    NotConfirmedError,
    PayloadError,
    QueueStateError,
    UnrecoverableError,
)
from .job import Backoff, Job, JobOptions
from .keys import COUNTED, STATES, QueueKeys, validate_job_id, validate_name
from .queue import NewJob, Queue
from .scripts import Confirm, Scripts
from .sweeper import Sweeper, SweepReport, SweepTarget
from .worker import Retention, Worker

__all__ = [
    "COUNTED", "DEFAULT_REDIS_URL", "Backoff", "Confirm", "EchoMQError", "InvalidNameError", "Job", "JobLockedError",
    "JobNotFoundError", "JobOptions", "LockLostError", "NewJob", "NotConfirmedError", "PayloadError",
    "Queue", "QueueKeys", "QueueStateError", "RedisURLError", "Retention", "STATES", "Scripts", "SweepReport",
    "SweepTarget", "Sweeper", "UnrecoverableError", "Worker",
    "connect", "validate_job_id", "validate_name",
]
