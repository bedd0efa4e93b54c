"""echomq_beat as real processes: several at once add one job per tick, through kill -9 and a Redis restart."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from echomq_django.core import Queue, connect
from echomq_django.core.producing.queue import now_ms
from tests.helpers import wait_until
from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
EVERY_SECOND = {"tick": {"TASK": "tests.beat_app.jobs.tick", "EVERY": 1}}
# Where every tick must be fired (by one beat, or by each of several): a tick is lost only when a beat misses it
# for two seconds, which a busy machine's stalls (a tenth of that) never make it do.
EVERY_TWO_SECONDS = {"tick": {"TASK": "tests.beat_app.jobs.tick", "EVERY": 2}}
PERIOD_MS = 2000
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # up to 15 s each


def start_beat(env: dict[str, str], *args: str, schedules: dict = EVERY_SECOND, out: Path | None = None
               ) -> subprocess.Popen:
    """An echomq_beat process; with `out`, its output (stdout and stderr) goes to that file, to be read meanwhile."""
    with contextlib.nullcontext(subprocess.PIPE) if out is None else out.open("w") as stdout:
        return subprocess.Popen(
            [sys.executable, "-u", "manage.py", "echomq_beat", "--interval", "1", *args], cwd=ROOT,
            env={**env, "DJANGO_SETTINGS_MODULE": "tests.beat_settings",
                 "ECHOMQ_TEST_SCHEDULES": json.dumps(schedules)},
            stdout=stdout, stderr=subprocess.PIPE if out is None else subprocess.STDOUT, text=True,
            start_new_session=True)


def stop(beats: list[subprocess.Popen]) -> list[str]:
    """SIGTERM each beat still running, all at once; their outputs (a beat must exit 0 on SIGTERM)."""
    for beat in beats:
        if beat.poll() is None:
            beat.send_signal(signal.SIGTERM)
    outputs = []
    for beat in beats:
        out, err = beat.communicate(timeout=15)
        assert beat.returncode in (0, -signal.SIGKILL), err
        outputs.append((out or "") + (err or ""))
    return outputs


def ticks_of(queue: Queue) -> list[int]:
    """The tick of every job the schedulers added, from the job ids ("tick@<ms>"), in order."""
    ids = queue.client.lrange(queue.keys.wait, 0, -1)
    return sorted(int(job_id.split("@")[1]) for job_id in ids)


def adds_per_job(queue: Queue) -> dict[str, int]:
    """How many times each job was added, from the events stream (an add twice would show twice)."""
    counts: dict[str, int] = {}
    for _id, fields in queue.client.xrange(queue.keys.events):
        if fields["event"] == "added":
            counts[fields["jobId"]] = counts.get(fields["jobId"], 0) + 1
    return counts


def sent_by(out: Path) -> list[int]:
    """The ticks a beat at -v 2 sent and was answered for: fired by it, decided by another beat before (fired),
    or sent late, once the next tick was decided (superseded)."""
    found = re.findall(r" tick (\S+) (?:fired job |was decided before \((?:fired|superseded)\))", out.read_text())
    return [round(datetime.fromisoformat(tick).timestamp() * 1000) for tick in found]


def in_turn(ticks: list[int]) -> bool:
    """Whether `ticks` are each tick in turn: one period apart, none missing, none twice."""
    return [b - a for a, b in zip(ticks, ticks[1:])] == [PERIOD_MS] * (len(ticks) - 1)


def test_three_beats_and_a_kill_9_add_exactly_one_job_per_tick(subprocess_env, redis_client, prefix, tmp_path):
    queue = Queue("q", redis_client, prefix=prefix)
    outs = [tmp_path / f"beat{n}.out" for n in range(3)]
    # -v 2: also the ticks others decided
    beats = [start_beat(subprocess_env, "-v", "2", schedules=EVERY_TWO_SECONDS, out=out) for out in outs]
    try:
        # All three race for a couple of ticks; then one dies mid-run: the others go on, nothing doubles.
        assert wait_until(lambda: all(len(sent_by(out)) >= 2 for out in outs), 60), [beat.poll() for beat in beats]
        os.kill(beats[0].pid, signal.SIGKILL)
        killed_at = now_ms()
        assert wait_until(lambda: len([t for t in ticks_of(queue) if t > killed_at]) >= 4, 30)
        after_kill = [t for t in ticks_of(queue) if t > killed_at]
    finally:
        stop(beats)
    ticks = ticks_of(queue)
    assert len(ticks) >= 6 and len(set(ticks)) == len(ticks) and in_turn(ticks), ticks  # every tick, none missing
    assert set(adds_per_job(queue).values()) == {1}
    record = redis_client.hgetall(queue.keys.schedule("tick"))
    assert int(record["fired"]) == len(ticks)
    # Each tick was decided by one of the three; the two that lived on sent every tick after the kill (which
    # of them decides it first is a race: one may win them all). The newest is left out: a beat a little
    # behind the other may have had the SIGTERM before its call for it.
    outputs = [out.read_text() for out in outs]
    assert sum(output.count(" fired job ") for output in outputs) == len(ticks)
    for out in outs[1:]:
        missing = sorted(set(after_kill[:-1]) - set(sent_by(out)))
        assert missing == [], f"{out.name} did not send ticks {missing} after the kill:\n{out.read_text()[-3000:]}"


def test_a_redis_restart_loses_only_the_ticks_inside_it_coalesced_into_one(tmp_path):
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    server.start()
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "ECHOMQ_REDIS_URL": server.url,
           "ECHOMQ_PREFIX": "beat"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True,
                   timeout=120)
    client = connect(server.url, retry=None, retry_on_error=[])
    queue = Queue("q", client, prefix="beat")
    beats = [start_beat(env, schedules=EVERY_TWO_SECONDS) for _ in range(2)]
    try:
        assert wait_until(lambda: len(ticks_of(queue)) >= 2, 30)
        before = ticks_of(queue)  # all added before the outage
        server.stop()  # kill -9: the beats lose Redis mid-run
        down_at = now_ms()
        time.sleep(4)  # the outage itself (two ticks or more): the time to be measured, not a wait for a condition
        server.start()
        up_at = now_ms()
        assert wait_until(lambda: len([t for t in ticks_of(queue) if t > up_at]) >= 2, 30)
        assert all(beat.poll() is None for beat in beats)  # both rode it out
        outputs = stop(beats)
        ticks, adds = ticks_of(queue), adds_per_job(queue)
    finally:
        stop(beats)
        client.close()
        server.stop()
        server.workdir.cleanup()
    assert len(set(ticks)) == len(ticks) and set(adds.values()) == {1}
    inside = [t for t in ticks if down_at < t <= up_at]
    after = [t for t in ticks if t > up_at]
    # Up to the outage every tick, all still there after it; of the ticks inside it at most one (the newest,
    # fired on return); after it every tick again.
    assert in_turn(before) and set(before) <= set(ticks), (before, ticks)
    assert len(inside) <= 1, (down_at, up_at, inside)
    assert in_turn(after), after
    assert any("Redis unreachable" in output for output in outputs), outputs


def test_sigterm_stops_a_beat_at_once(subprocess_env, redis_client, prefix):
    queue = Queue("q", redis_client, prefix=prefix)
    beat = start_beat(subprocess_env)
    assert wait_until(lambda: len(ticks_of(queue)) >= 1, 30)
    beat.send_signal(signal.SIGTERM)
    started = time.monotonic()
    out, err = beat.communicate(timeout=60)
    assert beat.returncode == 0 and time.monotonic() - started < 20, err
    assert "1 schedule(s): tick (every 1 s -> q)" in out
