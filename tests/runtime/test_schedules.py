"""Schedules in the runtime: tick times (intervals, cron, DST), and fireSchedule deciding each tick once."""

import logging
import threading
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from redis.exceptions import ReadOnlyError

from echomq_django.core import Beat, JobOptions, Queue, Schedule, ScheduleError, read_records, run_now
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.schedules.ticks import MISSED_AFTER_MS
from tests.helpers import fetch, finish, wait_until

HOUR = 3_600_000
DAY = 24 * HOUR


def ms(text: str, zone: str = "UTC") -> int:
    """A local time, e.g. "2027-03-28T03:00", in `zone`, as ms since the epoch."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=ZoneInfo(zone))
    return round(moment.timestamp() * 1000)


def every(seconds: float, name: str = "tick", **options) -> Schedule:
    return Schedule(name, "q", "job.tick", {"args": [], "kwargs": {}}, every_ms=round(seconds * 1000), **options)


def cron(expression: str, zone: str = "UTC", name: str = "nightly", **options) -> Schedule:
    return Schedule(name, "q", "job.nightly", {"args": [], "kwargs": {}}, cron=expression, timezone=zone, **options)


def beat_for(queue, *schedules: Schedule, **options) -> Beat:
    beat = Beat(queue.client, lambda: schedules, prefix=queue.keys.prefix, scripts=queue.scripts, **options)
    beat.reload()
    return beat


def jobs_in(queue, state: str = "wait") -> list[str]:
    return sorted(job.id for job in queue.get_jobs(state, 0, 10_000))


# -- when ticks are -------------------------------------------------------------

def test_interval_ticks_are_whole_multiples_of_the_period_since_the_epoch_so_they_never_drift():
    schedule = every(0.25)
    assert schedule.tick_at_or_before(1_000_130) == 1_000_000
    assert schedule.tick_at_or_before(1_000_000) == 1_000_000  # a tick at the instant is included
    assert schedule.tick_after(1_000_000) == 1_000_250
    # Tick n is n x EVERY whenever it is asked for, not "the last fire + EVERY".
    assert schedule.next_ticks(10 ** 12 + 7, 4000)[-1] == 10 ** 12 + 4000 * 250


@pytest.mark.parametrize(("zone", "day", "valid_at"), [
    ("Europe/Berlin", "2027-03-28", "2027-03-28T03:00+02:00"),
    ("America/New_York", "2027-03-14", "2027-03-14T03:00-04:00"),
])
def test_on_the_spring_forward_day_a_0230_job_fires_once_at_the_next_valid_time(zone, day, valid_at):
    schedule = cron("30 2 * * *", zone)
    ticks = schedule.next_ticks(ms(f"{day}T00:00", zone) - DAY, 4)
    assert ticks[1] == ms(valid_at)  # 02:30 does not exist that day: 03:00, once
    # One tick that day: 23.5 h after the day before's (an hour is skipped), 23.5 h before the next.
    assert [b - a for a, b in zip(ticks, ticks[1:])] == [DAY - HOUR // 2, DAY - HOUR // 2, DAY]


@pytest.mark.parametrize(("zone", "day", "expression", "first"), [
    ("Europe/Berlin", "2027-10-31", "30 2 * * *", "2027-10-31T02:30+02:00"),
    ("America/New_York", "2027-11-07", "30 1 * * *", "2027-11-07T01:30-04:00"),
])
def test_on_the_fall_back_day_a_job_in_the_repeated_hour_fires_once_not_twice(zone, day, expression, first):
    schedule = cron(expression, zone)
    ticks = schedule.next_ticks(ms(f"{day}T00:00", zone), 3)
    assert ticks[0] == ms(first)  # the first of the two 02:30s (01:30s)
    assert ticks[1] - ticks[0] == DAY + HOUR  # the next is tomorrow's, not an hour later


@pytest.mark.parametrize(("zone", "spring", "fall"), [
    ("Europe/Berlin", "2027-03-28", "2027-10-31"),
    ("America/New_York", "2027-03-14", "2027-11-07"),
])
def test_a_beat_running_through_both_dst_days_adds_one_job_a_day(queue, zone, spring, fall):
    """The whole chain, Redis included, with the clock stepped a minute at a time (no waiting until 2027)."""
    expression = "30 2 * * *" if zone == "Europe/Berlin" else "30 1 * * *"
    for day in (spring, fall):
        schedule = cron(expression, zone, name=f"nightly-{day}")  # new: nothing from before `start` to catch up
        start = ms(f"{day}T00:00", zone) - DAY
        beat = beat_for(queue, schedule)
        fired = []
        for now in range(start, start + 3 * DAY, 60_000):
            fired += [firing for firing in beat.fire_due(now) if firing.outcome == "fired"]
        ticks = [firing.tick_ms for firing in fired]
        assert ticks == schedule.next_ticks(start, 3)  # three days, three jobs, at the right instants
        assert all(firing.late_ms < 60_000 for firing in fired)
    assert len(jobs_in(queue)) == 6


def test_the_hourly_job_runs_in_both_repeated_hours_of_the_fall_back_day():
    # Only a daily time repeats wrongly; something every hour runs in each real hour, as cron does.
    schedule = cron("0 * * * *", "Europe/Berlin")
    ticks = schedule.next_ticks(ms("2027-10-31T00:30", "Europe/Berlin"), 4)
    assert [b - a for a, b in zip(ticks, ticks[1:])] == [HOUR, HOUR, HOUR]


@pytest.mark.parametrize(("options", "message"), [
    ({"cron": "0 3 * *"}, "five fields"),
    ({"cron": "0 3 * * * *"}, "five fields"),
    ({"cron": "61 3 * * *"}, "Bad minute"),
    ({"cron": "0 0 30 2 *"}, "day-of-month"),
    ({"cron": "0 3 * * *", "every_ms": 1000}, "exactly one"),
    ({}, "exactly one"),
    ({"every_ms": 10}, "from 100 ms"),
    ({"every_ms": 1.5}, "from 100 ms"),
    ({"every_ms": 1000, "timezone": "Mars/Olympus"}, "unknown time zone"),
])
def test_a_schedule_that_cannot_be_is_refused_with_the_reason(options, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule("s", "q", "job", **options)


def test_schedule_names_are_key_safe_and_leave_room_for_the_tick_in_the_job_id():
    with pytest.raises(ValueError, match="may hold only"):
        every(1, name="a:b")
    with pytest.raises(ScheduleError, match="limit is 100"):
        every(1, name="x" * 101)
    assert every(1, name="x" * 100).job_id(10 ** 13) == "x" * 100 + "@10000000000000"


# -- fireSchedule: each tick decided once ----------------------------------------

def test_a_tick_is_one_job_however_many_beats_send_it_at_once(queue):
    schedule = every(60)
    tick = schedule.tick_at_or_before(queue_now := 1_800_000_000_000)
    beats = [beat_for(queue, schedule) for _ in range(8)]
    start, results = threading.Barrier(8), []

    def fire(beat: Beat) -> None:
        start.wait()
        results.extend(beat.fire_due(queue_now))

    threads = [threading.Thread(target=fire, args=(beat,)) for beat in beats]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(results) == 8 and {firing.tick_ms for firing in results} == {tick}
    assert [firing.decided for firing in results].count(True) == 1
    assert {firing.job_id for firing in results} == {f"tick@{tick}"}  # the others are told which job it was
    assert jobs_in(queue) == [f"tick@{tick}"]
    job = queue.get_job(f"tick@{tick}")
    assert (job.name, job.data, job.timestamp) == ("job.tick", {"args": [], "kwargs": {}}, queue_now)


def test_a_re_sent_call_changes_nothing_and_answers_as_the_first(queue):
    schedule = every(60)
    now = 1_800_000_000_000
    first = beat_for(queue, schedule).fire_due(now)
    again = beat_for(queue, schedule).fire_due(now + 5)  # another beat, or the same call sent again
    assert first[0].outcome == again[0].outcome == "fired" and first[0].job_id == again[0].job_id
    assert (first[0].decided, again[0].decided) == (True, False)
    assert len(jobs_in(queue)) == 1


def test_a_beat_back_after_missing_ticks_fires_only_the_newest_once(queue):
    schedule = every(1)
    now = 1_800_000_000_000
    beat = beat_for(queue, schedule)
    assert [f.outcome for f in beat.fire_due(now)] == ["fired"]
    # Down for 30 ticks: on return one job, for the newest tick, however late.
    firings = beat.fire_due(now + 30_400)
    assert [(f.outcome, f.tick_ms, f.late_ms) for f in firings] == [("fired", now + 30_000, 400)]
    assert beat.fire_due(now + 30_900) == []  # nothing new is due yet
    assert len(jobs_in(queue)) == 2


def test_catch_up_false_skips_a_missed_tick_and_fires_the_next_on_time(queue):
    schedule = cron("0 * * * *", catch_up=False)
    first = 1_800_000_000_000 // HOUR * HOUR
    beat = beat_for(queue, schedule)
    assert [f.outcome for f in beat.fire_due(first + 2_000)] == ["fired"]  # on time (2 s late)
    late = first + 3 * HOUR + MISSED_AFTER_MS + 1
    assert [(f.outcome, f.tick_ms) for f in beat.fire_due(late)] == [("missed", first + 3 * HOUR)]
    assert [f.outcome for f in beat.fire_due(first + 4 * HOUR + 10)] == ["fired"]
    assert len(jobs_in(queue)) == 2
    [record] = read_records(queue.client, [schedule], prefix=queue.keys.prefix)
    assert record.counts == {"fired": 2, "skipped": 0, "missed": 1} and record.outcome == "fired"


def test_with_catch_up_the_same_late_tick_fires(queue):
    schedule = cron("0 * * * *")
    first = 1_800_000_000_000 // HOUR * HOUR
    beat = beat_for(queue, schedule)
    beat.fire_due(first + 2_000)
    assert [f.outcome for f in beat.fire_due(first + 3 * HOUR + 2 * MISSED_AFTER_MS)] == ["fired"]


def test_a_new_schedule_does_not_fire_what_fell_before_it_existed(queue):
    # Deployed at 10:00, a 03:00 job waits for tomorrow's 03:00 instead of running now.
    schedule = cron("0 3 * * *")
    deploy = ms("2027-05-04T10:00")
    [firing] = beat_for(queue, schedule).fire_due(deploy)
    assert firing.outcome == "new"
    assert "it fell 25200.0 s before the schedule was first seen" in firing.summary()  # 03:00 is 7 h before 10:00
    assert jobs_in(queue) == []
    [record] = read_records(queue.client, [schedule], prefix=queue.keys.prefix)
    assert record.counts == {"fired": 0, "skipped": 0, "missed": 0}  # nothing was missed: it did not exist
    assert [f.outcome for f in beat_for(queue, schedule).fire_due(ms("2027-05-05T03:00:00.300"))] == ["fired"]


def test_ticks_before_since_are_not_caught_up(queue):
    # A schedule re-enabled (or changed) at `since` does not fire the tick it slept through.
    first = 1_800_000_000_000 // HOUR * HOUR
    beat_for(queue, cron("0 * * * *")).fire_due(first + 10)
    since = first + 5 * HOUR + 20 * 60_000
    later = cron("0 * * * *", since_ms=since)
    assert [f.outcome for f in beat_for(queue, later).fire_due(since)] == ["missed"]
    assert [f.outcome for f in beat_for(queue, later).fire_due(first + 6 * HOUR + 5)] == ["fired"]


def test_a_schedule_moved_to_another_queue_does_not_fire_its_last_tick_again_there(queue):
    # The tick's record is kept per queue: on the new queue only `since` tells it was decided.
    tick = 1_800_000_000_000 // 60_000 * 60_000
    assert [f.outcome for f in beat_for(queue, every(60)).fire_due(tick + 10)] == ["fired"]
    other = Queue("other", queue.client, prefix=queue.keys.prefix, scripts=queue.scripts)
    moved = Schedule("tick", "other", "job.tick", {"args": [], "kwargs": {}}, every_ms=60_000, since_ms=tick + 5_000)
    assert [f.outcome for f in beat_for(queue, moved).fire_due(tick + 6_000)] == ["new"]  # on time, but before the move
    assert jobs_in(other) == []
    assert [f.outcome for f in beat_for(queue, moved).fire_due(tick + 60_010)] == ["fired"]
    assert jobs_in(other) == [f"tick@{tick + 60_000}"]


def test_skip_if_running_skips_while_the_previous_job_has_not_finished(queue):
    schedule = every(60, skip_if_running=True)
    now = 1_800_000_000_000 // 60_000 * 60_000
    beat = beat_for(queue, schedule)
    assert [f.outcome for f in beat.fire_due(now)] == ["fired"]
    assert [f.outcome for f in beat.fire_due(now + 60_000)] == ["skipped"]  # still waiting
    [(job_id, _)] = fetch(queue, "tok")
    assert [f.outcome for f in beat.fire_due(now + 120_000)] == ["skipped"]  # running
    finish(queue, job_id, "tok")
    assert [f.outcome for f in beat.fire_due(now + 180_000)] == ["fired"]
    [record] = read_records(queue.client, [schedule], prefix=queue.keys.prefix)
    assert record.counts == {"fired": 2, "skipped": 2, "missed": 0}
    assert record.job_id == f"tick@{now + 180_000}"


def test_without_skip_if_running_ticks_fire_while_the_previous_job_waits(queue):
    schedule = every(60)
    now = 1_800_000_000_000 // 60_000 * 60_000
    beat = beat_for(queue, schedule)
    assert [f.outcome for f in beat.fire_due(now) + beat.fire_due(now + 60_000)] == ["fired", "fired"]


def test_run_now_adds_a_job_outside_the_ticks_and_becomes_the_latest_job(queue):
    schedule = every(60, skip_if_running=True)
    firing = run_now(queue.scripts, schedule, "tick@now-1", prefix=queue.keys.prefix)
    assert (firing.outcome, firing.job_id, firing.tick_ms) == ("fired", "tick@now-1", None)
    assert queue.get_job("tick@now-1").name == "job.tick"
    [record] = read_records(queue.client, [schedule], prefix=queue.keys.prefix)
    assert (record.job_id, record.tick_ms) == ("tick@now-1", None)
    # The ticks are untouched, but the job it added counts as running for SKIP_IF_RUNNING.
    now = 1_800_000_000_000 // 60_000 * 60_000
    beat_for(queue, every(60)).fire_due(now)  # the schedule's first tick, fired while nothing ran
    queue.client.hset(queue.keys.schedule("tick"), "job", "tick@now-1")
    assert [f.outcome for f in beat_for(queue, schedule).fire_due(now + 60_000)] == ["skipped"]


def test_a_tick_whose_job_exists_already_is_recorded_not_added_again(queue):
    schedule = every(60)
    now = 1_800_000_000_000 // 60_000 * 60_000
    queue.add("other.name", {"x": 1}, job_id=f"tick@{now}")  # e.g. the record was lost with a restored backup
    assert [f.outcome for f in beat_for(queue, schedule).fire_due(now)] == ["fired"]
    assert queue.get_job(f"tick@{now}").name == "other.name"
    assert len(jobs_in(queue)) == 1


def test_a_tick_of_a_paused_queue_waits_in_paused_and_priorities_are_kept(queue):
    now = 1_800_000_000_000 // 60_000 * 60_000
    urgent = Schedule("urgent", "q", "job.u", None, JobOptions(priority=5), every_ms=60_000)
    beat_for(queue, urgent).fire_due(now)
    assert jobs_in(queue, "prioritized") == [f"urgent@{now}"]
    queue.pause()
    beat_for(queue, every(60)).fire_due(now)
    assert jobs_in(queue, "paused") == [f"tick@{now}"]


def test_one_broken_schedule_does_not_stop_the_others(queue, caplog):
    now = 1_800_000_000_000 // 60_000 * 60_000
    queue.client.set(queue.keys.schedule("broken"), "not a hash")
    huge = Schedule("huge", "q", "job", "x" * 2000, every_ms=60_000)
    beat = beat_for(queue, every(60, name="broken"), huge, every(60, name="fine"), max_payload_bytes=1000)
    with caplog.at_level(logging.ERROR, "echomq.beat"):
        firings = beat.fire_due(now)
    assert [(f.schedule, f.outcome) for f in firings] == [("fine", "fired")]
    assert "broken" in caplog.text and "huge" in caplog.text
    assert beat.fire_due(now + 1) == []  # neither is retried in a loop until its next tick


def test_reload_picks_up_new_changed_and_removed_schedules(queue):
    current = [every(60, name="a")]
    beat = Beat(queue.client, lambda: current, prefix=queue.keys.prefix)
    beat.reload()
    now = 1_800_000_000_000 // 60_000 * 60_000
    assert [f.schedule for f in beat.fire_due(now)] == ["a"]
    current = [every(30, name="a"), every(60, name="b")]
    beat.reload()
    assert beat.next_wake_ms() == 0  # both are looked at now: one changed, one new
    assert sorted(f.schedule for f in beat.fire_due(now + 10)) == ["a", "b"]
    current = []
    beat.reload()
    assert beat.schedules == {} and beat.fire_due(now + HOUR) == []


def test_the_loop_fires_on_time_and_stops(queue):
    # Two-second ticks: a busy machine that stalls the loop for a tenth of that neither skips a tick nor makes
    # one late by half a period. The record of an earlier tick makes the first round fire (catching up) at once.
    period = 2000
    schedule = every(period / 1000)
    queue.client.hset(queue.keys.schedule("tick"), mapping={"tick": now_ms() // period * period - 10 * period,
                                                            "outcome": "fired"})
    beat = beat_for(queue, schedule)
    seen: list = []
    thread = threading.Thread(target=beat.run, args=(seen.append,))
    thread.start()
    try:
        assert wait_until(lambda: len([f for f in seen if f.outcome == "fired"]) >= 3, 30), seen
    finally:
        beat.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert [f.outcome for f in seen] == ["fired"] * len(seen), seen  # each tick decided once, by this beat
    ticks = [f.tick_ms for f in seen]
    assert [b - a for a, b in zip(ticks, ticks[1:])] == [period] * (len(ticks) - 1), ticks  # every tick in turn
    assert max(f.late_ms for f in seen[1:]) < period // 2, seen  # the first caught up; the others on time


def test_a_slow_reading_of_the_schedules_holds_no_tick_back(queue):
    # A locked SQLite makes a reading wait out its 5 s timeout: the ticks go on meanwhile. The third
    # reading here lasts until three more ticks have fired, which a loop that waited for it never lets
    # happen (it would fire nothing until the reading ends, then only the newest tick).
    schedule, readings, release = every(0.2), [], threading.Event()

    def load():
        readings.append(1)
        if len(readings) == 3:
            release.wait(60)
        return [schedule]

    def fired() -> list[int]:
        return [f.tick_ms for f in list(seen) if f.outcome == "fired"]

    beat = Beat(queue.client, load, prefix=queue.keys.prefix, scripts=queue.scripts, reload_interval_ms=200)
    beat.reload()
    seen: list = []
    thread = threading.Thread(target=beat.run, args=(seen.append,))
    thread.start()
    try:
        assert wait_until(lambda: len(readings) >= 3, 15), readings
        before = len(fired())  # fired before the reading began, or while it runs
        ticked_on = wait_until(lambda: len(fired()) >= before + 3, 15)
        release.set()
        assert ticked_on, f"{len(fired()) - before} tick(s) fired while a reading was held up"
        assert wait_until(lambda: len(readings) >= 4, 15)  # the readings go on after it
    finally:
        release.set()
        beat.stop()
        thread.join(10)
    assert not thread.is_alive()
    ticks = fired()
    assert ticks == sorted(set(ticks)), ticks  # each tick once, in order
    assert all(tick % 200 == 0 for tick in ticks), ticks


def test_a_primary_turned_replica_keeps_the_tick_due_until_a_write_lands():
    # During a failover the old primary answers READONLY: the tick is not lost, it is sent again.
    from echomq_django.core import Queue, connect
    from tests.redis_servers import redis_server

    with redis_server() as primary_url, redis_server() as other_url:
        client = connect(other_url, retry=None, retry_on_error=[])
        client.replicaof("127.0.0.1", primary_url.rsplit(":", 1)[1].split("/")[0])
        queue = Queue("q", client, prefix="p")
        beat = beat_for(queue, every(60))
        now = 1_800_000_000_000 // 60_000 * 60_000
        with pytest.raises(ReadOnlyError):
            beat.fire_due(now)
        client.replicaof("NO", "ONE")
        assert [f.outcome for f in beat.fire_due(now + 1)] == ["fired"]
        client.close()


def test_a_schedules_job_expires_from_its_firing(queue):
    """A schedule of a job with an expiry: each job it adds carries `exp`, its firing plus the expiry."""
    from echomq_django.core import JobOptions, now_ms, run_now

    schedule = every(60, opts=JobOptions(expires_ms=30_000))
    before = now_ms()
    firing = run_now(queue.scripts, schedule, "manual-1", prefix=queue.keys.prefix)
    after = now_ms()
    exp = int(queue.client.hget(queue.keys.job(firing.job_id), "exp"))
    assert before + 30_000 <= exp <= after + 30_000, (before, exp - 30_000, after)
    plain = run_now(queue.scripts, every(60, name="plain"), "manual-2", prefix=queue.keys.prefix)
    assert queue.client.hget(queue.keys.job(plain.job_id), "exp") is None
