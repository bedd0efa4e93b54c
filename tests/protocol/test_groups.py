"""Groups in the scripts: jobs of a group (a tenant, a user) take turns with other groups, each group capped.

Every test checks the bookkeeping too (`consistent`): each group's waiting
count is the length of its list, the queue's total is their sum, and each
group's running count is what `active` holds of it.
"""

import logging
import threading

import pytest

from echomq_django.core import JobOptions, NewJob, PayloadError, Worker, WorkerOptions
from echomq_django.core.producing.queue import now_ms
from tests.helpers import finish, kill_lock, running, sweep, wait_until


def add(queue, group, n, **options):
    return queue.add_bulk([NewJob("work", {"n": i}, JobOptions(group=group, **options)) for i in range(n)])


def take(queue, token, count=1, group_cap=0):
    return take_saying(queue, token, count, group_cap)[0]


def take_saying(queue, token, count=1, group_cap=0):
    """One fetch: the ids it took, and what it said was broken."""
    call = queue.scripts.fetch_call(queue.keys, token, 30_000, now_ms(), count, "w", group_max_active=group_cap)
    [reply] = queue.scripts.run_batch([call], raise_on_error=True)
    return [job_id for job_id, _ in queue.scripts.fetched(reply)[2]], queue.scripts.broken_keys(reply)


def group_of(queue, job_id):
    return queue.client.hget(queue.keys.job(job_id), "grp")


def consistent(queue) -> None:
    client, base = queue.client, queue.keys.base
    waiting = dict(client.zrange(queue.keys.group_waiting, 0, -1, withscores=True))
    lists = {key.removeprefix(base + "group:"): client.llen(key) for key in client.scan_iter(base + "group:*")}
    assert {group: int(n) for group, n in waiting.items()} == lists, "each group's waiting count is its list"
    assert int(client.hget(queue.keys.meta, "groupWaiting") or 0) == sum(lists.values())
    running: dict[str, int] = {}
    running_ids = {}
    for job_id in client.lrange(queue.keys.active, 0, -1):
        if group := group_of(queue, job_id):
            running[group] = running.get(group, 0) + 1
            running_ids[job_id] = group
    assert {g: int(n) for g, n in client.hgetall(queue.keys.group_active).items()} == running
    assert client.hgetall(queue.keys.group_running) == running_ids
    ring = set(client.zrange(queue.keys.groups, 0, -1))
    assert {group for group, n in lists.items() if n} - {"*"} <= ring | set(running), "a group with jobs is in turn"


def test_groups_take_turns_and_the_jobs_without_a_group_take_one_too(queue):
    a = add(queue, "tenant-a", 6)
    b = add(queue, "tenant-b", 2)
    plain = queue.add_bulk([NewJob("work") for _ in range(2)])
    order = [job_id for _ in range(10) for job_id in take(queue, f"t{_}")]
    assert order == [a[0], b[0], plain[0], a[1], b[1], plain[1], *a[2:]]
    consistent(queue)


def test_a_big_group_does_not_starve_a_small_one(queue):
    big = add(queue, "big", 2000)
    small = add(queue, "small", 10)
    started: list[str] = []
    while len(started) < 40:
        started += take(queue, f"t{len(started)}", count=8)
    assert max(started.index(job_id) for job_id in small) < 20, "the small group's 10 start in the first 20"
    assert started[:20:2] == big[:10], "the big group keeps its own order"
    consistent(queue)


def test_a_group_at_its_cap_sits_out_until_one_of_its_jobs_ends(queue):
    a = add(queue, "a", 3)
    b = add(queue, "b", 3)
    assert take(queue, "t1", count=10, group_cap=1) == [a[0], b[0]]
    assert take(queue, "t2", count=10, group_cap=1) == []
    consistent(queue)
    finish(queue, a[0], "t1")
    assert take(queue, "t3", count=10, group_cap=1) == [a[1]]
    consistent(queue)


def test_waiting_jobs_of_groups_are_counted_stated_cancelled_and_removed(queue):
    a = add(queue, "a", 3)
    assert queue.counts()["wait"] == 3
    assert queue.get_state(a[0]) == "wait"
    assert queue.cancel(a[1], "no")
    assert queue.get_state(a[1]) == "failed"
    assert queue.remove(a[2])
    assert queue.counts()["wait"] == 1
    consistent(queue)
    assert take(queue, "t1", count=10) == [a[0]]
    assert queue.counts()["wait"] == 0


def test_a_recovered_or_retried_job_goes_back_to_its_group_and_frees_its_slot(queue):
    a = add(queue, "a", 2, attempts=3)
    assert take(queue, "t1", group_cap=1) == [a[0]]
    kill_lock(queue, a[0])
    sweep(queue, max_stalled_count=5)
    sweep(queue, max_stalled_count=5)
    assert queue.get_state(a[0]) == "wait" and queue.client.lpos(queue.keys.base + "group:a", a[0]) is not None
    consistent(queue)
    assert take(queue, "t2", group_cap=1) == [a[1]], "the slot came back; the turn order holds"
    assert finish(queue, a[1], "t2", completed=False, value="boom") == 3
    consistent(queue)
    assert sorted(take(queue, "t3", count=5)) == sorted(a)


