"""Hostile tests of the schedules (issue 14): "each tick one job, never lost, never twice, never a burst".

Real Redis servers (our own where a test freezes or reconfigures one), real echomq_beat
processes where it matters, no mocks. A test here that fails shows a defect.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from echomq_django.core import Beat, Queue, Schedule, connect, read_records
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.schedules.records import fire_call
from echomq_django.queues import SCHEDULER_CALL_TIMEOUT_S, _scheduler_connection
from tests.fault_proxy import FaultProxy
from tests.helpers import wait_until
from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
HOUR = 3_600_000
DAY = 24 * HOUR
TICK_TASK = "tests.beat_app.jobs.tick"  # @job(queue="q"), an app of tests/beat_settings.py


def ms(text: str) -> int:
    return round(datetime.fromisoformat(text).timestamp() * 1000)


def every(seconds: float, name: str = "tick", **options) -> Schedule:
    return Schedule(name, "q", "job.tick", {"args": [], "kwargs": {}}, every_ms=round(seconds * 1000), **options)


def cron(expression: str, zone: str = "UTC", name: str = "nightly", **options) -> Schedule:
    return Schedule(name, "q", "job.nightly", None, cron=expression, timezone=zone, **options)


def beat_on(client, prefix: str, *schedules: Schedule, **options) -> Beat:
    beat = Beat(client, lambda: schedules, prefix=prefix, **options)
    beat.reload()
    return beat


class BeatThread:
    """A Beat running its loop in a thread, as echomq_beat does, collecting what it reports."""

    def __init__(self, beat: Beat) -> None:
        self.beat = beat
        self.firings: list = []
        self.thread = threading.Thread(target=beat.run, args=(self.firings.append,), daemon=True)

    def __enter__(self) -> "BeatThread":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.beat.stop()
        self.thread.join(10)
        assert not self.thread.is_alive(), "the beat did not stop"


def added(client, queue: Queue) -> list[tuple[str, int, int]]:
    """(job id, the `now` its call carried, when Redis added it) for every job added, in order.

    The job hash's `timestamp` is the `now` the scheduler put in its call; the
    events stream's entry id is Redis's own clock when the script ran. Their
    difference is how long the call was on its way.
    """
    out = []
    for entry_id, fields in client.xrange(queue.keys.events):
        if fields.get("event") == "added":
            job_id = fields["jobId"]
            sent = int(client.hget(queue.keys.job(job_id), "timestamp") or 0)
            out.append((job_id, sent, int(entry_id.split("-")[0])))
    return out


def tick_of(job_id: str) -> int:
    return int(job_id.rsplit("@", 1)[1])


@pytest.fixture
def own_redis():
    server = RedisServer()
    server.start()
    yield server
    server.stop()
    server.workdir.cleanup()


# -- a Redis frozen (SIGSTOP), not dead ---------------------------------------------------

def freeze_under_a_beat(own_redis, seconds: float, *, settled_after_ms: int) -> tuple[list, int, int]:
    """Freeze Redis for `seconds` under a Beat thread on an every-0.2-s schedule; (`added` jobs, down, up).

    Returns once a tick later than `settled_after_ms` after the thaw has its job.
    """
    client, scripts = _scheduler_connection(own_redis.url)
    observer = connect(own_redis.url)
    queue = Queue("q", observer, prefix="p")
    beat = Beat(client, lambda: [every(0.2)], prefix="p", scripts=scripts, reload_interval_ms=1000)
    try:
        with BeatThread(beat):
            assert wait_until(lambda: observer.llen(queue.keys.wait) >= 5, 10)
            os.kill(own_redis.process.pid, signal.SIGSTOP)
            down = now_ms()
            try:
                time.sleep(seconds)  # the freeze itself: what is measured, not a wait for a condition
            finally:
                os.kill(own_redis.process.pid, signal.SIGCONT)
            up = now_ms()
            assert wait_until(lambda: any(tick_of(i) > up + settled_after_ms
                                          for i in observer.lrange(queue.keys.wait, 0, -1)), 10)
        return added(observer, queue), down, up
    finally:
        observer.close()
        client.close()


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_frozen_redis_runs_no_call_the_beat_gave_up_on_and_fires_one_tick_for_the_outage(own_redis):
    """Calls built while Redis is frozen wait in its socket buffers; on SIGCONT they all run.

    The beat's client gives up on a call after SCHEDULER_CALL_TIMEOUT_S and sends a newer
    tick later, so an abandoned call must not add a job once Redis wakes, and the whole
    freeze must end as at most one job (the newest tick), as for a restart.
    """
    # The outage itself (the thing measured): long enough for several timed-out tries.
    jobs, down, up = freeze_under_a_beat(own_redis, 3 * SCHEDULER_CALL_TIMEOUT_S + 1, settled_after_ms=0)
    abandoned = [(job_id, ran - sent) for job_id, sent, ran in jobs if ran - sent > SCHEDULER_CALL_TIMEOUT_S * 1000]
    inside = [job_id for job_id, _sent, _ran in jobs if down < tick_of(job_id) <= up]
    assert abandoned == [] and len(inside) <= 1, (
        f"a freeze of {up - down} ms became {len(inside)} jobs {inside}; calls the beat had given up on "
        f"(id, ms in transit) ran after it: {abandoned}")



def test_a_freeze_shorter_than_the_call_timeout_ends_as_one_job_not_two(own_redis):
    """No call is abandoned here: the one in flight is answered late, then the beat sends the tick due by then.

    The beat set its next due time from the `now` of the call's start, so the
    ticks that passed while it waited are not coalesced into the one that
    just fired: two jobs, for ticks the freeze's length apart, at once.
    """
    jobs, down, up = freeze_under_a_beat(own_redis, SCHEDULER_CALL_TIMEOUT_S * 0.75, settled_after_ms=400)
    inside = [(tick_of(job_id) - down, ran - down) for job_id, _sent, ran in jobs if down < tick_of(job_id) <= up]
    assert len(inside) <= 1, (
        f"a {up - down} ms freeze became {len(inside)} jobs (tick, added; ms after it began): {inside}")


# -- time: daylight saving, clocks that jump ---------------------------------------------

FALL_BACK = [  # (zone, daily expression in the repeated hour or half hour, a time in the second pass before it)
    ("Europe/Berlin", "30 2 * * *", "2027-10-31T02:10+01:00"),
    ("America/New_York", "45 1 * * *", "2027-11-07T01:10-05:00"),
    ("Australia/Lord_Howe", "45 1 * * *", "2027-04-04T01:35+10:30"),  # a half-hour shift
    ("Pacific/Chatham", "0 3 * * *", "2027-04-04T02:50+12:45"),
]


@pytest.mark.parametrize(("zone", "expression", "at"), FALL_BACK)
def test_the_tick_after_an_instant_is_later_than_it_through_a_fall_back_hour(zone, expression, at):
    schedule = cron(expression, zone)
    after, before = schedule.tick_after(ms(at)), schedule.tick_at_or_before(ms(at))
    shown = [datetime.fromtimestamp(t / 1000, ZoneInfo(zone)).isoformat() for t in (after, before)]
    assert after > ms(at), f"tick_after({at}) is {shown[0]}, earlier than the instant asked about"
    assert before <= ms(at) < after


@pytest.mark.parametrize(("zone", "expression", "at"), FALL_BACK[:2])
def test_a_beat_started_in_the_repeated_hour_does_not_spin(queue, zone, expression, at):
    """A beat (re)started on the fall-back night, before the second pass of a daily time, must sleep.

    tick_after() answers the first pass's tick, already behind the clock, so the
    beat's next wake is in the past and its loop sends a call to Redis after
    call, as fast as it can, until the second pass (up to an hour).
    """
    schedule = cron(expression, zone)
    now = ms(at)
    yesterday = schedule.tick_at_or_before(now - 6 * HOUR)
    assert beat_on(queue.client, queue.keys.prefix, schedule).fire_due(yesterday + 500)[0].outcome == "fired"
    offset = now - now_ms()
    beat = beat_on(queue.client, queue.keys.prefix, schedule, clock=lambda: now_ms() + offset)
    with BeatThread(beat) as running:
        wait_until(lambda: len(running.firings) > 50, 1.0)  # a second of its loop, measured
    assert len(running.firings) <= 1, (
        f"{len(running.firings)} calls to Redis in a second for one daily schedule "
        f"(its next wake is {beat.next_wake_ms() - beat.clock()} ms from now)")


def test_one_scheduler_whose_clock_runs_ahead_does_not_stop_the_schedule_for_everyone(queue):
    """A tick an hour ahead of Redis's clock is refused ("early"), and decides nothing for the others.

    A beat follows Redis's clock (and measures it again when its own is
    stepped, below), so the call is made by hand, as a host whose clock was
    an hour ahead when it measured would make it.
    """
    schedule = every(60)
    ahead_tick = schedule.tick_at_or_before(now_ms() + HOUR)
    call = fire_call(queue.keys, schedule, now_ms() + HOUR, ahead_tick, deadline=now_ms() + HOUR + 2000)
    assert queue.scripts.run_batch([call]) == [["early", "", 0]]
    right = beat_on(queue.client, queue.keys.prefix, schedule)
    [firing] = right.fire_due()
    assert (firing.outcome, firing.decided) in (("fired", True), ("new", True))
    record = queue.client.hgetall(queue.keys.schedule("tick"))
    assert int(record["tick"]) == firing.tick_ms <= now_ms()


@pytest.mark.parametrize("step_ms", [HOUR, -HOUR, -30_000])
def test_a_beat_whose_host_clock_is_stepped_follows_redis_at_once(queue, step_ms):
    """An NTP step or a restored VM moves the host's clock: the beat measures Redis's clock again.

    Without that, a step back stalled the beat for the size of the step (no
    reading, so no new measure), and a step ahead had its calls refused.
    """
    schedule = every(1)
    step = [0]
    beat = beat_on(queue.client, queue.keys.prefix, schedule, clock=lambda: now_ms() + step[0])
    beat.measure_clock()
    step[0] = step_ms
    assert abs(beat.now() - now_ms()) < 1000
    with BeatThread(beat) as running:
        assert wait_until(lambda: sum(f.outcome == "fired" for f in running.firings) >= 2, 5), running.firings
    assert all(f.tick_ms <= now_ms() for f in running.firings)


@pytest.mark.parametrize(("seconds", "period_ms"), [(0.1, 100), (1 / 3, 333), (86_400 * 365 * 10, 315_360_000_000)])
def test_extreme_intervals_fire_each_tick_once(queue, seconds, period_ms):
    schedule = every(seconds)
    assert schedule.every_ms == period_ms
    beat = beat_on(queue.client, queue.keys.prefix, schedule)
    first = schedule.tick_after(now_ms())
    fired = []
    for n in range(4):
        for late in (0, period_ms // 4, period_ms // 2):  # several looks per tick: still one job each
            fired += [f.tick_ms for f in beat.fire_due(first + n * period_ms + late) if f.outcome == "fired"]
    assert fired == [first + n * period_ms for n in range(4)]


@pytest.mark.parametrize(("expression", "zone"), [
    ("0 0 29 2 *", "UTC"), ("0 12 L 2 *", "Asia/Kathmandu"), ("0 0 13 * 5", "Australia/Lord_Howe"),
    ("30 1 * * 0#5", "Pacific/Chatham"), ("0 0 LW * *", "America/St_Johns"),
])
def test_rare_cron_ticks_agree_forwards_and_backwards(expression, zone):
    """tick_at_or_before (what a beat fires) is the latest of the ticks tick_after walks through."""
    schedule = cron(expression, zone)
    start = ms("2027-01-01T00:00+00:00")
    ticks = schedule.next_ticks(start, 12)
    assert ticks == sorted(set(ticks))
    for earlier, later in zip(ticks, ticks[1:]):
        assert schedule.tick_at_or_before(later - 1) == earlier
        assert schedule.tick_at_or_before(later) == later


# -- corrupt data in Redis ------------------------------------------------------------

@pytest.mark.parametrize("garbage", ["1e999", "inf", "99999999999999999999"])
def test_a_record_whose_tick_is_absurd_does_not_silence_the_schedule_forever(queue, garbage):
    schedule = every(60)
    queue.client.hset(queue.keys.schedule("tick"), mapping={"tick": garbage, "outcome": "fired"})
    # By the real clock (a deadline, so the script reads Redis's clock): a record tick far ahead is no tick.
    outcomes = [(f.outcome, f.decided) for f in beat_on(queue.client, queue.keys.prefix, schedule).fire_due()]
    assert outcomes == [("fired", True)], f"tick {garbage!r} in the record: {outcomes}"


@pytest.mark.parametrize("garbage", ["abc", "-5", "", "0x10", "nan"])
def test_a_record_with_a_garbage_tick_fires_the_tick_on_time(queue, garbage):
    schedule = every(60)
    now = now_ms() // 60_000 * 60_000 + 1000
    queue.client.hset(queue.keys.schedule("tick"), mapping={"tick": garbage, "job": "schedule"})
    firings = beat_on(queue.client, queue.keys.prefix, schedule).fire_due(now)
    assert [(f.outcome, f.decided) for f in firings] == [("fired", True)]
    assert queue.get_job(f"tick@{now - 1000}") is not None


def test_a_garbage_counter_in_the_record_is_not_a_failed_tick_that_added_its_job_anyway(queue, caplog):
    """HINCRBY on a counter that is not a number fails after the job was added (a script is not undone).

    The beat logs "tick ... failed" for a tick that did fire, on every tick from then on.
    """
    schedule = every(60)
    now = now_ms() // 60_000 * 60_000 + 1000
    queue.client.hset(queue.keys.schedule("tick"), mapping={"tick": now - 61_000, "fired": "many"})
    firings = beat_on(queue.client, queue.keys.prefix, schedule).fire_due(now)
    job = queue.get_job(f"tick@{now - 1000}")
    assert (job is None) == (firings == []), (
        f"the beat reported {firings} and logged {caplog.text.strip()!r}, yet the tick's job "
        f"{'was' if job else 'was not'} added")


def test_a_key_of_another_type_under_the_ticks_job_id_is_not_reported_as_its_job(queue):
    """Something else holds the key the tick's job would have: the tick must not count as fired."""
    schedule = every(60)
    now = now_ms() // 60_000 * 60_000 + 1000
    queue.client.set(queue.keys.job(f"tick@{now - 1000}"), "not a job")
    firings = beat_on(queue.client, queue.keys.prefix, schedule).fire_due(now)
    assert [f.outcome for f in firings] != ["fired"], "the tick is recorded as fired, but no job will ever run"


