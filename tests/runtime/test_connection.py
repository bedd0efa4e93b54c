"""Reading Redis URLs (each kind names its servers, a malformed one is refused), and how long a call may wait."""

import signal
import threading
import time

import pytest
import redis

from echomq_django.core import Queue
from echomq_django.core.errors import RedisURLError
from echomq_django.core.protocol.connection import connect, parse_redis_url
from tests.helpers import wait_until
from tests.redis_servers import RedisServer, free_port


@pytest.mark.parametrize("url, expected", [
    ("redis://127.0.0.1:6379/2", ("redis", [], {}, "")),
    ("rediss://cache:6380/0", ("rediss", [], {}, "")),
    ("unix:///run/redis.sock?db=1", ("unix", [], {}, "")),
    ("redis+cluster://10.0.0.1:7000,10.0.0.2:7001,10.0.0.3",
     ("redis+cluster", [("10.0.0.1", 7000), ("10.0.0.2", 7001), ("10.0.0.3", 6379)], {}, "")),
    ("redis+cluster://app:s%40cret@[::1]:7000/0?socket_timeout=3",
     ("redis+cluster", [("::1", 7000)], {"username": "app", "password": "s@cret", "socket_timeout": 3.0}, "")),
    ("redis+sentinel://s1:26379,s2/mymaster",
     ("redis+sentinel", [("s1", 26379), ("s2", 26379)], {"db": 0}, "mymaster")),
    ("redis+sentinel://:pw@s1:5000/jobs/4",
     ("redis+sentinel", [("s1", 5000)], {"password": "pw", "db": 4}, "jobs")),
])
def test_each_kind_of_url_names_its_nodes_and_options(url, expected):
    assert parse_redis_url(url) == expected


@pytest.mark.parametrize("url, message", [
    ("http://localhost", "must start with one of redis://"),
    ("localhost:6379", "must start with one of"),
    ("redis+cluster://", "empty host"),
    ("redis+cluster://a:7000,,b:7001", "empty host"),
    ("redis+cluster://a:70000", "'70000' is not a port number"),
    ("redis+cluster://a:7000/1", "a cluster has only database 0"),
    ("redis+sentinel://a:26379", "names no Sentinel service"),
    ("redis+sentinel://a:26379/svc/1/2", "only a database number may follow"),
    ("redis+sentinel://a:26379/svc/x", "'x' is not a database number"),
    ("redis://a:port", "Port could not be cast"),
    ("redis://a:6379/abc", "'abc' is not a database number"),
    ("redis://a:6379/0?bogus=1", "no connection option is called 'bogus'"),
    ("redis+cluster://a:7000?bogus=1", "no connection option is called 'bogus'"),
    (None, "must be a string, not NoneType"),
])
def test_a_malformed_url_is_refused_with_what_is_wrong(url, message):
    with pytest.raises(RedisURLError, match=message):
        parse_redis_url(url)
    with pytest.raises(ValueError):  # also one, for callers that catch that
        connect(url)


def test_a_password_never_appears_in_the_error():
    with pytest.raises(RedisURLError) as caught:
        parse_redis_url("redis+cluster://app:hunter2@a:x")
    assert "hunter2" not in str(caught.value) and "app:***@" in str(caught.value)


# An enqueue from a web request must fail fast when Redis does not answer
# (ENQUEUE_TIMEOUT), while workers and sweepers wait out outages.

def timed_enqueue() -> tuple[float, BaseException | None]:
    """Seconds one @job enqueue took, and what it raised."""
    from demo_project.demo_app.jobs import greet

    started = time.monotonic()
    try:
        greet.enqueue("Ada")
    except Exception as error:
        return time.monotonic() - started, error
    return time.monotonic() - started, None


def test_an_enqueue_raises_at_once_when_nobody_listens(settings, prefix):
    settings.ECHOMQ = {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "PREFIX": prefix,
                       "QUEUES": {"demo": {}}}
    took_s, error = timed_enqueue()
    assert isinstance(error, redis.ConnectionError)
    assert took_s < 3, f"took {took_s:.1f} s, more than ENQUEUE_TIMEOUT's default of 3 s"


@pytest.mark.slow
def test_an_enqueue_to_a_redis_that_does_not_answer_fails_within_enqueue_timeout_while_workers_wait(settings,
                                                                                                    prefix):
    from echomq_django.queues import get_queue

    server = RedisServer()
    server.start()
    settings.ECHOMQ = {"REDIS_URL": server.url, "PREFIX": prefix, "ENQUEUE_TIMEOUT": 1, "QUEUES": {"demo": {}}}
    long_running = get_queue("demo", long_running=True)  # the client of workers and sweepers
    long_running.counts()
    assert timed_enqueue()[1] is None  # the producer's connection is open when Redis stops answering
    answers: list[dict[str, int]] = []
    waiting = threading.Thread(target=lambda: answers.append(long_running.counts()), daemon=True)
    server.process.send_signal(signal.SIGSTOP)  # connections are accepted, nothing is answered
    try:
        stopped_at = time.monotonic()
        waiting.start()
        took_s, error = timed_enqueue()
        assert isinstance(error, (redis.ConnectionError, redis.TimeoutError)), error
        assert took_s < 2.5, f"took {took_s:.1f} s with ENQUEUE_TIMEOUT 1, in an outage of 3 s"
        time.sleep(max(0.0, stopped_at + 3 - time.monotonic()))  # the outage lasts 3 s, three enqueue timeouts
        assert answers == [], "nothing answered during the outage"
    finally:
        server.process.send_signal(signal.SIGCONT)
    try:
        waiting.join(10)
        # (The enqueue that timed out may have been added all the same: its call was sent.)
        assert answers and answers[0]["wait"] in (1, 2), "the long-running client waited the outage out"
        assert timed_enqueue()[1] is None, "the producer works again"
    finally:
        server.stop()
        server.workdir.cleanup()


