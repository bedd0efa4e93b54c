"""The admin's reads and actions on single jobs: pages of a state (browse), cancel and promote."""

import threading

import pytest

from echomq_django.core import BROWSABLE, Cancel, JobOptions, NewJob, Worker, WorkerOptions, browse
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.reading.browse import MAX_PAGE
from tests.helpers import finish_attempt, kill_lock, sweep, take_jobs, wait_until


def make_worker(queue, handler, **options) -> Worker:
    options.setdefault("block_timeout_s", 0.2)
    return Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, **options))


def ids_of(page) -> list[str]:
    return [entry.job_id for entry in page.entries]


def all_pages(queue, state: str, count: int) -> list:
    pages = [browse(queue, state, 0, count)]
    while pages[-1].next_start is not None:
        assert len(pages) < 100, "pages never end"
        pages.append(browse(queue, state, pages[-1].next_start, count))
    return pages


def events(queue, name: str, job_id: str) -> list[dict]:
    return [fields for _id, fields in queue.client.xrange(queue.keys.events)
            if fields["event"] == name and fields["jobId"] == job_id]


# -- order, totals, pages ----------------------------------------------------


def test_wait_is_listed_newest_first_in_pages(queue):
    ids = [queue.add("work", {"n": n}, job_id=f"w{n}") for n in range(7)]
    newest_first = ids[::-1]
    first = browse(queue, "wait", 0, 3)
    assert (first.state, first.total, first.start, first.next_start) == ("wait", 7, 0, 3)
    assert ids_of(first) == newest_first[:3]
    assert [entry.job.data for entry in first.entries] == [{"n": 6}, {"n": 5}, {"n": 4}]
    assert all(entry.problem is None and entry.score_ms is None and entry.lock_ttl_ms is None
               for entry in first.entries)
    second = browse(queue, "wait", 3, 3)
    assert (ids_of(second), second.next_start) == (newest_first[3:6], 6)
    last = browse(queue, "wait", 6, 3)
    assert (ids_of(last), last.next_start, last.total) == (newest_first[6:], None, 7)
    beyond = browse(queue, "wait", 9, 3)
    assert (beyond.entries, beyond.next_start, beyond.total) == ([], None, 7)


def test_a_page_that_ends_exactly_at_the_last_job_is_the_last(queue):
    queue.add_bulk([NewJob("work") for _ in range(6)])
    assert browse(queue, "wait", 0, 3).next_start == 3
    assert browse(queue, "wait", 3, 3).next_start is None
    assert browse(queue, "wait", 0, 6).next_start is None
    assert browse(queue, "wait", 0, 5).next_start == 5


def test_an_empty_state(queue):
    for state in BROWSABLE:
        page = browse(queue, state)
        assert (page.total, page.entries, page.next_start, page.start) == (0, [], None, 0)


def test_paused_is_listed_newest_first(queue):
    queue.pause()
    ids = [queue.add("work", job_id=f"p{n}") for n in range(3)]
    page = browse(queue, "paused")
    assert (ids_of(page), page.total) == (ids[::-1], 3)


def test_prioritized_is_listed_in_the_order_workers_take_it(queue):
    queue.add("work", opts=JobOptions(priority=1), job_id="one")
    queue.add("work", opts=JobOptions(priority=5), job_id="five-a")
    queue.add("work", opts=JobOptions(priority=-3), job_id="minus-three")
    queue.add("work", opts=JobOptions(priority=5), job_id="five-b")
    queue.add("work", opts=JobOptions(priority=100), job_id="hundred")
    page = browse(queue, "prioritized", 0, 10)
    assert ids_of(page) == ["hundred", "five-a", "five-b", "one", "minus-three"]
    assert [entry.score_ms for entry in page.entries] == [None] * 5
    assert ids_of(browse(queue, "prioritized", 1, 2)) == ["five-a", "five-b"]
    _due, taken = take_jobs(queue, "t", 30_000, now_ms(), 5, "w")
    assert [job_id for job_id, _ in taken] == ids_of(page)


def test_delayed_is_listed_soonest_due_first_with_the_due_time(queue):
    now = now_ms()
    for name, delay in (("thirty", 30_000), ("ten", 10_000), ("twenty", 20_000)):
        queue.add("work", opts=JobOptions(delay_ms=delay), job_id=name, timestamp_ms=now)
    page = browse(queue, "delayed")
    assert ids_of(page) == ["ten", "twenty", "thirty"]
    assert [entry.score_ms for entry in page.entries] == [now + 10_000, now + 20_000, now + 30_000]