def test_skip_if_running_with_a_record_pointing_at_keys_of_other_types(queue):
    schedule = every(60, skip_if_running=True)
    now = now_ms() // 60_000 * 60_000 + 1000
    for n, (kind, job) in enumerate([("string", "a"), ("list", "b"), ("zset", "c"), ("missing", "d")]):
        key = queue.keys.job(job)
        if kind == "string":
            queue.client.set(key, "x")
        elif kind == "list":
            queue.client.rpush(key, "x")
        elif kind == "zset":
            queue.client.zadd(key, {"x": 1})
        queue.client.hset(queue.keys.schedule("tick"), mapping={"tick": now - 1000 - (10 - n) * 60_000, "job": job})
        [firing] = beat_on(queue.client, queue.keys.prefix, schedule).fire_due(now + n * 60_000)
        assert firing.outcome == "fired", (kind, firing)


# -- bad input: every mistake a clear check error, never a crash ----------------------------

GREET = "demo_project.demo_app.jobs.greet"  # @job(queue="demo")
BAD_OPTIONS = {
    "EVERY a huge int": {"TASK": GREET, "EVERY": 2 ** 1024},
    "TIMEZONE a region, not a zone": {"TASK": GREET, "CRON": "0 3 * * *", "TIMEZONE": "Europe"},
    "TIMEZONE another region": {"TASK": GREET, "CRON": "0 3 * * *", "TIMEZONE": "America"},
    "TIMEZONE too long a name": {"TASK": GREET, "CRON": "0 3 * * *", "TIMEZONE": "Zone" * 100},
    "TASK a relative path": {"TASK": ".jobs.greet", "EVERY": 5},
    "TASK dots": {"TASK": "..greet", "EVERY": 5},
    "ARGS over MAX_PAYLOAD_BYTES (a @job)": {"TASK": GREET, "EVERY": 5, "ARGS": ["x" * 600_000]},
    "the task's module raises at import": {"TASK": "hostile_boom.job", "EVERY": 5},
}


