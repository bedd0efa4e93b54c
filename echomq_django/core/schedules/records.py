"""What the scheduler reads and writes in Redis: the fireSchedule calls, their answers, and each schedule's record.

A tick becomes a job through one fireSchedule call, which also keeps the
schedule's record in its queue (its latest tick decided, its latest job and
its counts): the tick's job and the record are one script.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from redis.exceptions import ClusterDownError, OutOfMemoryError, ReadOnlyError, ResponseError, TryAgainError

from .. import defaults
from ..errors import PayloadError
from ..producing.tracing import send_traced, with_trace
from ..protocol.codec import encode_json
from ..protocol.connection import UNREACHABLE
from ..protocol.keys import QueueKeys, validate_job_id
from ..protocol.script_args import script_argv
from ..protocol.scripts import Call, Scripts
from ..protocol.times import now_ms
from .ticks import Schedule

logger = logging.getLogger("echomq.beat")

OUTCOMES = ("fired", "skipped", "missed", "new", "superseded")
# Answers that decided nothing: the call ran too late (it waited in a frozen Redis or a
# stalled network past its deadline), or the tick lies ahead of Redis's clock.
UNDECIDED = ("expired", "early")
# Errors that pass (Redis unreachable, a failover under way, a Redis refusing writes for a
# while): the tick stays due and is sent again. Other errors (a record of another type) are
# the data's, and would only repeat.
TRANSIENT = (*UNREACHABLE, ReadOnlyError, TryAgainError, ClusterDownError, OutOfMemoryError)
TRANSIENT_REPLIES = ("NOREPLICAS", "MISCONF", "BUSY")


def transient(error: BaseException) -> bool:
    """Whether `error` passes, so the tick stays due (see TRANSIENT)."""
    return isinstance(error, TRANSIENT) or (
        isinstance(error, ResponseError) and str(error).split(" ", 1)[0] in TRANSIENT_REPLIES)


@dataclass(frozen=True)
class Firing:
    """How one tick (or a run now: `tick_ms` None) of one schedule was decided."""

    schedule: str
    queue: str
    tick_ms: int | None
    outcome: str  # one of OUTCOMES
    job_id: str  # "" when no job was added
    decided: bool  # False: an earlier call had decided the tick (another scheduler, or a re-send)
    late_ms: int

    def summary(self) -> str:
        """One line for a log or a terminal."""
        if self.tick_ms is None:
            return f"schedule {self.schedule}: ran now as job {self.job_id} on queue {self.queue}"
        tick = datetime.fromtimestamp(self.tick_ms / 1000, UTC).isoformat(timespec="milliseconds")
        if not self.decided:
            return f"schedule {self.schedule}: tick {tick} was decided before ({self.outcome})"
        what = {"fired": f"fired job {self.job_id} on queue {self.queue}, {self.late_ms} ms late",
                "skipped": "skipped: the previous tick's job has not finished (SKIP_IF_RUNNING)",
                "missed": f"missed: found {self.late_ms / 1000:.1f} s late, and not caught up",
                "new": f"not fired: it fell {self.late_ms / 1000:.1f} s before the schedule was first seen; "
                       "its next tick is fired"}
        return f"schedule {self.schedule}: tick {tick} {what.get(self.outcome, self.outcome)}"


def send_ticks(scripts: Scripts, keys: QueueKeys, due: list[tuple[Schedule, int, int]], now: int, deadline: int,
               max_payload_bytes: int) -> tuple[list[tuple[Schedule, int]], list[Any], list[Schedule]]:
    """Send the due ticks (schedule, tick, floor) of one queue in one round trip (see Beat.fire_due).

    The ticks sent, their replies, and the schedules whose job cannot be sent
    (logged). With tracing on, the round trip is a send span, whose context the jobs it fires carry.
    """
    sent: list[tuple[Schedule, int]] = []
    replies: list[Any] = []
    refused: list[Schedule] = []

    def fire(trace: str) -> list[str]:
        calls = []
        for schedule, tick, floor in due:
            try:
                # Once the next tick is due this call is stale: that tick is sent instead (coalesced).
                call_deadline = min(deadline, schedule.tick_after(tick)) if deadline else 0
                calls.append(fire_call(keys, schedule, now, tick, max_payload_bytes=max_payload_bytes,
                                       deadline=call_deadline, floor=floor, trace=trace))
                sent.append((schedule, tick))
            except PayloadError as error:
                logger.error("schedule %s: cannot add its job: %s", schedule.name, error)
                refused.append(schedule)
        replies.extend(scripts.run_batch(calls))
        return [str(reply[1]) for reply in replies  # the jobs this call added (decided, fired)
                if not isinstance(reply, Exception) and reply[0] == "fired" and str(reply[2]) == "1"]

    send_traced(keys.queue, fire, len(due))
    return sent, replies, refused


def fire_call(keys: QueueKeys, schedule: Schedule, now: int, tick: int | None, job_id: str = "", *,
              max_payload_bytes: int = defaults.MAX_PAYLOAD_BYTES, deadline: int = 0, floor: int = 0,
              trace: str = "") -> Call:
    """The fireSchedule call for one tick, or with `tick` None for a run now under `job_id`.

    `deadline`: the latest time by Redis's clock the call may run at and
    decide (0: no limit, and no look at Redis's clock). `floor`: the newest
    tick decided on a queue the schedule moved from (see Beat). `trace`: the
    context of the send span the job carries (tracing.py). PayloadError
    when the schedule's data is not JSON or too large for the queue.
    """
    data = encode_json(schedule.data, f"data of schedule {schedule.name!r}", max_payload_bytes)
    if tick is None:
        timing: dict[str, Any] = {"tick": "", "job_id": job_id, "missed_after_ms": 0, "catch_up": 0}
    else:
        catch_up = schedule.catch_up and tick >= schedule.since_ms
        timing = {"tick": tick, "job_id": schedule.job_id(tick), "missed_after_ms": schedule.missed_after_ms(tick),
                  "catch_up": int(catch_up)}
    return ("fireSchedule-6", keys.for_script("fireSchedule-6", name=schedule.name), script_argv(
        "fireSchedule-6", prefix=keys.base, now=now, **timing, name=schedule.job_name, data=data,
        opts=with_trace(schedule.opts.encoded(), trace), priority=schedule.opts.priority,
        skip_if_running=int(schedule.skip_if_running),
        deadline=deadline, group=schedule.opts.group, floor=floor, expires_ms=schedule.opts.expires_ms))


def firing_from(schedule: Schedule, tick: int | None, now: int, reply: list[Any]) -> Firing:
    outcome, job_id, decided = reply
    return Firing(schedule.name, schedule.queue, tick, str(outcome), str(job_id), bool(int(decided)),
                  now - tick if tick is not None else 0)


def run_now(scripts: Scripts, schedule: Schedule, job_id: str, *, prefix: str = defaults.PREFIX,
            max_payload_bytes: int = defaults.MAX_PAYLOAD_BYTES) -> Firing:
    """Add the schedule's job now under `job_id`, outside its ticks (the admin's "run now").

    It becomes the schedule's latest job (which SKIP_IF_RUNNING waits for).
    """
    now = now_ms()
    keys, job_id = QueueKeys(schedule.queue, prefix), validate_job_id(job_id)
    replies: list[Any] = []

    def fire(trace: str) -> list[str]:
        call = fire_call(keys, schedule, now, None, job_id, max_payload_bytes=max_payload_bytes, trace=trace)
        replies.extend(scripts.run_batch([call], raise_on_error=True))
        return [str(replies[0][1])]

    send_traced(schedule.queue, fire)
    return firing_from(schedule, None, now, replies[0])


def read_floors(client: Any, elsewhere: dict[str, list[str]], now: int, *,
                prefix: str = defaults.PREFIX) -> dict[str, int]:
    """The newest tick decided for each schedule on the other queues named for it (0: none), in one round trip.

    `elsewhere` maps a schedule's name to the queues it may have moved from
    (see Beat). A record tick ahead of Redis's clock (`now`) does not count,
    as in fireSchedule. Raises the error when Redis does not answer or
    refuses for a while (`transient`); a record that cannot be read otherwise
    is logged, and counts as none.
    """
    asked: list[tuple[str, str]] = []
    pipe = client.pipeline(transaction=False)
    for name, queues in elsewhere.items():
        for queue in queues:
            pipe.hget(QueueKeys(queue, prefix).schedule(name), "tick")
            asked.append((name, queue))
    replies = pipe.execute(raise_on_error=False) if asked else []
    floors = dict.fromkeys(elsewhere, 0)
    for (name, queue), reply in zip(asked, replies):
        if isinstance(reply, Exception):
            if transient(reply):
                raise reply
            logger.error("schedule %s: its record on queue %s cannot be read (%s)", name, queue, reply)
        elif reply is not None and str(reply).isdigit() and int(reply) <= now + defaults.EARLY_MS:
            floors[name] = max(floors[name], int(reply))
    return floors


@dataclass(frozen=True)
class Record:
    """What Redis remembers of a schedule: its latest tick decided, and its latest job."""

    tick_ms: int | None = None
    outcome: str = ""
    job_id: str = ""
    fired_at_ms: int | None = None
    counts: dict[str, int] = field(default_factory=dict)  # ticks per outcome
    ran_now: bool = False  # the latest job was a run now, not a tick's


def read_records(client: Any, schedules: Iterable[Schedule], *, prefix: str = defaults.PREFIX) -> list[Record]:
    """The records of these schedules, in order, in one pipelined round trip (a broken one reads as empty)."""
    schedules = list(schedules)
    pipe = client.pipeline(transaction=False)
    for schedule in schedules:
        pipe.hgetall(QueueKeys(schedule.queue, prefix).schedule(schedule.name))
    return [_record(fields if isinstance(fields, dict) else {})
            for fields in pipe.execute(raise_on_error=False)]


def _record(fields: dict[str, str]) -> Record:
    def number(name: str) -> int | None:
        try:
            return int(fields[name])
        except (KeyError, ValueError):
            return None

    return Record(tick_ms=number("tick"), outcome=fields.get("outcome", ""), job_id=fields.get("job", ""),
                  fired_at_ms=number("firedAt"),
                  counts={outcome: number(outcome) or 0 for outcome in OUTCOMES[:3]},
                  ran_now="job" in fields and fields.get("firedTick") == "")