def test_finished_jobs_are_listed_most_recently_finished_first(queue):
    now = now_ms()
    ids = queue.add_bulk([NewJob("work", job_id=f"job{n}") for n in range(6)])
    _due, taken = take_jobs(queue, "t", 30_000, now, 6, "w")
    assert [job_id for job_id, _ in taken] == ids
    finished_at = {"job0": 3, "job1": 1, "job2": 2, "job3": 30, "job4": 10, "job5": 20}
    for job_id, offset in finished_at.items():
        completed = job_id in ("job0", "job1", "job2")
        finish_attempt(queue, job_id, "t", now + offset, completed=completed, value="x", default_attempts=1,
                       final=True)
    completed = browse(queue, "completed")
    assert ids_of(completed) == ["job0", "job2", "job1"]
    assert [entry.score_ms for entry in completed.entries] == [now + 3, now + 2, now + 1]
    assert [entry.job.finished_on for entry in completed.entries] == [now + 3, now + 2, now + 1]
    failed = browse(queue, "failed", 0, 2)
    assert (ids_of(failed), failed.total, failed.next_start) == (["job3", "job5"], 3, 2)
    assert ids_of(browse(queue, "failed", 2, 2)) == ["job4"]
    assert failed.entries[0].job.failed_reason == "x"


def test_active_entries_carry_their_lock_time_and_stalled_ones_none(queue):
    ids = queue.add_bulk([NewJob("work", job_id=f"a{n}") for n in range(3)])
    take_jobs(queue, "t", 30_000, now_ms(), 3, "w")
    page = browse(queue, "active")
    assert ids_of(page) == ids[::-1], "active: newest first"
    assert all(0 < entry.lock_ttl_ms <= 30_000 for entry in page.entries)
    assert all(entry.job.token == "t" for entry in page.entries)

    kill_lock(queue, "a1")
    assert sweep(queue).marked == 1
    stalled = browse(queue, "stalled")
    assert (ids_of(stalled), stalled.total, stalled.next_start) == (["a1"], 1, None)
    assert stalled.entries[0].lock_ttl_ms is None and stalled.entries[0].job.id == "a1"
    ttls = {entry.job_id: entry.lock_ttl_ms for entry in browse(queue, "active").entries}
    assert ttls["a1"] is None and 0 < ttls["a0"] <= 30_000 and 0 < ttls["a2"] <= 30_000

    queue.client.persist(queue.keys.lock("a0"))  # another client took the expiry off
    ttls = {entry.job_id: entry.lock_ttl_ms for entry in browse(queue, "active").entries}
    assert ttls["a0"] == -1


# How a server stores the stalled set decides how SSCAN pages it: a hashtable a few ids a call, a compact set
# (an intset; a listpack on Redis 7.2+ and Valkey: up to 128 ids of up to 64 bytes) whole in one call. Ids
# longer than 64 bytes make a hashtable on every server, so the cursor is followed across pages everywhere.
@pytest.mark.parametrize(("prefix_of_ids", "hashtable_everywhere"), [
    ("s-" + "x" * 64, True),  # long string ids: a hashtable on every server
    ("s-", False),  # short string ids: a hashtable on Redis 7.0, a listpack on Redis 7.2+ and Valkey
    ("", False),  # all-digit generated ids: an intset
])
def test_stalled_pages_follow_the_cursor_and_cover_every_mark_once(queue, prefix_of_ids, hashtable_everywhere):
    marks = 9
    if prefix_of_ids:
        queue.add_bulk([NewJob("work", job_id=f"{prefix_of_ids}{n}") for n in range(marks)])
    else:
        queue.add_bulk([NewJob("work") for _ in range(marks)])
    _due, taken = take_jobs(queue, "t", 30_000, now_ms(), marks, "w")
    ids = [job_id for job_id, _ in taken]
    for job_id in ids:
        kill_lock(queue, job_id)
    assert sweep(queue).marked == marks
    pages = all_pages(queue, "stalled", 2)
    seen = [job_id for page in pages for job_id in ids_of(page)]
    assert sorted(seen) == sorted(ids), "every marked id exactly once"
    assert all(page.total == marks for page in pages)
    assert [page.start for page in pages[1:]] == [page.next_start for page in pages[:-1]]
    assert all(entry.lock_ttl_ms is None and entry.job.id == entry.job_id
               for page in pages for entry in page.entries)
    encoding = queue.client.object("encoding", queue.keys.stalled)
    if hashtable_everywhere:
        assert encoding == "hashtable", "the long ids were to make a hashtable on this server too"
    if encoding == "hashtable":
        assert len(pages) > 1, "a hashtable set is scanned a few ids at a time"


