"""The schedules' admin: the Schedule rows (list, form, actions) and the read-only schedules of ECHOMQ["SCHEDULES"].

Everything runs against the real Redis under the test's own prefix: a
schedule's record is written by the fireSchedule script (a Beat firing a
tick, or run now), and every job run now is looked up in Redis.
"""

import re
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from demo_project.demo_app import tasks  # noqa: F401  (its @tasks registered, as a project's jobs.py or views do)
from echomq_django import schedules
from echomq_django.core import Beat, now_ms
from echomq_django.models import Schedule
from echomq_django.queues import get_queue
from tests.redis_servers import free_port

pytestmark = pytest.mark.django_db


PING = "tests.beat_app.jobs.tick"  # a @job on queue q, in the app tests.beat_app the fixture installs
CHANGELIST = "admin:echomq_schedule_changelist"
SETTINGS_SCHEDULES = {
    "heartbeat": {"TASK": PING, "EVERY": 30, "ARGS": [7]},
    "broken-one": {"TASK": "tests.beat_app.no_such_module.nothing", "CRON": "0 3 * * *"},
}


@pytest.fixture
def schedule_settings(echomq_settings):
    """Two queues, q (the @job's own) and other, and two schedules in settings: one valid, one not."""
    echomq_settings.INSTALLED_APPS = [*echomq_settings.INSTALLED_APPS, "tests.beat_app"]
    echomq_settings.ECHOMQ = {**echomq_settings.ECHOMQ, "QUEUES": {"q": {}, "other": {}},
                              "SCHEDULES": SETTINGS_SCHEDULES}
    return echomq_settings