@pytest.fixture
def boom_module(tmp_path, monkeypatch):
    """A module `hostile_boom` on the path whose import raises (a bug in the user's tasks module)."""
    (tmp_path / "hostile_boom.py").write_text("raise RuntimeError('a bug in the tasks module')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("hostile_boom", None)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("label", list(BAD_OPTIONS))
def test_a_bad_schedule_is_a_check_error_and_the_others_still_load(settings, redis_url, prefix, boom_module, label):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "demo": {}},
                       "SCHEDULES": {"bad": BAD_OPTIONS[label], "good": {"TASK": GREET, "EVERY": 60}}}
    from echomq_django.checks import check_schedules
    from echomq_django.schedules import load_schedules

    try:
        messages = check_schedules()
    except Exception as error:
        pytest.fail(f"{label}: manage.py check crashes with {type(error).__name__}: {error}")
    assert any(m.id.startswith("echomq.E") and "'bad'" in m.msg for m in messages), (label, messages)
    try:
        names = [schedule.name for schedule in load_schedules()]
    except Exception as error:
        pytest.fail(f"{label}: the scheduler cannot read its schedules: {type(error).__name__}: {error}")
    assert names == ["good"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("field", "value"), [("timezone", "Europe"), ("task", ".jobs.greet")])
def test_a_bad_row_is_a_form_error_and_does_not_stop_the_scheduler_reading_the_others(
        settings, redis_url, prefix, field, value):
    from django.core.exceptions import ValidationError

    from echomq_django.models import Schedule as ScheduleRow
    from echomq_django.schedules import load_schedules

    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "demo": {}}}
    row = ScheduleRow(name="bad", task=GREET, cron="0 3 * * *")
    setattr(row, field, value)
    try:
        with pytest.raises(ValidationError):
            row.full_clean()  # the admin's form: an error on the field, not a 500
    except ValidationError:
        raise
    except Exception as error:
        pytest.fail(f"the admin's form crashes on {field}={value!r}: {type(error).__name__}: {error}")
    row.save()  # written around the form (a shell, a data migration)
    ScheduleRow.objects.create(name="good", task=GREET, every=60)
    try:
        names = [schedule.name for schedule in load_schedules()]
    except Exception as error:
        pytest.fail(f"one bad row stops every schedule: {type(error).__name__}: {error}")
    assert names == ["good"]


