"""The transactional outbox: jobs and workflows enqueued inside a transaction are written in it, sent after its commit.

`jobs` (a job as an OutboxJob row: written, sent after the commit, relayed,
and what the outbox holds per queue), `workflows` (a workflow as one
OutboxWorkflow row, planned again when it is sent), `relaying` (the relay that
sends the rows their process left: `echomq_sweep` runs one, `echomq_relay`
runs it alone) and `models` (the two tables). The names below are the
outbox's public face: `echomq_django.outbox.enqueue`, `.Relay` and the rest.
"""

from .jobs import (
    RECORD_MARGIN_MS,
    RELAY_AFTER_S,
    RELAY_BATCH,
    RELAY_INTERVAL_S,
    SEND_JOBS_PER_CALL,
    QueueOutbox,
    Sent,
    enqueue,
    new_job_id,
    outbox_in_use,
    outbox_state,
    relay,
    relay_batch,
    send,
    send_written,
)
from .models import OutboxJob, OutboxWorkflow
from .relaying import Relay, relayed

__all__ = ["RECORD_MARGIN_MS", "RELAY_AFTER_S", "RELAY_BATCH", "RELAY_INTERVAL_S", "SEND_JOBS_PER_CALL", "OutboxJob",
           "OutboxWorkflow", "QueueOutbox", "Relay", "Sent", "enqueue", "new_job_id", "outbox_in_use", "outbox_state",
           "relay", "relay_batch", "relayed", "send", "send_written"]