def test_a_delayed_job_of_a_group_becomes_ready_in_its_group(queue):
    [job_id] = add(queue, "a", 1, delay_ms=1)
    assert queue.client.zscore(queue.keys.delayed, job_id)
    assert wait_until(lambda: take(queue, "t1") == [job_id], 2), "promoted into its group once due"
    assert queue.client.hget(queue.keys.job(job_id), "grp") == "a"
    consistent(queue)


def test_a_paused_queue_starts_no_job_of_a_group(queue):
    a = add(queue, "a", 2)
    queue.pause()
    assert take(queue, "t1") == []
    queue.resume()
    assert take(queue, "t2", count=5) == a


@pytest.mark.parametrize("group, words", [
    ("a:b", "may hold only"), ("x" * 129, "characters long"), ("{a}", "may hold only"), (5, "must be a string")])
def test_a_group_name_is_checked_like_an_id(queue, group, words):
    with pytest.raises(PayloadError, match=words):
        JobOptions(group=group)


def test_a_job_in_a_group_cannot_have_a_priority():
    with pytest.raises(PayloadError, match="cannot have a priority"):
        JobOptions(group="a", priority=5)


def test_a_group_gets_its_slot_back_whatever_became_of_the_hash_of_its_running_job(queue):
    a = add(queue, "a", 3)
    assert take(queue, "t1", group_cap=1) == [a[0]]
    queue.client.delete(queue.keys.job(a[0]))  # another client's doing
    assert take(queue, "t2", group_cap=1) == [], "a's one slot is taken"
    kill_lock(queue, a[0])
    sweep(queue)
    sweep(queue)
    assert queue.get_state(a[0]) == "failed", "no hash: failed by the sweep"
    assert take(queue, "t3", group_cap=1) == [a[1]], "and the slot given back"
    queue.client.hset(queue.keys.job(a[1]), "grp", "b")  # its group rewritten while it runs
    finish(queue, a[1], "t3")
    assert take(queue, "t4", group_cap=1) == [a[2]]
    consistent(queue)


def test_corrupt_counters_of_groups_do_not_stop_a_script_halfway(queue):
    queue.client.hset(queue.keys.meta, mapping={"groupTurn": "abc", "groupWaiting": "x"})
    a = add(queue, "a", 2)
    queue.client.hset(queue.keys.group_active, "a", "?")
    assert take(queue, "t1", count=2, group_cap=5) == a
    assert finish(queue, a[0], "t1") == 1
    assert queue.client.hget(queue.keys.meta, "groupTurn").isdigit()


@pytest.mark.parametrize("job_id", ["groups", "group-active", "group-waiting", "group-running", "limiter"])
def test_the_names_of_the_group_keys_are_no_job_ids(queue, job_id):
    from echomq_django.core import InvalidNameError

    with pytest.raises(InvalidNameError, match="reserved"):
        queue.add("work", job_id=job_id)


def test_a_schedule_of_a_job_in_a_group_fires_its_job_into_the_group(queue):
    from echomq_django.core import Schedule, run_now

    schedule = Schedule("nightly", queue.name, "work", {"args": [], "kwargs": {}}, JobOptions(group="tenant-a"),
                        every_ms=60_000)
    job_id = "nightly-now"
    run_now(queue.scripts, schedule, job_id, prefix=queue.keys.prefix)
    assert group_of(queue, job_id) == "tenant-a"
    assert queue.client.lrange(queue.keys.group("tenant-a"), 0, -1) == [job_id]
    assert take(queue, "t1") == [job_id]
    consistent(queue)


# Names on each side of every part of the rule: the first character, the rest, the length.
NAME_EDGES = ["a", "Z", "0", "_", "_a", ".a", "-a", "@a", "+a", "=a", "a.b", "a-b", "a@b+c=d_e", "*", "", " a",
              "a b", "a:b", "a{b}", "a/b", "a%b", "a]", "a^", "é", "a\x00", "..", "x" * 128, "x" * 129]


def test_the_scripts_take_as_a_group_exactly_the_names_python_takes(queue):
    from echomq_django.core.protocol.keys import is_name
    from echomq_django.core.protocol.lua import assemble

    probe = assemble('-- @include "groups"\nlocal taken = {}\n'
                     'for i, raw in ipairs(ARGV) do taken[i] = groupOf(raw) and 1 or 0 end\nreturn taken')
    in_lua = queue.client.eval(probe, 1, queue.keys.meta, *NAME_EDGES)  # (a key: routes it on a cluster)
    assert dict(zip(NAME_EDGES, map(bool, in_lua))) == {name: is_name(name) for name in NAME_EDGES}
    assert is_name("_a") and not is_name(".a") and not is_name("x" * 129), "the rule is the one keys.py states"


# -- another client's keys and values in the groups' bookkeeping ----------------

