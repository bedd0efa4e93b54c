"""The runtime's defaults, each defined once, and the time bounds the scripts share.

The classes use the defaults as their keyword defaults, and the Django settings
(echomq_django/conf.py) fall back to them, so a value left out means the same
thing whichever way the runtime is built. Durations are in milliseconds.
"""

__version__ = "0.1.0"  # the package's version (echomq_django.__version__), in each worker's record
PREFIX = "emq"  # the first part of every key: emq:{queue}:...
REDIS_URL = "redis://127.0.0.1:6379/0"
MAX_PAYLOAD_BYTES = 512 * 1024  # a job's data, JSON-encoded
ATTEMPTS = 3  # runs a job gets before it stays failed
LOCK_DURATION_MS = 30_000  # a lock lives this long unless renewed
SWEEP_INTERVAL_MS = 30_000  # between sweeps of a queue; also the gate's lifetime
MAX_STALLED_COUNT = 1  # stalls a job may survive before it is failed
CONCURRENCY = 1  # worker threads per queue
KEEP_COMPLETED_COUNT = 1000  # completed jobs kept per queue (None: all)
CONFIRM_TIMEOUT_MS = 1000  # how long WAIT waits for the replicas of a confirmed write
METRICS_MINUTES = 1440  # minutes of per-minute metrics a queue keeps (0: none, and no all-time counters)
MAX_LOG_LINES = 1000  # log lines a job keeps; the oldest go first

# Bounds, not defaults: the scripts get them from here (core/protocol/lua.py's generated
# include "constants"), so the two sides hold a value to the same bound.
MAX_METRICS_MINUTES = 527_040  # a year: the most minutes of metrics a queue keeps, whatever it is asked
# The workflow edges one script call delivers in this queue beyond the ends it was called for: a
# failure spreading down a long chain, or one member's fan-out, goes on from the queue's `handoff`
# list in later calls of this size (includes/workflow.lua).
WORKFLOW_DELIVERIES_PER_CALL = 500
# A workflow step whose end goes to more steps than this keeps its edges in pages of this many
# (addEdgePages), delivered a page a call, rather than in its hash, which each delivery decodes whole.
WORKFLOW_FAN_EDGES = 100
# The most bytes of a member's failure reason its workflow carries on: into every later step a failure
# fails, each hand-off entry, the record and `on_error`'s input. A job's own failedReason stays whole.
WORKFLOW_REASON_BYTES = 4096
EARLY_MS = 2000  # how far ahead of Redis's clock a schedule's tick may be and still count (fireSchedule)
# Durable steps (core/worker/durable.py): a job records at most MAX_STEPS steps (recordStep refuses more), each
# result and each signal's payload at most MAX_RESULT_BYTES of JSON, and keeps at most MAX_SIGNALS signals.
MAX_STEPS = 10_000
MAX_RESULT_BYTES = 1024 * 1024
MAX_SIGNALS = 1_000