@pytest.fixture
def root(schedule_settings) -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="pw"))
    return client


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(content_type__app_label="echomq", codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def changelist() -> str:
    return reverse(CHANGELIST)


def change_url(row: Schedule) -> str:
    return reverse("admin:echomq_schedule_change", args=[row.pk])


def run_settings_url(name: str) -> str:
    return reverse("admin:echomq_schedule_run_settings", args=[name])


def job_page(job_id: str, queue_name: str = "q") -> str:
    return reverse("admin:echomq_job_detail", args=[queue_name, job_id])


def form(**changes) -> dict:
    """The add/change form's fields for a valid interval schedule, with `changes` (None: leave the field out)."""
    data = {"name": "nightly", "task": PING, "cron": "", "every": "60", "args": "[]", "kwargs": "{}", "queue": "",
            "timezone": "", "enabled": "on", "catch_up": "on", "priority": "", "attempts": ""}
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def row(name: str = "beat", **fields) -> Schedule:
    return Schedule.objects.create(**{"name": name, "task": PING, "every": 3600, **fields})


def action(client: Client, name: str, *rows: Schedule, **extra):
    return client.post(changelist(), {"action": name, "_selected_action": [r.pk for r in rows], **extra},
                       follow=True)


def shown(response) -> str:
    """A page as its text reads: without the line breaks allowed after each dot of a task path."""
    return response.content.decode().replace("<wbr>", "")


def utc(ms: int) -> str:
    return f"{datetime.fromtimestamp(ms / 1000, tz=UTC):%Y-%m-%d %H:%M:%S} UTC"


def list_rows(page: str) -> dict[str, dict[str, str]]:
    """The changelist's rows by schedule name: each column's cell (its HTML) by field name."""
    start = page.index('<table id="result_list">')
    table = page[start:page.index("</table>", start)]
    rows = {}
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", table[table.index("<tbody>"):], re.S):
        cells = dict(re.findall(r'<t[hd] class="field-(\w+)"[^>]*>(.*?)</t[hd]>', tr, re.S))
        rows[re.sub(r"<[^>]+>", "", cells["name"])] = cells
    return rows


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def latest_job_id(schedule_row_or_name) -> str:
    """The record's latest job of a row (or a settings schedule, by name), read from Redis."""
    if isinstance(schedule_row_or_name, Schedule):
        entry = schedule_row_or_name.entry()
    else:
        entry = next(e for e in schedules.settings_entries() if e.name == schedule_row_or_name)
    [record] = schedules.records([entry.schedule])
    return record.job_id


def fire_a_tick(schedule_row: Schedule) -> tuple[int, str]:
    """Fire the schedule's latest tick through the real scheduler, 1 ms after it (so it is on time).

    The row is dated back a day first: a row fires no tick from before it was saved.
    """
    Schedule.objects.filter(pk=schedule_row.pk).update(updated_at=timezone.now() - timedelta(days=1))
    schedule_row.refresh_from_db()
    schedule = schedule_row.entry().schedule
    queue = get_queue(schedule.queue)
    beat = Beat(queue.client, lambda: [schedule], prefix=queue.keys.prefix, scripts=queue.scripts)
    beat.reload()
    tick = schedule.tick_at_or_before(now_ms())
    [firing] = beat.fire_due(tick + 1)
    assert firing.outcome == "fired"
    return tick, firing.job_id


def run_now_buttons(page: str) -> list[str]:
    """The action of every run-now form of the settings table, with its CSRF token right inside."""
    return re.findall(r'<form method="post" action="([^"]+)"><input type="hidden" name="csrfmiddlewaretoken"', page)


# -- the list ----------------------------------------------------------------------------------------------------

def test_the_list_shows_each_schedule_with_what_redis_remembers_and_when_it_fires_next(root, queue):
    beat = row("beat", every=3600)
    row("berlin", every=None, cron="0 3 * * *", timezone="Europe/Berlin", queue="other")
    row("off", enabled=False)
    row("bad", task="tests.beat_app.no_such_module.nothing")
    tick, job_id = fire_a_tick(beat)

    rows = list_rows(shown(root.get(changelist())))

    assert rows["beat"]["when"] == "every 3600 s" and rows["berlin"]["when"] == "cron 0 3 * * * (Europe/Berlin)"
    assert rows["beat"]["task_path"] == PING
    assert rows["beat"]["queue_shown"] == 'q <span class="help">(the task\'s own)</span>', "the resolved queue"
    assert rows["berlin"]["queue_shown"] == "other"
    assert rows["beat"]["last_fired"] == f"{utc(tick)}: fired" and rows["berlin"]["last_fired"] == "never"
    assert rows["beat"]["last_job"] == f'<a href="{job_page(job_id)}">{job_id}</a>', "linked to its page"
    assert rows["off"]["next_fire"] == "disabled"
    assert rows["bad"]["next_fire"].startswith(
        '<span class="echomq-problem">invalid: schedule &#x27;bad&#x27;[&#x27;TASK&#x27;]: '
        '&#x27;tests.beat_app.no_such_module.nothing&#x27; is not a registered @job')
    assert rows["bad"]["last_fired"] == rows["bad"]["last_job"] == "-"
    # The next tick, in the schedule's time zone; the page may have been drawn after a tick passed.
    assert rows["beat"]["next_fire"] in (utc(tick + 3_600_000), utc(tick + 7_200_000))
    berlin = Schedule.objects.get(name="berlin").entry().schedule
    assert re.fullmatch(r"\d{4}-\d\d-\d\d 03:00:00 CES?T", rows["berlin"]["next_fire"])
    assert rows["berlin"]["next_fire"][:10] == datetime.fromtimestamp(
        berlin.tick_after(now_ms()) / 1000, tz=ZoneInfo("Europe/Berlin")).strftime("%Y-%m-%d")


def test_the_latest_job_is_plain_text_once_redis_no_longer_has_it(root, queue):
    beat = row("beat")
    _tick, job_id = fire_a_tick(beat)
    queue.client.delete(queue.keys.job(job_id))
    page = root.get(changelist()).content.decode()
    assert job_id in page and "(no longer in Redis)" in page
    assert job_page(job_id) not in page


def test_the_list_reads_the_records_of_the_whole_page_in_one_call(root, queue, monkeypatch):
    for name in ("a", "b", "c", "d"):
        row(name)
    row("bad", task="tests.beat_app.no_such_module.nothing")
    calls = []
    real_records = schedules.records

    def counted(asked):  # the real read, counted
        calls.append([schedule.name for schedule in asked])
        return real_records(asked)

    monkeypatch.setattr(schedules, "records", counted)
    assert root.get(changelist()).status_code == 200
    assert calls == [["a", "b", "c", "d", "heartbeat"]], "the rows' and the settings' valid schedules, at once"


def test_the_list_shows_redis_unreachable_and_still_when_each_fires_next(root, schedule_settings):
    row("beat")
    schedule_settings.ECHOMQ = {**schedule_settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                                "ENQUEUE_TIMEOUT": 1}
    started = time.monotonic()
    response = root.get(changelist())
    took_s = time.monotonic() - started
    page = response.content.decode()
    assert response.status_code == 200
    assert page.count("Redis unreachable") == 4, "last fired and last job, of the row and of the settings schedule"
    assert "Redis could not be read" in page and "Redis did not answer" in page
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page), "the next fire needs no Redis"
    assert took_s < 2, f"the list waited {took_s:.1f} s for Redis"