def test_a_missing_hash_or_a_key_of_another_type_is_a_problem_not_an_error(queue):
    queue.add("work", job_id="fine")
    queue.client.lpush(queue.keys.wait, "ghost")
    queue.client.set(queue.keys.job("strange"), "not a hash")
    queue.client.lpush(queue.keys.wait, "strange")
    page = browse(queue, "wait")
    assert ids_of(page) == ["strange", "ghost", "fine"]
    strange, ghost, fine = page.entries
    assert (strange.job, strange.problem) == (None, "the job key holds another type than a hash")
    assert (ghost.job, ghost.problem) == (None, "the job hash no longer exists in Redis")
    assert fine.problem is None and fine.job.name == "work"

    queue.client.zadd(queue.keys.completed, {"ghost": 5, "strange": 7})
    completed = browse(queue, "completed")
    assert [(e.job_id, e.score_ms, e.job, e.problem is not None) for e in completed.entries] == [
        ("strange", 7, None, True), ("ghost", 5, None, True)]

    queue.client.zadd(queue.keys.delayed, {"ghost": float("inf")})
    [entry] = browse(queue, "delayed").entries
    assert (entry.job_id, entry.score_ms, entry.job) == ("ghost", None, None)

    queue.client.sadd(queue.keys.stalled, "ghost", "strange")
    stalled = {e.job_id: (e.job, e.problem is not None, e.lock_ttl_ms) for e in browse(queue, "stalled").entries}
    assert stalled == {"ghost": (None, True, None), "strange": (None, True, None)}


@pytest.mark.parametrize(("state", "start", "count"), [
    ("bogus", 0, 10), ("stalled-check", 0, 10), ("meta", 0, 10), ("wait", 0, 0), ("wait", 0, MAX_PAGE + 1),
    ("wait", -1, 10), ("completed", 0, -5),
])
def test_an_invalid_state_or_page_is_a_value_error(queue, state, start, count):
    with pytest.raises(ValueError):
        browse(queue, state, start, count)


def test_the_largest_page(queue):
    queue.add_bulk([NewJob("work") for _ in range(MAX_PAGE + 2)])
    page = browse(queue, "wait", 0, MAX_PAGE)
    assert (len(page.entries), page.total, page.next_start) == (MAX_PAGE, MAX_PAGE + 2, MAX_PAGE)


# -- cancel ----------------------------------------------------------------


def assert_cancelled(queue, job_id: str, reason: str, before: int) -> None:
    job, state = queue.get_job_with_state(job_id)
    assert state == "failed"
    assert job.failed_reason == reason
    assert before <= job.finished_on <= now_ms()
    assert queue.client.zscore(queue.keys.failed, job_id) == job.finished_on
    assert [e["reason"] for e in events(queue, "cancelled", job_id)] == [reason]


@pytest.mark.parametrize("where", ["wait", "paused", "prioritized", "delayed"])
def test_a_job_that_has_not_started_is_cancelled(queue, where):
    if where == "paused":
        queue.pause()
    opts = JobOptions(priority=7 if where == "prioritized" else 0, delay_ms=60_000 if where == "delayed" else 0)
    job_id = queue.add("work", opts=opts)
    other = queue.add("work", opts=opts)
    assert queue.get_state(job_id) == where
    before = now_ms()
    assert queue.cancel(job_id, f"not needed in {where}") is Cancel.CANCELLED
    assert_cancelled(queue, job_id, f"cancelled: not needed in {where}", before)
    assert queue.get_job(job_id).cancel_reason == f"cancelled: not needed in {where}"
    counts = queue.counts()
    assert (counts[where], counts["failed"]) == (1, 1)
    assert queue.get_state(other) == where, "the other job stays"
    assert queue.cancel(job_id) is Cancel.FINISHED, "cancelled once"