def test_the_runtime_objects_are_built_once_per_settings_and_again_when_they_change(settings, redis_url, prefix):
    from echomq_django.queues import get_queue, make_sweeper

    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"q": {}}}
    first, second = get_queue("q"), get_queue("q")
    assert first.client is second.client and first.scripts is second.scripts, "no scripts registered per enqueue"
    long_running = get_queue("q", long_running=True)
    assert long_running.client is not first.client, "workers and sweepers have a client of their own"
    assert make_sweeper(["q"]).scripts is long_running.scripts
    settings.ECHOMQ = {**settings.ECHOMQ, "ENQUEUE_TIMEOUT": 1}
    assert get_queue("q").client is not first.client, "a change of settings builds them again"


def test_a_confirmation_that_times_out_is_not_confirmed_not_a_timeout(settings, prefix):
    from echomq_django.core import NotConfirmedError

    server = RedisServer()  # no replicas: WAIT waits all of CONFIRM_TIMEOUT and counts 0
    server.start()
    try:
        settings.ECHOMQ = {"REDIS_URL": server.url, "PREFIX": prefix, "QUEUES": {"demo": {}},
                           "CONFIRM_REPLICAS": 1, "CONFIRM_TIMEOUT": 1}  # longer than a try of ENQUEUE_TIMEOUT 3
        took_s, error = timed_enqueue()
        assert isinstance(error, NotConfirmedError) and error.job_ids, error
        assert 1 <= took_s < 3
    finally:
        server.stop()
        server.workdir.cleanup()


def test_an_add_made_by_a_signal_handler_in_the_middle_of_another_gets_its_own_reply(queue):
    # Each thread sends its calls on a connection of its own: a call made on the same thread while
    # another waits for its reply (a signal handler's) must not read that reply, nor leave its own.
    import signal

    inner: list[tuple[str, str]] = []
    busy = False

    def handler(signum, frame):
        nonlocal busy
        if busy:
            return
        busy = True
        try:
            wanted = f"inner-{len(inner)}"
            inner.append((wanted, queue.add("x", job_id=wanted)))
        finally:
            busy = False

    previous = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
    try:
        outer = []
        # At least 1 s, and on until the handler has added 21 jobs (a slow machine runs it less often).
        least, deadline = time.monotonic() + 1.0, time.monotonic() + 30
        while time.monotonic() < least or (len(inner) <= 20 and time.monotonic() < deadline):
            wanted = f"outer-{len(outer)}"
            outer.append((wanted, queue.add("x", job_id=wanted)))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert len(inner) > 20, "the handler ran often enough to land inside adds"
    assert [pair for pair in outer + inner if pair[0] != pair[1]] == []


def test_a_client_without_retries_adds_again_after_redis_closed_its_idle_connection():
    # Redis's `timeout` closes an idle client's connection; the next call must not fail on it (a
    # scheduler's client, which never sends a call twice, would have lost a tick's call).
    server = RedisServer("--timeout", "1")
    server.start()
    try:
        client = connect(server.url, retry=None, retry_on_error=[])
        queue = Queue("q", client, prefix="idle")
        queue.add("x")
        watcher = redis.Redis.from_url(server.url)
        assert wait_until(lambda: watcher.info("clients")["connected_clients"] == 1, 15), "Redis closed none"
        queue.add("x")
        assert queue.counts()["wait"] == 2
    finally:
        server.stop()
        server.workdir.cleanup()


def test_a_client_that_returns_bytes_is_refused_before_it_strands_a_job(redis_url, prefix):
    """With bytes for replies no id or token matches: a worker would take each job and leave it to the sweeper."""
    from echomq_django.core import Beat, Sweeper, Worker, WorkerOptions

    def makers(raw):
        return (lambda: Queue("q", raw, prefix=prefix), lambda: Worker("q", lambda job: None, raw,
                                                                       WorkerOptions(prefix=prefix)),
                lambda: Sweeper(raw, ["q"], prefix=prefix), lambda: Beat(raw, list, prefix=prefix))

    # Bytes; and text decoded strictly, which one byte of another client's that is not UTF-8 made a worker raise.
    for raw in (connect(redis_url, decode_responses=False), connect(redis_url, encoding_errors="strict")):
        try:
            for make in makers(raw):
                with pytest.raises(ValueError, match='decode_responses=True and encoding_errors="replace"'):
                    make()
            assert raw.keys(prefix + "*") == [], "nothing was written"
        finally:
            raw.close()
    Queue("q", connect(redis_url), prefix=prefix)
