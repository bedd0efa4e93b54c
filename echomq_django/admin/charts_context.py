"""The dashboard's pictures of a queue: its per-minute metrics in slots, and the two charts drawn from them.

Pure code over `Minute`s already read (one pipelined read per queue, in
dashboard.py), so the slotting can be tested without a Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils import timezone
from django.utils.safestring import SafeString

from ..charts import Series, line_chart
from ..core import Minute


@dataclass(frozen=True)
class Span:
    """A stretch of time the dashboard draws: `slots` points of `slot_minutes` each, ending with the minute now."""

    key: str  # its value of the page's ?range=
    label: str
    slot_minutes: int
    slots: int

    @property
    def minutes(self) -> int:
        return self.slot_minutes * self.slots


HOUR = Span("hour", "last hour", slot_minutes=1, slots=60)
DAY = Span("day", "last day", slot_minutes=15, slots=96)
SPANS = {span.key: span for span in (HOUR, DAY)}


@dataclass(frozen=True)
class Slots:
    """A span's metrics, one value per slot, oldest first; None where nothing is known."""

    labels: list[str]  # the slot's last minute, "HH:MM" in the site's time zone
    completed: list[float | None]  # jobs completed per minute
    failed: list[float | None]  # jobs failed for good per minute
    waiting: list[int | None]  # jobs ready but not taken, as last sampled in the slot


def slot_metrics(minutes: Sequence[Minute], span: Span, *, live_waiting: int | None = None) -> Slots:
    """Put `minutes` (oldest first, the last the minute now) into the slots of `span`.

    Completed and failed become the mean per minute of the minutes the slot
    holds; waiting is the slot's last sample, from the sweeps, which sample it
    once an interval, so a slot no sweep looked at is a gap. `live_waiting`, a
    count read now, replaces the last slot's: it is newer than any sample.
    Minutes older than those given (fewer are kept) are gaps too.
    """
    if not minutes:
        raise ValueError("slot_metrics needs at least the minute now")
    recent = list(minutes[-span.minutes:])
    now_minute = datetime.fromtimestamp(recent[-1].start_ms / 1000, tz=UTC)
    known: list[Minute | None] = [None] * (span.minutes - len(recent)) + recent
    labels: list[str] = []
    completed: list[float | None] = []
    failed: list[float | None] = []
    waiting: list[int | None] = []
    for slot in range(span.slots):
        chunk = known[slot * span.slot_minutes:(slot + 1) * span.slot_minutes]
        kept = [minute for minute in chunk if minute is not None]
        labels.append(clock(now_minute - timedelta(minutes=(span.slots - 1 - slot) * span.slot_minutes)))
        completed.append(sum(minute.completed for minute in kept) / len(kept) if kept else None)
        failed.append(sum(minute.failed for minute in kept) / len(kept) if kept else None)
        waiting.append(next((minute.waiting for minute in reversed(kept) if minute.waiting is not None), None))
    if live_waiting is not None:
        waiting[-1] = live_waiting
    return Slots(labels, completed, failed, waiting)


def clock(moment: datetime) -> str:
    """The time of day of `moment`, "HH:MM" in the site's time zone."""
    return timezone.localtime(moment).strftime("%H:%M")


def queue_charts(queue_name: str, slots: Slots, span: Span) -> list[SafeString]:
    """The two pictures of a queue over `span`: jobs finished per minute, and jobs waiting."""
    per_slot = "per minute" if span.slot_minutes == 1 else f"per minute, by {span.slot_minutes} minutes"
    throughput = line_chart(
        [Series("completed", slots.completed, "completed"), Series("failed", slots.failed, "failed")],
        slot_labels=slots.labels, title=f"Queue {queue_name}: jobs finished {per_slot}, {span.label}",
        unit="jobs/min")
    waiting = line_chart(
        [Series("waiting", slots.waiting, "waiting")], slot_labels=slots.labels,
        title=f"Queue {queue_name}: jobs waiting, {span.label}", unit="jobs")
    return [throughput, waiting]
