"""A call whose reply was lost is sent again: every such re-send must change nothing.

Each test sends the very same script call twice through the real scripts, as
redis-py does after a cut connection. (tests/system/test_chaos.py does it with real
lost replies through a proxy.)
"""

import json

from echomq_django.core import JobOptions, NewJob
from echomq_django.core.producing.queue import now_ms
from echomq_django.core.protocol.scripts import CHANGE_RECORD_MS, change_token
from tests.helpers import fail_jobs, fetch, finish, renew_lock


def send_twice(queue, call):
    first = queue.scripts.run_batch([call], raise_on_error=True)[0]
    again = queue.scripts.run_batch([call], raise_on_error=True)[0]
    return first, again


def test_a_resent_add_with_generated_ids_adds_nothing(queue):
    jobs = [queue.encode(NewJob("work", {"n": n})) for n in range(3)]
    first, again = send_twice(queue, queue.scripts.add_jobs_call(queue.keys, now_ms(), jobs))
    assert first == again == ["q.1", 1, "q.2", 1, "q.3", 1]
    assert queue.counts()["wait"] == 3
    assert queue.client.get(queue.keys.id_counter) == "3"
    # A new call (a new add token) adds again, as a new add must.
    assert queue.add("work") == "q.4"


def test_a_resent_add_record_lapses_and_the_ids_of_caller_given_adds_need_none(queue):
    call = queue.scripts.add_jobs_call(queue.keys, now_ms(), [queue.encode(NewJob("work", job_id="mine"))])
    send_twice(queue, call)
    assert queue.counts()["wait"] == 1
    assert not queue.client.exists(call[1][7]), "no record when no id was generated"
    generated = queue.scripts.add_jobs_call(queue.keys, now_ms(), [queue.encode(NewJob("work"))])
    queue.scripts.run_batch([generated])
    assert 0 < queue.client.pttl(generated[1][7]) <= 30_000


def sent(queue, job_id, timestamp, sent_ms=60_000):
    """An outbox's send of one job: a new call each time (a row sent twice is two calls, two add tokens)."""
    [call] = queue.add_calls([queue.encode(NewJob("work", {"id": job_id}, job_id=job_id))], timestamp,
                             sent_ms=sent_ms)
    [reply] = queue.scripts.run_batch([call], raise_on_error=True)
    return reply


def test_a_job_sent_twice_with_a_record_is_added_once_even_after_it_ended_and_was_removed(queue):
    now = now_ms()
    assert sent(queue, "t1", now) == ["t1", 1]
    assert queue.client.zscore(queue.keys.sent, f"t1:{now}") == now + 60_000
    assert queue.remove("t1")  # as retention trims a completed job
    assert sent(queue, "t1", now) == ["t1", 0], "the record keeps a second send out"
    assert queue.get_job("t1") is None and queue.counts()["wait"] == 0
    # Another send of the id (another row, enqueued later), like an add without a record, adds it again.
    assert sent(queue, "t1", now + 1) == ["t1", 1] and queue.counts()["wait"] == 1
    assert queue.remove("t1")
    assert queue.add("work", job_id="t1") == "t1" and queue.counts()["wait"] == 1


def test_lapsed_sent_records_are_removed_by_later_sends_a_bounded_number_at_a_time(queue):
    now = now_ms()
    for n in range(250):
        sent(queue, f"old{n}", now - 10_000, sent_ms=1_000)  # lapsed 9 s ago
    assert queue.client.zcard(queue.keys.sent) == 250
    sent(queue, "new", now)
    assert queue.client.zcard(queue.keys.sent) == 250 + 1 - 102, "one job's send removes 2 + 100"
    sent(queue, "newer", now)
    sent(queue, "newest", now)
    kept = {f"{job_id}:{now}" for job_id in ("new", "newer", "newest")}
    assert set(queue.client.zrange(queue.keys.sent, 0, -1)) == kept
    assert sent(queue, "old1", now) == ["old1", 0], "its job is still there"


def test_a_resent_fetch_returns_the_same_jobs_and_takes_no_more(queue):
    ids = queue.add_bulk([NewJob("work") for _ in range(5)])
    call = queue.scripts.fetch_call(queue.keys, "tok-1", 30_000, now_ms(), 2, "w1")
    first, again = (queue.scripts.fetched(reply)[2] for reply in send_twice(queue, call))
    assert [job_id for job_id, _ in first] == [job_id for job_id, _ in again] == ids[:2]
    assert queue.counts()["active"] == 2 and queue.counts()["wait"] == 3
    for job_id in ids[:2]:
        attempts_started, wids = queue.client.hmget(queue.keys.job(job_id), "ats", "wids")
        assert attempts_started == "1" and json.loads(wids) == ["w1"], "the re-send started no second attempt"