def test_the_default_reason(queue):
    job_id = queue.add("work")
    before = now_ms()
    assert queue.cancel(job_id)
    assert_cancelled(queue, job_id, "cancelled", before)


@pytest.mark.parametrize("ends", ["completed", "failed"])
def test_a_running_job_is_flagged_and_its_attempt_fails_for_good_whatever_it_ends_with(queue, ends):
    job_id = queue.add("work", opts=JobOptions(attempts=5))
    _due, [(taken, flat)] = take_jobs(queue, "running", 30_000, now_ms(), 1, "w")
    assert taken == job_id
    assert queue.cancel(job_id, "stop it") is Cancel.STOPPING
    assert queue.cancel(job_id, "again") is Cancel.STOPPING, "flagged once, with the first reason"
    assert queue.get_state(job_id) == "active"
    assert queue.client.get(queue.keys.lock(job_id)) == "running"
    assert queue.get_job(job_id).cancel_reason == "cancelled: stop it"
    assert [e["reason"] for e in events(queue, "cancelling", job_id)] == ["cancelled: stop it"]
    assert queue.scripts.lock_codes(queue.keys, [(job_id, "running")], 30_000) == [2], "the renewal tells"
    assert finish_attempt(queue, job_id, "running", now_ms(), completed=ends == "completed",
                          value='"done"' if ends == "completed" else "boom", default_attempts=1) == 2
    job, state = queue.get_job_with_state(job_id)
    assert (state, job.failed_reason, job.attempts_made, job.returnvalue) == ("failed", "cancelled: stop it", 1, None)
    assert queue.cancel(job_id) is Cancel.FINISHED


def test_a_stalled_cancelled_job_is_failed_by_the_sweep_not_recovered(queue):
    job_id = queue.add("work", opts=JobOptions(attempts=5))
    take_jobs(queue, "dead-worker", 30_000, now_ms(), 1, "w")
    assert queue.cancel(job_id) is Cancel.STOPPING
    kill_lock(queue, job_id)
    sweep(queue)  # marks
    sweep(queue)  # would recover
    job, state = queue.get_job_with_state(job_id)
    assert (state, job.failed_reason, job.attempts_made) == ("failed", "cancelled", 1)
    assert queue.retry(job_id) is True
    assert queue.get_job(job_id).cancel_reason is None, "a retry forgets the cancel"
    assert make_worker(queue, lambda job: "ran").run(burst=True) == 1
    assert queue.get_state(job_id) == "completed"


def test_finished_or_unknown_jobs_are_not_cancelled(queue):
    done = queue.add("work")
    make_worker(queue, lambda job: "ok").run(burst=True)
    assert queue.cancel(done) is Cancel.FINISHED and not queue.cancel(done)
    assert queue.get_state(done) == "completed"
    assert queue.cancel("no-such-job") is Cancel.NOT_FOUND and not queue.cancel("no-such-job")
    assert queue.counts()["failed"] == 0


def test_a_cancelled_job_can_be_retried_and_then_runs(queue):
    job_id = queue.add("work", {"n": 21}, opts=JobOptions(delay_ms=60_000))
    assert queue.cancel(job_id, "changed my mind")
    assert queue.retry(job_id) is True
    job, state = queue.get_job_with_state(job_id)
    assert state == "wait"
    assert (job.failed_reason, job.finished_on) == (None, None)
    assert make_worker(queue, lambda job: job.data["n"] * 2).run(burst=True) == 1
    job, state = queue.get_job_with_state(job_id)
    assert (state, job.returnvalue, job.attempts_made) == ("completed", 42, 1)


