"""Redis AUTH, TLS and an ACL user limited to the project's prefix; pickles stay inert."""

import pickle
import random
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis
from django.core.management import CommandError, call_command

from echomq_django.core import Backoff, JobOptions, NewJob, PayloadError, Queue, Sweeper, Worker, WorkerOptions, connect
from tests.helpers import fetch, kill_lock, wait_until
from tests.redis_servers import RedisServer, redis_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # up to 4 s each


def full_round(url: str, prefix: str = "sec") -> None:
    """Producer, worker and sweeper all work through `url`."""
    client = connect(url)
    queue = Queue("q", client, prefix=prefix)
    queue.add_bulk([NewJob("work", {"n": n}) for n in range(5)])
    options = WorkerOptions(prefix=prefix, block_timeout_s=0.2)
    assert Worker("q", lambda job: job.data["n"], client, options).run(burst=True) == 5
    stalled = queue.add("work")
    fetch(queue)
    kill_lock(queue, stalled)
    sweeper = Sweeper(client, ["q"], prefix=prefix)
    sweeper.sweep(sweeper.targets[0], force=True)
    assert sweeper.sweep(sweeper.targets[0], force=True).recovered == 1
    assert queue.counts()["completed"] == 5


def test_redis_auth(settings):
    with redis_server("--requirepass", "s3cret-pw") as url:
        with_password = url.replace("redis://", "redis://:s3cret-pw@")
        full_round(with_password)
        settings.ECHOMQ = {"REDIS_URL": url.replace("redis://", "redis://:wrong@")}
        with pytest.raises(CommandError, match="cannot reach Redis"):
            call_command("echomq_sweep", "--once")


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    # Extensions as strict X.509 checking (Python 3.13's default) wants them.
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", "/CN=echomq-test-ca", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-addext", "subjectKeyIdentifier=hash")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1")
    (folder / "san.cnf").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "san.cnf")
    return folder


def test_tls(certificates):
    server = RedisServer(tls=certificates)
    server.start()
    try:
        full_round(server.url)
        plain = connect(f"redis://127.0.0.1:{server.port}/0", retry=None, retry_on_error=[])
        with pytest.raises(redis.ConnectionError):
            plain.ping()
    finally:
        server.stop()
        server.workdir.cleanup()


def test_a_stop_ends_an_idle_workers_wait_over_tls_and_the_worker_leaves_cleanly(certificates):
    # The stop closes the wait's writing half; with TLS, the replies still coming must still be
    # decrypted (ssl.SSLSocket.shutdown would drop the TLS state: they came as garbage, and run() raised).
    server = RedisServer(tls=certificates)
    server.start()
    try:
        client = connect(server.url)
        queue = Queue("q", client, prefix="tls")
        runs = 60  # the stop lands at random while the reply is on its way (one run in ten failed so)
        for n in range(runs):
            worker = Worker("q", lambda job: None, client, WorkerOptions(prefix="tls", block_timeout_s=5))
            outcome: list[object] = []

            def run(worker: Worker = worker, outcome: list[object] = outcome) -> None:
                outcome.append(worker.run())

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            assert wait_until(lambda: int(client.info("clients")["blocked_clients"]) == 1, 5)
            queue.add("x", "x" * 200_000)  # its fetch's reply is many TLS records
            time.sleep(random.random() / 1000)  # the fault: where in the reply the stop lands
            worker.stop()
            thread.join(10)
            assert outcome and not thread.is_alive(), f"run {n}: the worker did not return"
        counts = queue.counts()
        assert counts["wait"] + counts["completed"] == runs, counts
    finally:
        server.stop()
        server.workdir.cleanup()


def test_an_acl_user_limited_to_the_prefix_is_enough():
    with redis_server() as url:
        admin = redis.Redis.from_url(url)
        admin.execute_command(
            "ACL", "SETUSER", "echomq", "on", ">app-pw", "resetkeys", "~sec:*", "resetchannels",
            "-@all", "+@read", "+@write", "+@scripting", "+@connection", "+@keyspace", "+@blocking",
            "-@dangerous", "+time", "+client|unblock")
        url_as_user = url.replace("redis://", "redis://echomq:app-pw@")
        full_round(url_as_user, prefix="sec")
        outsider = Queue("q", connect(url_as_user, retry=None, retry_on_error=[]), prefix="other")
        with pytest.raises(redis.exceptions.NoPermissionError):
            outsider.add("work")


def test_a_pickle_written_into_redis_is_never_unpickled(queue):
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled!')",))

    job_id = queue.add("work", {"ok": True})
    queue.client.hset(queue.keys.job(job_id), "data", pickle.dumps(Boom()))
    job = queue.get_job(job_id)
    assert isinstance(job.data, str), "shown as text, not decoded"
    seen = []
    Worker("q", lambda j: seen.append(type(j.data)) or "ran", queue.client, WorkerOptions(prefix=queue.keys.prefix,
                                                                                          block_timeout_s=0.2)).run(burst=True)
    assert seen == [], "a job whose data is not JSON never reaches a handler"
    assert queue.get_state(job_id) == "failed"
    assert "the job's data is not JSON" in queue.get_job(job_id).failed_reason


@pytest.mark.django_db
def test_a_pickle_in_a_job_for_echomq_worker_fails_with_a_reason(echomq_settings, queue):
    job_id = queue.add("demo_project.demo_app.jobs.greet", {"args": ["x"], "kwargs": {}})
    queue.client.hset(queue.keys.job(job_id), "data", pickle.dumps({"args": ["x"]}, protocol=4))
    call_command("echomq_worker", "--queue", "q", "--burst", "-v", "0")
    assert queue.get_state(job_id) == "failed"
    assert "the job's data is not JSON" in queue.get_job(job_id).failed_reason


def nested(levels: int) -> list:
    root = inner = []
    for _ in range(levels - 1):
        inner.append([])
        inner = inner[0]
    return root


@pytest.mark.parametrize("data, reason", [
    (nested(100_000), "nested more than 100 levels"),
    (nested(101), "nested more than 100 levels"),
    ({"text": "lone \ud800 surrogate"}, "not valid Unicode"),
])
def test_enqueue_refuses_what_the_rest_of_the_system_cannot_store(queue, data, reason):
    with pytest.raises(PayloadError, match=reason):
        queue.add("work", data)
    with pytest.raises(PayloadError, match=reason):
        queue.add_bulk([NewJob("work", {"ok": 1}), NewJob("work", data)])
    assert queue.counts()["wait"] == 0, "nothing of the batch was added"
    queue.add("work", nested(100))  # the limit itself is fine


@pytest.mark.parametrize("make", [
    lambda: JobOptions(attempts=float("inf")), lambda: JobOptions(attempts=0),
    lambda: JobOptions(attempts=1_000_001), lambda: JobOptions(attempts=2.5),
    lambda: JobOptions(delay_ms=10**30), lambda: JobOptions(priority=101),
    lambda: Backoff("fixed", 10**30), lambda: JobOptions.from_json({"attempts": 1e999}),
])
def test_job_options_out_of_bounds_are_refused(make):
    with pytest.raises(PayloadError, match="must be a whole number from"):
        make()


def test_options_hold_whole_numbers_however_they_were_given():
    options = JobOptions(attempts=3.0, delay_ms=5.0, priority=-2.0, backoff=Backoff("fixed", 10.0))
    assert options == JobOptions.from_json({"attempts": 3, "delay": 5, "priority": -2, "backoff": 10})
    assert options.encoded() == '{"attempts":3,"backoff":{"type":"fixed","delay":10},"delay":5,"priority":-2}'