def test_a_resent_fetch_leaves_out_jobs_the_token_no_longer_owns_and_a_finish_ends_the_record(queue):
    ids = queue.add_bulk([NewJob("work", opts=JobOptions(attempts=1)) for _ in range(2)])
    call = queue.scripts.fetch_call(queue.keys, "tok-1", 30_000, now_ms(), 2, "w1")
    queue.scripts.run_batch([call])
    queue.client.hdel(queue.keys.job(ids[0]), "tok")  # as if the sweeper had recovered it
    [reply] = queue.scripts.run_batch([call])
    assert [job_id for job_id, _ in queue.scripts.fetched(reply)[2]] == [ids[1]]
    finish(queue, ids[1], "tok-1")
    assert not queue.client.exists(queue.keys.fetch_record("tok-1"))


def test_a_renewal_racing_its_own_finish_is_not_a_lost_lock(queue):
    job_id = queue.add("work")
    fetch(queue, token="tok-1")
    finish(queue, job_id, "tok-1")
    assert queue.scripts.lock_codes(queue.keys, [(job_id, "tok-1")], 30_000) == [0], "finished by this token"
    assert not renew_lock(queue, job_id, "tok-1", 30_000), "nothing was renewed"
    assert not queue.client.exists(queue.keys.lock(job_id))
    # Another token's renewal of the same finished job is a real loss.
    assert queue.scripts.lock_codes(queue.keys, [(job_id, "tok-2")], 30_000) == [-1], "lost"



def test_a_resent_retry_answers_as_the_first_and_does_not_retry_a_job_that_failed_again(queue):
    [job_id] = fail_jobs(queue, 1)
    call = queue.scripts.retry_call(queue.keys, job_id, change_token())
    assert queue.scripts.run_batch([call]) == [1]
    # Between the send and its re-send, the job ran and failed again: the re-send must leave it failed.
    [(taken, _)] = fetch(queue, token="again")
    assert taken == job_id
    finish(queue, job_id, "again", completed=False, value="boom again")
    assert queue.get_state(job_id) == "failed"
    assert queue.scripts.run_batch([call]) == [1], "the re-send answers as the first call did"
    assert queue.get_state(job_id) == "failed", "the re-send sent a job back a second time"
    # Another round trip (a new token) retries it, as a new retry must.
    assert queue.scripts.run_batch([queue.scripts.retry_call(queue.keys, job_id, change_token())]) == [1]


def test_a_resent_remove_answers_as_the_first_and_its_record_lapses(queue):
    job_id = queue.add("work")
    token = change_token()
    first, again = send_twice(queue, queue.scripts.remove_call(queue.keys, job_id, token))
    assert first == again == 1, "the re-send said the job it removed was never there"
    assert queue.get_job(job_id) is None
    assert queue.client.hgetall(queue.keys.change_record(token)) == {job_id: "1"}
    assert 0 < queue.client.pttl(queue.keys.change_record(token)) <= CHANGE_RECORD_MS


def test_a_resent_cancel_of_a_running_job_that_ended_meanwhile_still_says_it_stops_it(queue):
    job_id = queue.add("work", opts=JobOptions(attempts=1))
    fetch(queue, token="runner")
    call = queue.scripts.cancel_call(queue.keys, job_id, "cancelled", now_ms(), change_token())
    assert queue.scripts.run_batch([call]) == [2]
    finish(queue, job_id, "runner")  # its worker saw the flag: the attempt fails for good with the reason
    assert queue.get_state(job_id) == "failed"
    assert queue.scripts.run_batch([call]) == [2], "the re-send counted the job it flagged as finished already"


def test_a_resent_cancel_does_not_cancel_a_job_retried_meanwhile(queue):
    job_id = queue.add("work")
    call = queue.scripts.cancel_call(queue.keys, job_id, "cancelled", now_ms(), change_token())
    assert queue.scripts.run_batch([call]) == [1]
    assert queue.retry(job_id)
    assert queue.scripts.run_batch([call]) == [1]
    assert queue.get_state(job_id) == "wait", "the re-send cancelled the retried job again"


def test_a_round_trip_answers_each_of_its_jobs_once_and_a_job_named_twice_is_changed_once(queue):
    ids = fail_jobs(queue, 3)
    outcome = queue.retry_many([ids[0], ids[1], ids[0], ids[2]])
    assert outcome.done == ids and outcome.gone == [ids[0]]
    assert queue.counts()["wait"] == 3