def test_cancel_racing_a_worker_leaves_every_job_completed_or_cancelled(queue):
    jobs_n = 20
    ids = queue.add_bulk([NewJob("work", {"n": n}) for n in range(jobs_n)])
    ran, guard = [], threading.Lock()

    def handler(job):
        with guard:
            ran.append(job.id)
        return job.data["n"]

    worker = make_worker(queue, handler, concurrency=2)
    cancelled: list[str] = []
    barrier = threading.Barrier(2)

    def run_worker():
        barrier.wait(5)
        worker.run()

    def cancel_all():
        barrier.wait(5)
        cancelled.extend(job_id for job_id in ids if queue.cancel(job_id, "raced"))

    threads = [threading.Thread(target=run_worker, daemon=True), threading.Thread(target=cancel_all, daemon=True)]
    for thread in threads:
        thread.start()
    threads[1].join(10)
    assert wait_until(lambda: queue.counts()["completed"] + queue.counts()["failed"] == jobs_n, 10), queue.counts()
    worker.stop()
    threads[0].join(10)
    assert not any(thread.is_alive() for thread in threads)

    states = {job_id: queue.get_state(job_id) for job_id in ids}
    completed = {job_id for job_id, state in states.items() if state == "completed"}
    failed = {job_id for job_id, state in states.items() if state == "failed"}
    assert completed | failed == set(ids), f"lost: {set(ids) - completed - failed}"
    assert failed == set(cancelled) and len(cancelled) == len(failed)
    assert len(ran) == len(set(ran)) and completed <= set(ran), "each job ran at most once, a completed one once"
    for job_id in ids:
        job = queue.get_job(job_id)
        kinds = {f["event"] for f in (fields for _i, fields in queue.client.xrange(queue.keys.events)
                                      if fields["jobId"] == job_id)}
        if job_id in completed:
            assert (job.failed_reason, job.returnvalue) == (None, job.data["n"])
            assert "cancelled" not in kinds and "completed" in kinds
        elif job_id in ran:  # cancelled while it ran: flagged, and its attempt failed for good
            assert (job.failed_reason, job.attempts_made) == ("cancelled: raced", 1)
            assert "cancelling" in kinds and "completed" not in kinds
        else:
            assert (job.failed_reason, job.attempts_started, job.processed_on) == ("cancelled: raced", 0, None)
            assert "cancelled" in kinds and "completed" not in kinds and "active" not in kinds
    counts = queue.counts()
    assert (counts["completed"], counts["failed"]) == (len(completed), len(failed))
    assert sum(counts.values()) == jobs_n


# -- promote ---------------------------------------------------------------


def test_a_promoted_job_is_ready_at_once_and_runs_before_its_due_time(queue):
    now = now_ms()
    job_id = queue.add("work", opts=JobOptions(delay_ms=60_000), timestamp_ms=now)
    later = queue.add("work", opts=JobOptions(delay_ms=60_000), timestamp_ms=now)
    assert queue.promote(job_id) is True
    assert queue.get_state(job_id) == "wait"
    assert queue.get_state(later) == "delayed", "nothing else moves"
    assert len(events(queue, "promoted", job_id)) == 1
    assert make_worker(queue, lambda job: "early").run(burst=True) == 1
    job, state = queue.get_job_with_state(job_id)
    assert (state, job.returnvalue) == ("completed", "early")
    assert job.finished_on < now + 60_000
    assert queue.promote(job_id) is False, "no longer delayed"


def test_promote_moves_only_the_given_job_even_when_others_are_due(queue):
    now = now_ms()
    due = queue.add("work", opts=JobOptions(delay_ms=1000), timestamp_ms=now - 10_000)
    chosen = queue.add("work", opts=JobOptions(delay_ms=60_000))
    assert queue.promote(chosen)
    assert (queue.get_state(chosen), queue.get_state(due)) == ("wait", "delayed")


def test_a_promoted_job_goes_where_a_ready_job_would(queue):
    high = queue.add("work", opts=JobOptions(delay_ms=60_000, priority=9))
    assert queue.promote(high)
    assert queue.get_state(high) == "prioritized"
    queue.pause()
    plain = queue.add("work", opts=JobOptions(delay_ms=60_000))
    assert queue.promote(plain)
    assert queue.get_state(plain) == "paused"


def test_a_job_that_is_not_delayed_is_not_promoted(queue):
    waiting = queue.add("work")
    assert queue.promote(waiting) is False
    assert queue.get_state(waiting) == "wait"
    assert queue.client.llen(queue.keys.wait) == 1, "not pushed a second time"
    assert queue.promote("no-such-job") is False
    _due, [(active, _flat)] = take_jobs(queue, "t", 30_000, now_ms(), 1, "w")
    assert queue.promote(active) is False
    assert queue.get_state(active) == "active"
    assert events(queue, "promoted", waiting) == []