def test_the_form_of_a_schedule_shows_its_record_counts_and_next_ticks(root, queue):
    berlin = row("berlin", every=None, cron="30 2 * * *", timezone="Europe/Berlin")
    _tick, job_id = fire_a_tick(berlin)
    page = root.get(change_url(berlin)).content.decode()
    assert "fired 1, skipped 0, missed 0" in page
    ticks = re.findall(r"<li>(\d{4}-\d\d-\d\d 02:30:00 (?:CET|CEST))</li>", page)
    assert len(ticks) == 5 and len(set(ticks)) == 5, "the next five ticks, in the schedule's time zone"
    assert f'<a href="{job_page(job_id)}">{job_id}</a>' in page


def test_the_form_of_a_schedule_shows_redis_unreachable(root, schedule_settings):
    beat = row("beat")
    schedule_settings.ECHOMQ = {**schedule_settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                                "ENQUEUE_TIMEOUT": 1}
    response = root.get(change_url(beat))
    assert response.status_code == 200 and "Redis unreachable" in response.content.decode()


# -- adding, changing, deleting -------------------------------------------------------------------------------------

def test_a_superuser_adds_changes_and_deletes_a_schedule(root):
    response = root.post(reverse("admin:echomq_schedule_add"),
                         form(cron="0 3 * * 1-5", every="", timezone="Europe/Berlin", args='[1, "a"]',
                              kwargs='{"full": true}', queue="other", priority="5", attempts="2"))
    assert response.status_code == 302, response.context["adminform"].form.errors if response.context else ""
    added = Schedule.objects.get(name="nightly")
    assert (added.cron, added.every, added.timezone, added.args, added.kwargs, added.queue, added.priority,
            added.attempts) == ("0 3 * * 1-5", None, "Europe/Berlin", [1, "a"], {"full": True}, "other", 5, 2)
    assert added.entry().schedule is not None

    response = root.post(change_url(added), form(every="30"))
    assert response.status_code == 302
    added.refresh_from_db()
    assert (added.cron, added.every, added.queue) == ("", 30.0, "")

    response = root.post(reverse("admin:echomq_schedule_delete", args=[added.pk]), {"post": "yes"})
    assert response.status_code == 302 and not Schedule.objects.exists()


@pytest.mark.parametrize("changes, field, words", [
    ({"cron": "0 3 * *", "every": ""}, "cron", "must have five fields"),
    ({"cron": "61 * * * *", "every": ""}, "cron", "is wrong"),
    ({"task": "tests.beat_app.no_such_module.nothing"}, "task", "is not a registered @job or echomq @task"),
    ({"task": "tests.beat_app.jobs.job"}, "task", "neither a Django @task nor an echomq @job"),
    ({"cron": "0 3 * * *", "every": "60"}, "cron", "needs exactly one of CRON and EVERY"),
    ({"cron": "", "every": ""}, "cron", "needs exactly one of CRON and EVERY"),
    ({"args": '{"a": 1}'}, "args", "must be a list"),
    ({"queue": "nope"}, "queue", "not in ECHOMQ['QUEUES']"),
    ({"timezone": "Mars/Olympus"}, "timezone", "unknown time zone"),
    ({"name": "heartbeat"}, "name", "ECHOMQ['SCHEDULES'] has a schedule named 'heartbeat'"),
])
def test_the_form_shows_each_problem_on_its_field_and_saves_nothing(root, changes, field, words):
    response = root.post(reverse("admin:echomq_schedule_add"), form(**changes))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert field in errors and any(words in message for message in errors[field]), errors
    assert not Schedule.objects.exists()
    page = response.content.decode().replace("&#x27;", "'")
    # The message is shown in the field's own row of the form.
    assert re.search(rf'<ul class="errorlist" id="id_{field}_error"><li>[^<]*{re.escape(words)}', page), \
        f"no error on {field}"


