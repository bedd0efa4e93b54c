"""The outbox's relay: it sends the rows their own process could not (it died, or Redis was away), jobs then workflows.

`echomq_sweep` runs one beside its sweeps; `echomq_relay` runs one alone.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import DatabaseError, close_old_connections

from ..core import now_ms
from .jobs import RELAY_AFTER_S, RELAY_INTERVAL_S, Sent, outbox_in_use, relay_batch
from .workflows import relay_batch as relay_workflows

logger = logging.getLogger("echomq.outbox")


def relayed(command: Any, sent: Sent, verbosity: int) -> None:
    """A command's line on what one relay pass did (nothing when it did nothing, below verbosity 2)."""
    if verbosity >= 2 or (verbosity >= 1 and (sent.sent or sent.refused or sent.unsent)):
        command.stdout.write(f"outbox: sent {sent.sent}, refused {sent.refused}, left to retry {sent.unsent}")


class Relay:
    """A Runner (core.run_until_signalled) that relays the outbox every RELAY_INTERVAL_S until stopped."""

    def __init__(self, interval_s: float = RELAY_INTERVAL_S, after_s: float = RELAY_AFTER_S) -> None:
        self.interval_s, self.after_s = interval_s, after_s
        self._stopped = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            self.run_once()
            self._stopped.wait(self.interval_s)

    def run_once(self) -> Sent:
        """Relay every row due, jobs then workflows, batch after batch until one is short (or a stop); a database
        error is logged."""
        total = Sent()
        close_old_connections()
        now = now_ms()
        try:
            for batch_of in (relay_batch, relay_workflows):
                past = None
                while outbox_in_use() and not self._stopped.is_set():
                    sent, past = batch_of(after_s=self.after_s, now=now, past=past)
                    total += sent
                    if past is None:
                        break
        except DatabaseError as error:
            logger.error("outbox relay: the database failed (%s); trying again in %g s", error, self.interval_s)
        finally:
            close_old_connections()
        if total.sent or total.refused:
            logger.info("outbox relay: sent %d row(s), refused %d", total.sent, total.refused)
        return total

    def stop(self) -> None:
        self._stopped.set()

    def abort(self) -> None:
        self._stopped.set()