def test_echomq_beat_with_a_bad_timezone_says_so_instead_of_a_traceback(subprocess_env):
    schedules = {"bad": {"TASK": TICK_TASK, "CRON": "0 3 * * *", "TIMEZONE": "Europe"},
                 "good": {"TASK": TICK_TASK, "EVERY": 60}}
    done = subprocess.run(
        [sys.executable, "manage.py", "echomq_beat", "--once"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.beat_settings",
             "ECHOMQ_TEST_SCHEDULES": json.dumps(schedules)})
    assert "Traceback" not in done.stderr, done.stderr[-1500:]
    # Either it refuses to start, naming the problem (the system checks), or it fires the good one.
    assert ("echomq.E017" in done.stderr and done.returncode == 1) or "1 schedule(s): good" in done.stdout, (
        done.stdout, done.stderr[-800:])


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf", "abc", "1e400", ""])
def test_echomq_beat_refuses_a_bad_interval_with_a_usage_error(subprocess_env, interval):
    done = subprocess.run(
        [sys.executable, "manage.py", "echomq_beat", "--interval", interval, "--once"], cwd=ROOT, capture_output=True,
        text=True, timeout=60, env={**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.beat_settings"})
    assert done.returncode == 2 and "--interval" in done.stderr and "Traceback" not in done.stderr, done.stderr


# -- many schedulers at once, real processes ---------------------------------------------

def start_beat(env: dict[str, str], schedules: dict, *args: str, redis_url: str | None = None) -> subprocess.Popen:
    extra = {"ECHOMQ_REDIS_URL": redis_url} if redis_url else {}
    return subprocess.Popen(
        [sys.executable, "-u", "manage.py", "echomq_beat", "--interval", "1", *args], cwd=ROOT,
        env={**env, **extra, "DJANGO_SETTINGS_MODULE": "tests.beat_settings",
             "ECHOMQ_TEST_SCHEDULES": json.dumps(schedules)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def stop_beats(beats: list[subprocess.Popen], timeout: float = 15) -> list[tuple[int | None, str]]:
    """SIGTERM (SIGCONT first, in case it is stopped) each beat still running; (exit code, output) of each."""
    results = []
    for beat in beats:
        if beat.poll() is None:
            os.kill(beat.pid, signal.SIGCONT)
            beat.send_signal(signal.SIGTERM)
    for beat in beats:
        try:
            out, err = beat.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            beat.kill()
            out, err = beat.communicate()
            err += "\n(killed: did not stop on SIGTERM)"
        results.append((beat.returncode, out + err))
    return results


def ticks_by_schedule(client, queue: Queue) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for job_id in client.lrange(queue.keys.wait, 0, -1):
        name, tick = job_id.rsplit("@", 1)
        out.setdefault(name, []).append(int(tick))
    return {name: sorted(ticks) for name, ticks in out.items()}


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_ten_beat_threads_and_three_beat_processes_fire_every_tick_once(subprocess_env, redis_client, prefix):
    # Periods of a second or more: a tick is lost only if all thirteen schedulers miss it for that long, which
    # a busy machine's stalls (a tenth of that) never make them do, while each tick is still raced by thirteen.
    periods = {f"s{n}": [1, 1.25, 4 / 3, 2, 2.5][n % 5] for n in range(40)}
    schedules = {name: {"TASK": TICK_TASK, "EVERY": period} for name, period in periods.items()}
    queue = Queue("q", redis_client, prefix=prefix)
    in_process = [every(period, name=name) for name, period in periods.items()]
    processes = [start_beat(subprocess_env, schedules) for _ in range(3)]
    threads = []
    try:
        assert wait_until(lambda: len(ticks_by_schedule(redis_client, queue)) == len(periods), 30), \
            [p.poll() for p in processes]
        client = connect(subprocess_env["ECHOMQ_REDIS_URL"], retry=None, retry_on_error=[], socket_timeout=2)
        for _ in range(10):
            threads.append(BeatThread(Beat(client, lambda: in_process, prefix=prefix, reload_interval_ms=500)))
            threads[-1].__enter__()
        start = now_ms() + 500
        assert wait_until(lambda: now_ms() > start + 8000, 12)  # eight seconds of ticks, measured
        end = now_ms() - 500
    finally:
        for thread in threads:
            thread.__exit__()
        results = stop_beats(processes)
    assert all(code == 0 for code, _ in results), results
    adds: dict[str, int] = {}
    for _id, fields in redis_client.xrange(queue.keys.events):
        if fields["event"] == "added":
            adds[fields["jobId"]] = adds.get(fields["jobId"], 0) + 1
    assert set(adds.values()) == {1}
    problems = {}
    for name, ticks in ticks_by_schedule(redis_client, queue).items():
        period = round(periods[name] * 1000)
        window = [t for t in ticks if start <= t <= end]
        expected = list(range(window[0], window[-1] + 1, period)) if window else []
        if window != expected or len(window) < (end - start) // period - 1:
            problems[name] = sorted(set(expected) - set(window))[:5]
    assert problems == {}, f"ticks missing (no outage, thirteen schedulers running): {problems}"


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_beat_stopped_for_many_periods_wakes_to_one_tick_not_a_burst(subprocess_env, redis_client, prefix):
    queue = Queue("q", redis_client, prefix=prefix)
    beat = start_beat(subprocess_env, {"tick": {"TASK": TICK_TASK, "EVERY": 0.25}})
    try:
        assert wait_until(lambda: redis_client.llen(queue.keys.wait) >= 4, 30), beat.poll()
        os.kill(beat.pid, signal.SIGSTOP)
        stopped = now_ms()
        time.sleep(2.5)  # the stop itself (ten periods): measured, not awaited
        os.kill(beat.pid, signal.SIGCONT)
        woke = now_ms()
        assert wait_until(lambda: len([t for t in ticks_by_schedule(redis_client, queue)["tick"] if t > woke]) >= 4, 10)
    finally:
        [(code, output)] = stop_beats([beat])
    assert code == 0, output
    jobs = added(redis_client, queue)
    ticks = sorted(tick_of(job_id) for job_id, _sent, _ran in jobs)
    inside = [t for t in ticks if stopped < t <= woke]
    assert len(inside) <= 1, f"a beat stopped {woke - stopped} ms woke to {len(inside)} jobs"
    # No burst, before, on or after waking: each job is the newest tick due when its call was made (its
    # `timestamp` is the `now` the beat fired it at), once, on the 250 ms grid. (A gap after waking is a
    # stall of this one process on a busy machine, not a burst: the ticks' order and grid are what hold.)
    assert len(set(ticks)) == len(ticks) and all(t % 250 == 0 for t in ticks), ticks
    stale = [(job_id, sent - tick_of(job_id)) for job_id, sent, _ran in jobs if not 0 <= sent - tick_of(job_id) < 250]
    assert stale == [], f"jobs fired for a tick older than the newest due (id, ms after its tick): {stale}"


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_beat_processes_over_a_frozen_redis_add_one_job_for_the_freeze(subprocess_env, own_redis):
    """The thread test above, with two real echomq_beat processes on a 0.5 s schedule."""
    observer = connect(own_redis.url)
    queue = Queue("q", observer, prefix=subprocess_env["ECHOMQ_PREFIX"])
    schedules = {"tick": {"TASK": TICK_TASK, "EVERY": 0.5}}
    beats = [start_beat(subprocess_env, schedules, redis_url=own_redis.url) for _ in range(2)]
    try:
        assert wait_until(lambda: observer.llen(queue.keys.wait) >= 3, 30), [b.poll() for b in beats]
        os.kill(own_redis.process.pid, signal.SIGSTOP)
        down = now_ms()
        try:
            time.sleep(6)  # the freeze itself: measured, not awaited
        finally:
            os.kill(own_redis.process.pid, signal.SIGCONT)
        up = now_ms()
        assert wait_until(lambda: any(t > up + 1000 for t in ticks_by_schedule(observer, queue)["tick"]), 15)
        jobs = added(observer, queue)
    finally:
        results = stop_beats(beats)
        observer.close()
    assert all(code == 0 for code, _ in results), results
    inside = [job_id for job_id, _sent, _ran in jobs if down < tick_of(job_id) <= up]
    stale = [(job_id, ran - sent) for job_id, sent, ran in jobs if ran - sent > SCHEDULER_CALL_TIMEOUT_S * 1000]
    assert len(inside) <= 1 and stale == [], (
        f"a {up - down} ms freeze became {len(inside)} jobs {inside}; abandoned calls that ran: {stale}")


# -- a network that delays and loses ----------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.slow
def test_calls_held_up_in_the_network_do_not_land_beside_the_newest_tick(redis_url, redis_client, prefix):
    """A link that stalls (the proxy forwards nothing for a while) delivers what it held once it flows again."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    queue = Queue("q", redis_client, prefix=prefix)
    with FaultProxy(port) as proxy:
        client, scripts = _scheduler_connection(proxy.url)
        beat = Beat(client, lambda: [every(0.2)], prefix=prefix, scripts=scripts, reload_interval_ms=1000)
        try:
            with BeatThread(beat):
                assert wait_until(lambda: redis_client.llen(queue.keys.wait) >= 5, 10)
                proxy.freeze()
                down = now_ms()
                try:
                    time.sleep(2 * SCHEDULER_CALL_TIMEOUT_S + 1)  # the stall itself: measured
                finally:
                    proxy.thaw()
                up = now_ms()
                assert wait_until(lambda: any(t > up for t in ticks_by_schedule(redis_client, queue)["tick"]), 10)
        finally:
            client.close()
    jobs = added(redis_client, queue)
    inside = [job_id for job_id, _sent, _ran in jobs if down < tick_of(job_id) <= up]
    stale = [(job_id, ran - sent) for job_id, sent, ran in jobs if ran - sent > SCHEDULER_CALL_TIMEOUT_S * 1000]
    assert len(inside) <= 1 and stale == [], (
        f"a {up - down} ms stall became {len(inside)} jobs {inside}; abandoned calls that ran: {stale}")


def test_lost_replies_never_add_a_tick_twice_nor_stop_the_beat(redis_url, redis_client, prefix):
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    queue = Queue("q", redis_client, prefix=prefix)
    with FaultProxy(port) as proxy:
        clients = [_scheduler_connection(proxy.url + f"?client_name=hostile{n}") for n in range(3)]
        beats = [BeatThread(Beat(client, lambda: [every(0.1, name="a"), every(0.3, name="b")], prefix=prefix,
                                 scripts=scripts, reload_interval_ms=300)) for client, scripts in clients]
        try:
            for beat in beats:
                beat.__enter__()
            proxy.drop_replies(0.3)
            assert wait_until(lambda: proxy.replies_dropped >= 20, 30), proxy.summary()
            proxy.drop_replies(0)
            healed = now_ms()
            assert wait_until(lambda: sum(t > healed + 500
                                          for t in ticks_by_schedule(redis_client, queue).get("a", [])) >= 5,
                              10), proxy.summary()
        finally:
            for beat in beats:
                beat.__exit__()
            for client, _ in clients:
                client.close()
    adds: dict[str, int] = {}
    for _id, fields in redis_client.xrange(queue.keys.events):
        if fields["event"] == "added":
            adds[fields["jobId"]] = adds.get(fields["jobId"], 0) + 1
    assert set(adds.values()) == {1}
    records = read_records(redis_client, [every(0.1, name="a"), every(0.3, name="b")], prefix=prefix)
    ticks = ticks_by_schedule(redis_client, queue)
    assert [r.counts["fired"] for r in records] == [len(ticks["a"]), len(ticks["b"])]


# -- signals and --once -------------------------------------------------------------------

def wait_for_output(beat: subprocess.Popen, text: str, timeout: float = 30) -> None:
    """Read the beat's stdout until a line holds `text` (it prints its schedules once started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = beat.stdout.readline()
        if text in line:
            return
        if not line and beat.poll() is not None:
            break
    pytest.fail(f"the beat never printed {text!r} (exit {beat.poll()}): {beat.stderr.read()[-1500:]}")


class Lines:
    """The lines a stream gives, read in a thread (so a test can wait for one with a deadline)."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        try:
            self.lines.extend(iter(stream.readline, ""))
        except (OSError, ValueError):  # closed under it once the process is reaped
            pass

    def __contains__(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))


@pytest.mark.timeout(180)
@pytest.mark.slow
@pytest.mark.parametrize("outage", ["frozen", "dead"])
@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT, signal.SIGINT]], ids=["one", "two"])
def test_a_beat_stops_promptly_during_a_redis_outage(subprocess_env, own_redis, outage, signals):
    """One signal: it ends the try in progress (at most the call timeout); two: it exits at once (the docs)."""
    beat = start_beat(subprocess_env, {"tick": {"TASK": TICK_TASK, "EVERY": 0.2}}, redis_url=own_redis.url)
    err = Lines(beat.stderr)
    try:
        wait_for_output(beat, "schedule(s): tick")
        if outage == "frozen":
            os.kill(own_redis.process.pid, signal.SIGSTOP)
        else:
            own_redis.stop()
        assert wait_until(lambda: "Redis unreachable" in err, 30), err.lines
        time.sleep(1.0)  # past the first pause between tries (0.2 s + a quarter of the outage): inside a try
        out = Lines(beat.stdout)
        started = time.monotonic()
        for number, signum in enumerate(signals):
            if number:  # POSIX merges a signal sent while the same one is pending: wait until it was taken
                assert wait_until(lambda: "scheduler: stopping" in out, 30), out.lines
            beat.send_signal(signum)
        try:
            beat.wait(60)
        except subprocess.TimeoutExpired:
            beat.kill()
            beat.wait()
        took = time.monotonic() - started
    finally:
        if outage == "frozen":
            os.kill(own_redis.process.pid, signal.SIGCONT)
        stop_beats([beat])
    # At most a call timeout and a second for one signal, a second for two: ten times that for a slow
    # machine, and still well short of the outage, which lasts until the beat is killed.
    limit = 10 * (SCHEDULER_CALL_TIMEOUT_S + 1) if len(signals) == 1 else 10.0
    # A second signal that lands after the first already ended the loop meets the handlers the
    # command restored on its way out (as every echomq command does): it dies of that signal.
    exits = (0,) if len(signals) == 1 else (0, -signals[-1])
    assert beat.returncode in exits and took < limit, (beat.returncode, round(took, 2), err.lines[-20:])


@pytest.mark.slow
def test_sigterm_twice_quickly_exits_zero_at_once(subprocess_env, redis_client, prefix):
    beat = start_beat(subprocess_env, {"tick": {"TASK": TICK_TASK, "EVERY": 0.1}})
    record = Queue("q", redis_client, prefix=prefix).keys.schedule("tick")
    assert wait_until(lambda: redis_client.exists(record), 30), beat.poll()  # its loop runs: handlers are set
    started = time.monotonic()
    beat.send_signal(signal.SIGTERM)
    beat.send_signal(signal.SIGTERM)
    out, err = beat.communicate(timeout=60)
    # When the second lands after the first already ended the loop, it meets the restored handler and
    # the process dies of it (as in test_a_beat_stops_promptly_during_a_redis_outage): as quick.
    assert beat.returncode in (0, -signal.SIGTERM) and time.monotonic() - started < 20, (beat.returncode, err[-1500:])


def test_once_with_redis_down_is_a_one_line_error(subprocess_env, own_redis):
    own_redis.stop()
    done = subprocess.run(
        [sys.executable, "manage.py", "echomq_beat", "--once"], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**subprocess_env, "ECHOMQ_REDIS_URL": own_redis.url, "DJANGO_SETTINGS_MODULE": "tests.beat_settings",
             "ECHOMQ_TEST_SCHEDULES": json.dumps({"tick": {"TASK": TICK_TASK, "EVERY": 60}})})
    assert done.returncode == 1 and "cannot reach Redis" in done.stderr and "Traceback" not in done.stderr, done.stderr


@pytest.mark.timeout(300)  # up to two minutes' wait for an hour to turn, then two beats
def test_once_twice_adds_one_job(subprocess_env, redis_client, prefix):
    queue = Queue("q", redis_client, prefix=prefix)
    env = {**subprocess_env, "DJANGO_SETTINGS_MODULE": "tests.beat_settings",
           "ECHOMQ_TEST_SCHEDULES": json.dumps({"tick": {"TASK": TICK_TASK, "EVERY": 3600}})}
    # Both runs in one hour: a second run after the hour turned fires the new hour's tick, as it should
    # (CI once ran the pair across 03:00). Within two minutes of the turn, wait for it.
    assert wait_until(lambda: HOUR - now_ms() % HOUR > 120_000, 130)
    tick = now_ms() // HOUR * HOUR
    redis_client.hset(queue.keys.schedule("tick"), "tick", tick - HOUR)  # it fired the hour before
    outputs = [subprocess.run([sys.executable, "manage.py", "echomq_beat", "--once"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60, env=env) for _ in range(2)]
    assert [o.returncode for o in outputs] == [0, 0], [o.stderr for o in outputs]
    assert redis_client.lrange(queue.keys.wait, 0, -1) == [f"tick@{tick}"]
    assert " fired job " in outputs[0].stdout and " fired job " not in outputs[1].stdout


# -- Redis refusing writes for a while (no replicas, out of memory) -----------------------------

@pytest.mark.parametrize(("option", "value", "back"), [
    ("min-replicas-to-write", "1", "0"),  # NOREPLICAS: the replica is away
    ("maxmemory", "1", "0"),  # OOM under noeviction
])
def test_a_tick_refused_for_a_while_is_caught_up_once_redis_takes_writes(own_redis, option, value, back, caplog):
    """An hourly tick refused by a Redis that briefly takes no writes must not be lost for the hour.

    A Redis that does not answer keeps the tick due (TRANSIENT); one that answers
    with an error the beat does not know passes the tick by: its next try is the
    next hour's tick, and this hour's job never runs, though the schedule catches up.
    """
    client, scripts = _scheduler_connection(own_redis.url)
    schedule = every(3600)
    tick = now_ms() // HOUR * HOUR
    try:
        client.hset(Queue("q", client, prefix="p").keys.schedule("tick"), "tick", tick - HOUR)
        beat = Beat(client, lambda: [schedule], prefix="p", scripts=scripts)
        beat.reload()
        client.config_set(option, value)
        try:
            refused = beat.fire_due(tick + 1000)
        except Exception as error:  # refused as an outage: fine, the tick stays due
            refused = [type(error).__name__]
        client.config_set(option, back)
        later = beat.fire_due(tick + 30_000)
    finally:
        client.config_set(option, back)
        client.close()
    assert [(f.outcome, f.tick_ms) for f in later] == [("fired", tick)], (
        f"refused: {refused}; once Redis took writes again: {later}; log: {caplog.text.strip()[-300:]}")