def test_a_change_with_a_problem_leaves_the_row_as_it_was(root):
    beat = row("beat")
    response = root.post(change_url(beat), form(name="beat", cron="every day", every=""))
    assert response.status_code == 200 and "cron" in response.context["adminform"].form.errors
    beat.refresh_from_db()
    assert (beat.cron, beat.every) == ("", 3600)


# -- permissions ----------------------------------------------------------------------------------------------------

def test_staff_with_only_view_permission_sees_but_cannot_change_or_run(schedule_settings, queue):
    beat = row("beat")
    viewer = staff("viewer", "view_schedule")
    page = viewer.get(changelist()).content.decode()
    assert "beat" in page and "heartbeat" in page
    assert run_now_buttons(page) == [] and "run_selected" not in page and "enable_selected" not in page

    form_page = viewer.get(change_url(beat))
    assert form_page.status_code == 200 and 'name="_save"' not in form_page.content.decode()
    assert viewer.post(change_url(beat), form(name="beat", every="5")).status_code == 403
    beat.refresh_from_db()
    assert beat.every == 3600

    action(viewer, "run_selected", beat)
    action(viewer, "disable_selected", beat)
    assert viewer.post(run_settings_url("heartbeat")).status_code == 403
    beat.refresh_from_db()
    assert beat.enabled
    assert queue.counts()["wait"] == 0, "no job was added"
    assert viewer.post(reverse("admin:echomq_schedule_add"), form()).status_code == 403


def test_staff_who_may_change_but_not_run_can_disable_and_not_run(schedule_settings, queue):
    beat = row("beat")
    editor = staff("editor", "view_schedule", "change_schedule")
    page = editor.get(changelist()).content.decode()
    assert "disable_selected" in page and "run_selected" not in page and run_now_buttons(page) == []
    action(editor, "run_selected", beat)
    assert queue.counts()["wait"] == 0
    action(editor, "disable_selected", beat)
    beat.refresh_from_db()
    assert not beat.enabled


def test_staff_who_may_run_get_the_buttons_and_the_action(schedule_settings, queue):
    beat = row("beat")
    runner = staff("runner", "view_schedule", "run_schedule")
    page = runner.get(changelist()).content.decode()
    assert "run_selected" in page and "disable_selected" not in page
    assert run_now_buttons(page) == [run_settings_url("heartbeat")], "a button for the valid settings schedule only"
    response = action(runner, "run_selected", beat)
    job_id = latest_job_id(beat)
    assert queue.get_job(job_id) is not None
    # No view_job permission: the id is reported, not linked to a page the user could not open.
    assert any(job_id in message and "<a " not in message for message in messages_of(response))


# -- run now ----------------------------------------------------------------------------------------------------

def test_run_now_adds_each_valid_schedules_job_and_reports_the_invalid_ones(root, queue):
    beat = row("beat", args=[1, "x"], kwargs={"k": True})
    elsewhere = row("elsewhere", queue="other")
    bad = row("bad", task="tests.beat_app.no_such_module.nothing")
    response = action(root, "run_selected", beat, elsewhere, bad)
    assert response.status_code == 200
    said = messages_of(response)

    job_id = latest_job_id(beat)
    assert job_id.startswith("beat@now-")
    added = queue.get_job(job_id)
    assert added.name == PING and added.data == {"args": [1, "x"], "kwargs": {"k": True}}
    other_id = latest_job_id(elsewhere)
    assert get_queue("other").get_job(other_id) is not None
    ran = next(message for message in said if message.startswith("Ran 2 schedule(s) now"))
    assert f'<a href="{job_page(job_id)}">{job_id}</a>' in ran
    assert f'<a href="{job_page(other_id, "other")}">{other_id}</a>' in ran
    assert any(message.startswith("Schedule bad was not run: ") and "not a registered" in message for message in said)


def test_run_now_on_a_redis_out_of_reach_says_so_once(root, schedule_settings):
    rows = [row(name) for name in ("a", "b", "c")]
    schedule_settings.ECHOMQ = {**schedule_settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                                "ENQUEUE_TIMEOUT": 1}
    response = action(root, "run_selected", *rows)
    assert response.status_code == 200
    # One wait for Redis per request, not one per schedule: the first says so, and for the rest.
    [said] = messages_of(response)
    assert said.startswith("Schedule a was not run: Redis did not answer (") and \
        said.endswith("); nor were the 2 other selected schedule(s)"), said


