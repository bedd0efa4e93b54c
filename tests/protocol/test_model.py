"""A model-based test: Hypothesis drives the real scripts through random interleavings of every
operation and, after each step, checks the protocol's invariants against a plain Python model."""

import uuid
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from echomq_django.core import JobLockedError, JobOptions, LockLostError, Queue, Sweeper, connect
from echomq_django.core.producing.queue import now_ms
from tests.conftest import current_redis_url
from tests.helpers import finish_attempt, kill_lock, renew_lock, take_jobs

MAX_STALLED = 1


@dataclass
class ModelJob:
    state: str
    attempts: int
    priority: int
    atm: int = 0
    stc: int = 0
    owner: str | None = None  # token that owns the job while active
    lock_alive: bool = False
    marked: bool = False
    finished_by: str | None = None  # the token whose finish was last applied (a replay of it is harmless)

    def ready_state(self, paused: bool) -> str:
        if self.priority:
            return "prioritized"
        return "paused" if paused else "wait"


class QueueMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.client = connect(current_redis_url())
        self.queue = Queue("m", self.client, prefix=f"m{uuid.uuid4().hex[:10]}")
        self.sweeper = Sweeper(self.client, ["m"], prefix=self.queue.keys.prefix, max_stalled_count=MAX_STALLED,
                               budget=3, scripts=self.queue.scripts)
        self.jobs: dict[str, ModelJob] = {}
        self.stale_tokens: list[tuple[str, str]] = []
        self.paused = False
        self.tokens = 0

    def teardown(self) -> None:
        if hasattr(self, "queue"):
            self.queue.obliterate()
            self.client.close()

    # -- helpers -----------------------------------------------------------

    def in_state(self, state: str) -> list[str]:
        return sorted(job_id for job_id, job in self.jobs.items() if job.state == state)

    def release(self, job: ModelJob, job_id: str) -> None:
        if job.owner:
            self.stale_tokens.append((job_id, job.owner))
        job.owner, job.lock_alive, job.marked = None, False, False

    # -- rules -------------------------------------------------------------

    @rule(priority=st.sampled_from([0, 0, 0, 7, -7]), attempts=st.integers(1, 3))
    def add(self, priority: int, attempts: int) -> None:
        job_id = self.queue.add("w", {}, opts=JobOptions(attempts=attempts, priority=priority))
        job = ModelJob(state="", attempts=attempts, priority=priority)
        job.state = job.ready_state(self.paused)
        self.jobs[job_id] = job

    @rule()
    def fetch(self) -> None:
        self.tokens += 1
        token = f"tok{self.tokens}"
        _due, taken = take_jobs(self.queue, token, 60_000, now_ms(), 1, "w")
        ready = [j for j in self.jobs if self.jobs[j].state in ("wait", "prioritized")]
        if self.paused or not ready:
            assert taken == []
            return
        [(job_id, _fields)] = taken
        job = self.jobs[job_id]
        expected_first = max((self.jobs[j].priority > 0, self.jobs[j].priority == 0) for j in ready)
        assert (job.priority > 0, job.priority == 0) == expected_first, "priority order"
        job.state, job.owner, job.lock_alive = "active", token, True

    @precondition(lambda self: self.in_state("active"))
    @rule(data=st.data())
    def renew(self, data) -> None:
        job_id = data.draw(st.sampled_from(self.in_state("active")))
        job = self.jobs[job_id]
        renewed = renew_lock(self.queue, job_id, job.owner or "nobody", 60_000)
        assert renewed == (job.owner is not None)
        if renewed:
            job.lock_alive, job.marked = True, False

    @precondition(lambda self: any(j.owner for j in self.jobs.values()))
    @rule(data=st.data(), completed=st.booleans())
    def finish(self, data, completed: bool) -> None:
        job_id = data.draw(st.sampled_from(sorted(j for j, job in self.jobs.items() if job.owner)))
        job = self.jobs[job_id]
        finish_attempt(self.queue, job_id, job.owner, now_ms(), completed=completed,
                                            value="1" if completed else "boom", default_attempts=3)
        job.finished_by = job.owner
        self.release(job, job_id)
        job.atm += 1
        if completed:
            job.state = "completed"
        elif job.atm < job.attempts:
            job.state = job.ready_state(self.paused)
        else:
            job.state = "failed"

    @precondition(lambda self: self.stale_tokens)
    @rule(data=st.data())
    def finish_with_a_stale_token(self, data) -> None:
        job_id, token = data.draw(st.sampled_from(self.stale_tokens))
        job = self.jobs.get(job_id)
        if job is None or job.owner == token:
            return
        late = lambda: finish_attempt(  # noqa: E731
            self.queue, job_id, token, now_ms(), completed=True, value='"late"', default_attempts=3)
        if token == job.finished_by:
            assert late() == 5, "a re-sent finish of the same attempt is answered, and changes nothing"
        else:
            with pytest.raises(LockLostError):
                late()
        assert not renew_lock(self.queue, job_id, token, 60_000)

    @precondition(lambda self: any(j.lock_alive for j in self.jobs.values()))
    @rule(data=st.data())
    def lock_expires(self, data) -> None:
        job_id = data.draw(st.sampled_from(sorted(j for j, job in self.jobs.items() if job.lock_alive)))
        kill_lock(self.queue, job_id)
        self.jobs[job_id].lock_alive = False

    @precondition(lambda self: any(j.lock_alive for j in self.jobs.values()))
    @rule()
    def workers_die_and_two_sweeps_pass(self) -> None:
        """The fault the sweep exists for, in one step, so that recoveries are frequent."""
        for job_id, job in self.jobs.items():
            if job.lock_alive:
                kill_lock(self.queue, job_id)
                job.lock_alive = False
        self.forced_sweep()
        self.forced_sweep()

    @rule()
    def forced_sweep(self) -> None:
        self.sweeper.sweep(self.sweeper.targets[0], force=True)
        for job_id, job in self.jobs.items():  # recover phase
            if job.state == "active" and job.marked:
                if job.lock_alive:
                    job.marked = False
                    continue
                self.release(job, job_id)
                job.atm += 1
                job.stc += 1
                ceiling = job.atm >= job.attempts or job.stc > MAX_STALLED
                job.state = "failed" if ceiling else job.ready_state(self.paused)
        for job in self.jobs.values():  # mark phase
            if job.state == "active" and not job.lock_alive:
                job.marked = True

    @precondition(lambda self: self.in_state("failed"))
    @rule(data=st.data())
    def retry(self, data) -> None:
        job_id = data.draw(st.sampled_from(self.in_state("failed")))
        assert self.queue.retry(job_id)
        self.jobs[job_id].state = self.jobs[job_id].ready_state(self.paused)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def remove(self, data) -> None:
        job_id = data.draw(st.sampled_from(sorted(self.jobs)))
        job = self.jobs[job_id]
        if job.lock_alive:
            with pytest.raises(JobLockedError):
                self.queue.remove(job_id)
            return
        assert self.queue.remove(job_id)
        self.release(job, job_id)
        del self.jobs[job_id]

    @rule()
    def pause(self) -> None:
        self.queue.pause()
        self.paused = True
        for job in self.jobs.values():
            if job.state == "wait":
                job.state = "paused"

    @rule()
    def resume(self) -> None:
        self.queue.resume()
        self.paused = False
        for job in self.jobs.values():
            if job.state == "paused":
                job.state = "wait"

    # -- invariants --------------------------------------------------------

    @invariant()
    def every_job_is_in_exactly_its_one_state(self) -> None:
        if not hasattr(self, "queue"):
            return
        keys, client = self.queue.keys, self.client
        lists = {state: client.lrange(getattr(keys, state), 0, -1) for state in ("wait", "paused", "active")}
        sets = {state: set(client.zrange(getattr(keys, state), 0, -1))
                for state in ("prioritized", "delayed", "completed", "failed")}
        for job_id, job in self.jobs.items():
            found = [state for state, ids in lists.items() for _ in range(ids.count(job_id))]
            found += [state for state, ids in sets.items() if job_id in ids]
            assert found == [job.state], f"job {job_id}: Redis has {found}, the model {job.state}"
        assert sum(map(len, lists.values())) + sum(map(len, sets.values())) == len(self.jobs)

    @invariant()
    def marks_are_a_subset_of_active_and_match_the_model(self) -> None:
        if not hasattr(self, "queue"):
            return
        marked = self.queue.stalled_ids()
        assert marked <= set(self.client.lrange(self.queue.keys.active, 0, -1))
        assert marked == {job_id for job_id, job in self.jobs.items() if job.marked}

    @invariant()
    def the_lock_index_holds_exactly_the_active_ids(self) -> None:
        if not hasattr(self, "queue"):
            return
        active = self.client.lrange(self.queue.keys.active, 0, -1)
        scores = dict(self.client.zrange(self.queue.keys.locks, 0, -1, withscores=True))
        assert set(scores) == set(active) and len(scores) == len(active)
        for job_id, score in scores.items():  # a live lock never lapses after its recorded time
            expires_at = self.client.pexpiretime(self.queue.keys.lock(job_id))
            assert expires_at < 0 or expires_at <= score, f"job {job_id}: lock lapses at {expires_at}, index {score}"

    @invariant()
    def attempts_are_exact(self) -> None:
        if not hasattr(self, "queue"):
            return
        for job_id, job in self.jobs.items():
            fields = self.client.hmget(self.queue.keys.job(job_id), "atm", "stc")
            assert (int(fields[0]), int(fields[1])) == (job.atm, job.stc), f"job {job_id}"


QueueMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_the_protocol_keeps_its_invariants = QueueMachine.TestCase
# 7 s on one Redis on a quiet machine; a Cluster on a busy one took more than the default minute.
test_the_protocol_keeps_its_invariants.pytestmark = [pytest.mark.timeout(300)]
