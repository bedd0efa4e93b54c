"""echomq_beat as real processes: several at once add one job per tick, through kill -9 and a Redis restart."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from echomq_django.core import Queue, connect
from tests.helpers import wait_until
from tests.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]
EVERY_SECOND = {"tick": {"TASK": "tests.beat_app.jobs.tick", "EVERY": 1}}
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]  # up to 13 s each


def start_beat(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-u", "manage.py", "echomq_beat", "--interval", "1", *args], cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "tests.beat_settings", "ECHOMQ_TEST_SCHEDULES": json.dumps(EVERY_SECOND)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def stop(beats: list[subprocess.Popen]) -> list[str]:
    """SIGTERM each beat still running; their outputs (a beat must exit 0 on SIGTERM)."""
    outputs = []
    for beat in beats:
        if beat.poll() is None:
            beat.send_signal(signal.SIGTERM)
        out, err = beat.communicate(timeout=15)
        assert beat.returncode in (0, -signal.SIGKILL), err
        outputs.append(out + err)
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


def test_three_beats_and_a_kill_9_add_exactly_one_job_per_tick(subprocess_env, redis_client, prefix):
    queue = Queue("q", redis_client, prefix=prefix)
    beats = [start_beat(subprocess_env, "-v", "2") for _ in range(3)]  # -v 2: also the ticks others decided
    try:
        assert wait_until(lambda: len(ticks_of(queue)) >= 4, 30), [beat.poll() for beat in beats]
        os.kill(beats[0].pid, signal.SIGKILL)  # one dies mid-run: the others go on, nothing doubles
        started = len(ticks_of(queue))
        assert wait_until(lambda: len(ticks_of(queue)) >= started + 8, 30)
    finally:
        outputs = stop(beats)
    ticks = ticks_of(queue)
    assert len(ticks) >= 12 and len(set(ticks)) == len(ticks)
    assert [b - a for a, b in zip(ticks, ticks[1:])] == [1000] * (len(ticks) - 1)  # every tick, none missing
    assert set(adds_per_job(queue).values()) == {1}
    record = redis_client.hgetall(queue.keys.schedule("tick"))
    assert int(record["fired"]) == len(ticks)
    # Each tick was decided by one of the three; the two that lived on sent every tick after the kill
    # (which of them decides it first is a race: one may win them all).
    assert sum(output.count(" fired job ") for output in outputs) == len(ticks)
    for output in outputs[1:]:
        sent = output.count(" fired job ") + output.count(" was decided before (fired)")
        assert sent >= 8, output


def test_a_redis_restart_loses_only_the_ticks_inside_it_coalesced_into_one(tmp_path):
    server = RedisServer("--appendonly", "yes", "--appendfsync", "always")
    server.start()
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "ECHOMQ_REDIS_URL": server.url,
           "ECHOMQ_PREFIX": "beat"}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True,
                   timeout=120)
    client = connect(server.url, retry=None, retry_on_error=[])
    queue = Queue("q", client, prefix="beat")
    beats = [start_beat(env) for _ in range(2)]
    try:
        assert wait_until(lambda: len(ticks_of(queue)) >= 3, 30)
        server.stop()  # kill -9: the beats lose Redis mid-run
        down_at = time.time() * 1000
        time.sleep(3.5)  # the outage itself: the time to be measured, not a wait for a condition
        server.start()
        up_at = time.time() * 1000
        assert wait_until(lambda: len([t for t in ticks_of(queue) if t > up_at]) >= 3, 30)
        assert all(beat.poll() is None for beat in beats)  # both rode it out
        outputs = stop(beats)
        ticks, adds = ticks_of(queue), adds_per_job(queue)
    finally:
        stop(beats)
        client.close()
        server.stop()
        server.workdir.cleanup()
    assert len(set(ticks)) == len(ticks) and set(adds.values()) == {1}
    before = [t for t in ticks if t < down_at - 1000]
    inside = [t for t in ticks if down_at < t <= up_at]
    after = [t for t in ticks if t > up_at]
    # Up to the outage every tick; of the ticks inside it at most one (the newest, fired on return);
    # after it every tick again.
    assert [b - a for a, b in zip(before, before[1:])] == [1000] * (len(before) - 1)
    assert len(inside) <= 1, (down_at, up_at, inside)
    assert [b - a for a, b in zip(after, after[1:])] == [1000] * (len(after) - 1)
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