def test_the_latest_job_of_a_schedule_run_now_is_shown_and_linked(root, queue):
    beat = row("beat")
    action(root, "run_selected", beat)
    job_id = latest_job_id(beat)
    page = root.get(changelist()).content.decode()
    assert "run now at" in page and f'<a href="{job_page(job_id)}">{job_id}</a>' in page


# -- enable and disable ----------------------------------------------------------------------------------------------

def test_enable_and_disable_flip_the_rows_and_move_updated_at(root):
    beat, other = row("beat"), row("other-beat")
    long_ago = timezone.now() - timedelta(days=3)
    Schedule.objects.update(updated_at=long_ago)

    response = action(root, "disable_selected", beat)
    assert "1 schedule(s) disabled." in messages_of(response)
    beat.refresh_from_db()
    other.refresh_from_db()
    assert not beat.enabled and beat.updated_at > long_ago
    assert other.enabled and other.updated_at == long_ago, "only the selected row"

    disabled_at = beat.updated_at
    response = action(root, "enable_selected", beat, other)
    assert messages_of(response)[0].startswith("1 schedule(s) enabled")
    beat.refresh_from_db()
    other.refresh_from_db()
    assert beat.enabled and beat.updated_at >= disabled_at
    # Re-enabled, its ticks are counted from now: the ones it slept through are not caught up.
    assert beat.entry().schedule.since_ms >= int(disabled_at.timestamp() * 1000)
    assert other.updated_at == long_ago, "already enabled: left alone, so a tick due now is still caught up"


def test_a_row_with_the_name_of_a_settings_schedule_says_it_is_not_fired(root):
    shadowed = row("heartbeat")  # the form refuses the name; a row written around it
    assert list_rows(root.get(changelist()).content.decode())["heartbeat"]["next_fire"] == (
        '<span class="echomq-problem">not fired: ECHOMQ[&#x27;SCHEDULES&#x27;] has a schedule of this name</span>')
    assert "not fired: ECHOMQ[&#x27;SCHEDULES&#x27;]" in root.get(change_url(shadowed)).content.decode()


def test_a_broken_echomq_setting_is_said_instead_of_failing_the_list(root, schedule_settings):
    row("beat")
    schedule_settings.ECHOMQ = {**schedule_settings.ECHOMQ, "ENQUEUE_TIMEOUT": 0}
    response = root.get(changelist())
    assert response.status_code == 200
    assert "ECHOMQ cannot be read, so no schedule can be: " in response.content.decode()


# -- the schedules of settings -------------------------------------------------------------------------------------

def test_the_settings_schedules_are_listed_read_only_with_their_problems(root, queue):
    page = shown(root.get(changelist()))
    section = page[page.index('id="echomq-settings-schedules"'):]
    assert "<h2>Schedules from settings (read-only; edit ECHOMQ['SCHEDULES'])</h2>" in section
    assert "heartbeat" in section and "every 30 s" in section and PING in section
    assert "broken-one" in section and "cron 0 3 * * * (UTC)" in section
    assert "cannot import" in section and "invalid: see its problems below" in section, "the problem, and why"
    assert "never" in section, "heartbeat has not fired yet"
    assert run_now_buttons(section) == [run_settings_url("heartbeat")]
    # Nothing to edit: settings schedules have no rows, so no change links.
    assert "/change/" not in section


def test_the_run_now_button_of_a_settings_schedule_adds_its_job(root, queue):
    response = root.post(run_settings_url("heartbeat"), follow=True)
    assert response.redirect_chain[-1][0] == changelist()
    job_id = latest_job_id("heartbeat")
    added = queue.get_job(job_id)
    assert added.name == PING and added.data == {"args": [7], "kwargs": {}}
    assert any(f'<a href="{job_page(job_id)}">{job_id}</a>' in message for message in messages_of(response))
    page = response.content.decode()
    assert f'<a href="{job_page(job_id)}">{job_id}</a>' in page[page.index('id="echomq-settings-schedules"'):]


