"""`/echomq/metrics/`: the Prometheus exposition of every configured queue, and who may read it."""

import re
import time
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from echomq_django.core import COUNTED, JobOptions, Queue, Worker, WorkerOptions
from echomq_django.queues import make_sweeper
from tests.helpers import fetch, kill_lock
from tests.redis_servers import free_port

pytestmark = pytest.mark.django_db

TOKEN = "scrape-token-0123456789-abcdefghij"
URL = "/echomq/metrics/"
FAMILIES = {  # name as parsed (counters without _total) -> (type, name in the text)
    "echomq_jobs_completed": ("counter", "echomq_jobs_completed_total"),
    "echomq_jobs_failed": ("counter", "echomq_jobs_failed_total"),
    "echomq_jobs_recovered": ("counter", "echomq_jobs_recovered_total"),
    "echomq_queue_jobs": ("gauge", "echomq_queue_jobs"),
    "echomq_oldest_waiting_seconds": ("gauge", "echomq_oldest_waiting_seconds"),
    "echomq_last_sweep_age_seconds": ("gauge", "echomq_last_sweep_age_seconds"),
    "echomq_workers": ("gauge", "echomq_workers"),
    "echomq_worker_busy_slots": ("gauge", "echomq_worker_busy_slots"),
    "echomq_outbox_rows": ("gauge", "echomq_outbox_rows"),
    "echomq_outbox_oldest_seconds": ("gauge", "echomq_outbox_oldest_seconds"),
}


def run_known_jobs(queue: Queue) -> str:
    """5 jobs completed, 2 failed for good, then 1 taken, abandoned and recovered to wait by two sweeps; its id."""
    for n in range(5):
        queue.add("ok", {"n": n})
    for _ in range(2):
        queue.add("doomed", opts=JobOptions(attempts=1))

    def handler(job):
        if job.name == "doomed":
            raise RuntimeError("doomed")
        return job.data

    worker = Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.2),
                    scripts=queue.scripts)
    assert worker.run(burst=True) == 7
    queue.add("abandoned")
    [(job_id, _)] = fetch(queue)
    kill_lock(queue, job_id)
    sweeper = make_sweeper([queue.name])
    assert sweeper.sweep(sweeper.targets[0], force=True).marked == 1
    assert sweeper.sweep(sweeper.targets[0], force=True).recovered == 1
    return job_id


@pytest.fixture
def metrics_settings(echomq_settings):
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "METRICS_TOKEN": TOKEN, "OUTBOX": True}
    return echomq_settings