def worker_of(queue, done, **options):
    """A worker that records the id of each job it runs (after `gate`, when given, is set)."""
    gate = options.pop("gate", None)

    def handler(job):
        if gate is not None and job.data == {"wait": True}:
            gate.wait(30)
        done.append(job.id)

    return Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.1,
                                                                   **options))


def reports(caplog, words):
    return [record.getMessage() for record in caplog.records if words in record.getMessage()]


def turns(queue) -> int:
    return int(queue.client.hget(queue.keys.meta, "groupTurn") or 0)


def test_a_group_list_of_another_type_stops_that_group_alone_is_reported_once_and_goes_on_once_deleted(
        queue, caplog):
    add(queue, "a", 2)
    others = add(queue, "b", 3) + queue.add_bulk([NewJob("work") for _ in range(3)])
    queue.client.delete(queue.keys.group("a"))
    queue.client.set(queue.keys.group("a"), "another client's")
    done: list[str] = []
    with caplog.at_level(logging.ERROR, logger="echomq.worker"), running(worker_of(queue, done)):
        assert wait_until(lambda: set(others) <= set(done), 20), "the other group and the plain jobs ran"
        # Group a sits out a turn at every fetch that meets it (each one a turn more): many fetches, one report.
        seen = turns(queue)
        assert wait_until(lambda: turns(queue) >= seen + 5, 20)
        refused = queue.add("work", opts=JobOptions(group="a"))
        assert queue.get_state(refused) == "failed", "a job of a made ready meanwhile fails, saying why"
        assert "holds a string, not a list" in queue.client.hget(queue.keys.job(refused), "failedReason")
        queue.client.delete(queue.keys.group("a"))
        again = add(queue, "a", 2)
        assert wait_until(lambda: set(again) <= set(done), 20), "group a runs again, the worker not restarted"
    [report] = reports(caplog, queue.keys.group("a"))
    assert "the jobs of group a wait until it is deleted" in report


def test_a_group_active_count_that_is_no_whole_number_does_not_hold_its_group(queue, caplog):
    queue.client.hset(queue.keys.group_active, "a", "1e3")
    a = add(queue, "a", 3)
    done: list[str] = []
    with caplog.at_level(logging.ERROR, logger="echomq.worker"), \
            running(worker_of(queue, done, group_max_active=1)):
        assert wait_until(lambda: set(a) <= set(done), 20)
    assert len(reports(caplog, "counts 1e3 running for group a")) == 1
    consistent(queue)


def test_a_broken_entry_of_group_running_leaks_no_slot_for_good(queue, caplog):
    gate = threading.Event()
    first = queue.add("work", {"wait": True}, opts=JobOptions(group="a"))
    rest = add(queue, "a", 2)
    done: list[str] = []
    with caplog.at_level(logging.WARNING, logger="echomq.sweeper"), \
            running(worker_of(queue, done, group_max_active=1, concurrency=2, gate=gate)):
        assert wait_until(lambda: queue.client.hget(queue.keys.group_running, first) == "a", 20)
        queue.client.hset(queue.keys.group_running, first, "no:group")  # another client's
        gate.set()
        assert wait_until(lambda: first in done and not queue.client.hexists(queue.keys.group_running, first), 20)
        others = add(queue, "b", 2) + queue.add_bulk([NewJob("work") for _ in range(2)])
        assert wait_until(lambda: set(others) <= set(done), 20), "other groups and plain jobs run"
        assert queue.client.hget(queue.keys.group_active, "a") == "1", "a's slot leaked: the entry named no group"
        assert not set(rest) & set(done)
        sweep(queue)
        assert wait_until(lambda: set(rest) <= set(done), 20), "the sweep gave it back, the worker not restarted"
        sweep(queue)
    [report] = reports(caplog, "repaired")
    assert "group a: group-active counted 1 running, group-running names 0" in report
    consistent(queue)


@pytest.mark.parametrize("key, starts", [("groups", False), ("group_active", False), ("group_running", True)])
def test_a_groups_key_of_another_type_stops_no_job_without_a_group_and_the_groups_go_on_once_it_is_deleted(
        queue, key, starts):
    a = add(queue, "a", 2)
    plain = queue.add_bulk([NewJob("work") for _ in range(2)])
    name = getattr(queue.keys, key)
    queue.client.delete(name)
    queue.client.set(name, "another client's")
    taken, broken = take_saying(queue, "t1", count=10, group_cap=1)
    assert set(plain) <= set(taken), "the jobs without a group start"
    assert (a[0] in taken) == starts, "the jobs of groups wait, unless only their record is lost"
    assert [line for line in broken if line.startswith(f"{name} holds a string, not a hash")
            or line.startswith(f"{name} holds a string, not a sorted set")], broken
    queue.client.delete(name)
    for job_id in taken:
        finish(queue, job_id, "t1")
    sweep(queue)  # puts right what the broken key left: a's turn, a's count
    assert take(queue, "t2", count=10, group_cap=1) == [a[1] if starts else a[0]]
    consistent(queue)