def test_the_run_now_button_needs_post_csrf_a_known_valid_name_and_permission(schedule_settings, queue):
    client = Client(enforce_csrf_checks=True)
    client.force_login(User.objects.create_superuser("root", password="pw"))
    page = client.get(changelist()).content.decode()
    [url] = run_now_buttons(page)
    assert client.get(url).status_code == 405
    assert client.post(url).status_code == 403, "no CSRF token"
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    assert client.post(run_settings_url("no-such-schedule"), {"csrfmiddlewaretoken": token}).status_code == 404
    response = client.post(run_settings_url("broken-one"), {"csrfmiddlewaretoken": token}, follow=True)
    assert any("was not run" in message and "cannot import" in message for message in messages_of(response))
    assert queue.counts()["wait"] == 0
    assert client.post(url, {"csrfmiddlewaretoken": token}).status_code == 302
    assert queue.counts()["wait"] == 1


def test_the_run_now_button_on_a_redis_out_of_reach_says_so(root, schedule_settings):
    schedule_settings.ECHOMQ = {**schedule_settings.ECHOMQ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
                                "ENQUEUE_TIMEOUT": 1}
    response = root.post(run_settings_url("heartbeat"), follow=True)
    assert response.status_code == 200
    assert any("Schedule heartbeat was not run: Redis did not answer" in m for m in messages_of(response))


def test_a_django_task_runs_on_its_own_queue(root, schedule_settings):
    schedule_settings.ECHOMQ = {**schedule_settings.ECHOMQ, "QUEUES": {"q": {}, "default": {}}}
    added = row("adder", task="demo_project.demo_app.tasks.add", args=[2, 3])
    page = root.get(changelist()).content.decode().replace("&#x27;", "'")
    assert "default <span class=\"help\">(the task's own)</span>" in page
    action(root, "run_selected", added)
    job = get_queue("default").get_job(latest_job_id(added))
    assert job.name == "demo_project.demo_app.tasks.add"


# -- hostile text ---------------------------------------------------------------------------------------------------

def test_hostile_names_task_paths_and_arguments_are_escaped(root, schedule_settings):
    schedule_settings.ECHOMQ = {**schedule_settings.ECHOMQ, "SCHEDULES": {
        "<script>alert('settings name')</script>": {"TASK": PING, "EVERY": 30},
        "evil-task": {"TASK": "<img src=x onerror=alert(1)>.x", "EVERY": 30, "QUEUE": "<b>q</b>"},
    }}
    hostile = Schedule.objects.create(name="<script>alert('row')</script>", task="<svg onload=alert(2)>.y",
                                      every=30, args=["</textarea><script>alert(3)</script>"])
    page = shown(root.get(changelist()))
    for raw in ("<script>alert(", "<img src=x", "<svg onload", "<b>q</b>"):
        assert raw not in page, raw
    assert "&lt;script&gt;alert(" in page and "&lt;img src=x onerror=alert(1)&gt;.x" in page
    assert "&lt;svg onload=alert(2)&gt;.y" in page and "&lt;b&gt;q&lt;/b&gt;" in page

    form_page = root.get(change_url(hostile)).content.decode()
    assert "<script>alert(" not in form_page and "<svg onload" not in form_page
    assert "&lt;/textarea&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in form_page


def test_a_record_another_client_wrote_is_shown_escaped_and_unlinked(root, queue):
    beat = row("beat")
    hostile_id = "<script>alert(4)</script>"
    queue.client.hset(queue.keys.schedule("beat"), mapping={
        "tick": "99999999999999999999", "outcome": "<b>odd</b>", "job": hostile_id, "firedAt": "soon",
        "fired": "many"})
    queue.client.set(queue.keys.job(hostile_id), "a key of that name exists")
    response = root.get(changelist())
    page = response.content.decode()
    assert response.status_code == 200 and "<script>alert(4)" not in page and "<b>odd" not in page
    cells = list_rows(page)["beat"]
    assert cells["last_job"] == "&lt;script&gt;alert(4)&lt;/script&gt;", "plain text: no job can have that id"
    assert cells["last_fired"] == "-: &lt;b&gt;odd&lt;/b&gt;", "a tick out of any calendar reads as -"
    form_page = root.get(change_url(beat)).content.decode()
    assert "fired 0, skipped 0, missed 0" in form_page and "<script>alert(4)" not in form_page