def scrape(client: Client | None = None, token: str | None = TOKEN) -> str:
    """The exposition as a scraper with `token` (or `client`'s session) gets it; fails on any status but 200."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = (client or Client()).get(URL, headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return response.content.decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample: (sample name, sorted labels) -> value."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def test_the_exposition_holds_the_numbers_of_a_known_run(metrics_settings, queue):
    recovered_id = run_known_jobs(queue)
    text = scrape()
    assert value(text, "echomq_jobs_completed_total", queue="q") == 5.0
    assert value(text, "echomq_jobs_failed_total", queue="q") == 2.0
    assert value(text, "echomq_jobs_recovered_total", queue="q") == 1.0
    expected = {**dict.fromkeys(COUNTED, 0), "completed": 5, "failed": 2, "wait": 1}
    assert {state: value(text, "echomq_queue_jobs", queue="q", state=state) for state in COUNTED} == expected
    job = queue.get_job(recovered_id)
    waited_s = time.time() - job.timestamp / 1000
    assert 0 < value(text, "echomq_oldest_waiting_seconds", queue="q") <= waited_s
    assert 0 <= value(text, "echomq_last_sweep_age_seconds", queue="q") < 10
    assert scrape().count("echomq_jobs_completed_total{") == 1, "a second scrape: no duplicate registration"


def test_names_types_and_help_and_nothing_else(metrics_settings, queue):
    text = scrape()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert set(families) == set(FAMILIES), "no process or platform metrics of a global registry"
    for name, (kind, exposed) in FAMILIES.items():
        assert families[name].type == kind
        assert f"# TYPE {exposed} {kind}\n" in text
        assert re.search(rf"^# HELP {exposed} \S", text, re.MULTILINE)
    assert "0 when none waits" in families["echomq_oldest_waiting_seconds"].documentation
    assert "never swept" in families["echomq_last_sweep_age_seconds"].documentation


def test_an_idle_queue_never_swept_waits_zero_seconds_and_has_no_sweep_age(metrics_settings, queue):
    text = scrape()
    assert value(text, "echomq_oldest_waiting_seconds", queue="q") == 0.0
    assert value(text, "echomq_jobs_completed_total", queue="q") == 0.0
    assert not any(name == "echomq_last_sweep_age_seconds" for name, _ in samples(text))
    assert all(value(text, "echomq_queue_jobs", queue="q", state=state) == 0 for state in COUNTED)


def test_every_configured_queue_is_on_the_page(metrics_settings, queue, redis_client, prefix):
    metrics_settings.ECHOMQ = {**metrics_settings.ECHOMQ, "QUEUES": {"q": {}, "other": {}}}
    Queue("other", redis_client, prefix=prefix).add("work")
    text = scrape()
    assert value(text, "echomq_queue_jobs", queue="other", state="wait") == 1
    assert value(text, "echomq_queue_jobs", queue="q", state="wait") == 0


@pytest.mark.parametrize("broken_key", ["metrics_total", "wait", "meta"])
def test_a_queue_with_a_broken_key_is_left_out_and_the_others_served(metrics_settings, queue, redis_client, prefix,
                                                                     broken_key):
    metrics_settings.ECHOMQ = {**metrics_settings.ECHOMQ, "QUEUES": {"broken": {}, "q": {}}}
    broken = Queue("broken", redis_client, prefix=prefix)
    redis_client.set(getattr(broken.keys, broken_key), "x")
    queue.add("work")
    text = scrape()
    assert value(text, "echomq_queue_jobs", queue="q", state="wait") == 1
    assert not [key for key in samples(text) if ("queue", "broken") in key[1]]


def test_the_admin_pages_table_lists_what_is_exposed(metrics_settings, queue):
    run_known_jobs(queue)  # so that every family has samples, the sweep age too
    exposed = {}
    for family in text_string_to_metric_families(scrape()):
        for sample in family.samples:
            exposed[sample.name] = (family.type, sorted(sample.labels))
    page = (Path(__file__).resolve().parents[2] / "docs" / "admin.md").read_text()
    section = page.split("\n## Prometheus\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(echomq_\w+)` \| (\w+) \| ([^|]+) \| ([^|]+) \|$", section, re.MULTILINE)
    documented = {name: (kind, sorted(re.findall(r"`(\w+)`", labels))) for name, kind, labels, _ in rows}
    assert documented == exposed
    [states] = [meaning for name, _, _, meaning in rows if name == "echomq_queue_jobs"]
    assert tuple(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", states))) == COUNTED


# -- who may read it ----------------------------------------------------------

def user(username: str, *, staff: bool = True, active: bool = True, superuser: bool = False,
         permitted: bool = False) -> User:
    person = User.objects.create_user(username, password="pw", is_staff=staff, is_active=active,
                                      is_superuser=superuser)
    if permitted:
        person.user_permissions.add(Permission.objects.get(content_type__app_label="echomq",
                                                           codename="view_metrics"))
    return person


USERS = {
    "staff with the permission": {"permitted": True},
    "superuser": {"superuser": True},
    "staff without the permission": {},
    "not staff, with the permission": {"staff": False, "permitted": True},
    "inactive staff with the permission": {"active": False, "permitted": True},
}


@pytest.mark.parametrize(("who", "authorization", "status"), [
    ("anonymous", None, 401),
    ("anonymous", f"Bearer {TOKEN}", 200),
    ("anonymous", f"bearer {TOKEN}", 200),  # the scheme is case-insensitive
    ("anonymous", f"Bearer {TOKEN}x", 401),
    ("anonymous", f"Bearer {TOKEN[:-1]}", 401),
    ("anonymous", "Bearer", 401),
    ("anonymous", "Basic dXNlcjpwdw==", 401),
    ("staff with the permission", None, 200),
    ("staff with the permission", "Bearer wrong", 401),  # a bearer header is judged by its token alone
    ("staff with the permission", "Basic dXNlcjpwdw==", 200),  # a proxy's login is not ours to judge
    ("superuser", None, 200),
    ("staff without the permission", None, 403),
    ("staff without the permission", f"Bearer {TOKEN}", 200),
    ("not staff, with the permission", None, 403),
    ("inactive staff with the permission", None, 401),  # no longer logged in
])
def test_access(metrics_settings, queue, who, authorization, status):
    queue.add("work")
    client = Client()
    if who != "anonymous":
        client.force_login(user("person", **USERS[who]))
    response = client.get(URL, headers={"Authorization": authorization} if authorization else {})
    assert response.status_code == status
    body = response.content.decode()
    assert "no-store" in response["Cache-Control"]
    assert {"authorization", "cookie"} <= {part.strip().lower() for part in response["Vary"].split(",")}
    if status == 200:
        assert value(body, "echomq_queue_jobs", queue="q", state="wait") == 1
        return
    assert not re.search(r"\d", body) and "echomq_" not in body, body
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    if status == 401:
        assert response["WWW-Authenticate"] == "Bearer"
    else:
        assert not response.has_header("WWW-Authenticate")


def test_no_token_configured_lets_no_bearer_in(echomq_settings, queue):
    for token in ("", "None", "null", TOKEN):
        response = Client().get(URL, headers={"Authorization": f"Bearer {token}"})
        assert response.status_code == 401 and response["WWW-Authenticate"] == "Bearer"


def test_only_get_and_head(metrics_settings, queue):
    scraper = Client(headers={"Authorization": f"Bearer {TOKEN}"})
    assert scraper.head(URL).status_code == 200
    for method in ("post", "put", "patch", "delete"):
        response = getattr(scraper, method)(URL)
        assert response.status_code == 405 and "no-store" in response["Cache-Control"], method
    admin = Client()
    admin.force_login(user("root", superuser=True))
    assert admin.post(URL).status_code == 405


def test_redis_out_of_reach_is_a_failed_scrape_not_a_traceback(metrics_settings):
    metrics_settings.ECHOMQ = {**metrics_settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                               "ENQUEUE_TIMEOUT": 1}
    started = time.monotonic()
    response = Client().get(URL, headers={"Authorization": f"Bearer {TOKEN}"})
    assert time.monotonic() - started < 3
    assert response.status_code == 503 and response["Content-Type"] == "text/plain; charset=utf-8"
    body = response.content.decode()
    assert body.startswith("Redis did not answer") and body.count("\n") == 1 and "Traceback" not in body
    assert "echomq_" not in body
    assert Client().get(URL).status_code == 401, "who may read is decided before Redis is asked"


def test_the_demo_project_serves_it_under_echomq():
    assert reverse("echomq:metrics") == URL
