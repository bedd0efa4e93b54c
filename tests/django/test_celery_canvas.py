"""Celery's canvas on echomq: `|`, link and link_error on single tasks, partial calls, map/starmap/chunks, routes."""

import pytest
from django.core import checks

from echomq_django import jobs
from echomq_django.celery import GroupResult, chain, chord, chunks, group, shared_task, signature
from echomq_django.core import PayloadError, Queue, WorkflowError
from echomq_django.testing import run_jobs

pytestmark = pytest.mark.django_db(transaction=True)
CALLS: list = []


@pytest.fixture
def queues(settings, redis_url, prefix, redis_client, monkeypatch):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "mail": {}}}
    monkeypatch.setattr(jobs.registry, "_registry", dict(jobs.registered_jobs()))
    CALLS.clear()
    return {name: Queue(name, redis_client, prefix=prefix) for name in ("default", "mail")}


def tasks():
    add = shared_task(name="cv.add")(lambda x, y=0: x + y)
    mul = shared_task(name="cv.mul")(lambda x, y: x * y)
    tsum = shared_task(name="cv.tsum")(lambda numbers: sum(numbers))
    record = shared_task(name="cv.record")(_record)
    fail = shared_task(name="cv.fail")(_fail)
    return add, mul, tsum, record, fail


def _record(*args):
    CALLS.append(list(args))
    return args[0] if args else None


def _fail(*args):
    raise ValueError("failed on purpose")


@shared_task(name="cv.errback")
def errback(request, exc, traceback):
    CALLS.append(["errback", request.id, type(exc).__name__, str(exc)])


def test_pipe_chains_and_group_pipe_is_a_chord(queues):
    add, mul, tsum, _, _ = tasks()
    result = (add.s(2, 2) | mul.s(8) | add.s(1)).delay()
    group_then = (group(add.s(i, i) for i in range(4)) | tsum.s()).delay()
    run_jobs()
    assert result.get(timeout=5) == 33 and result.parent.get(timeout=5) == 32
    assert group_then.get(timeout=5) == 12
    assert isinstance(group_then.parent, GroupResult) and group_then.parent.get(timeout=5) == [0, 2, 4, 6]


def test_call_time_arguments_to_a_partial_chain_group_and_chord(queues):
    add, mul, tsum, _, _ = tasks()
    partial_chain = chain(add.s(), mul.s(3)).delay(2)  # add(2) -> mul(2, 3)
    partial_group = group(add.s(1), add.s(10)).delay(5)  # add(5, 1), add(5, 10)
    partial_chord = chord([add.s(1), add.s(2)], tsum.s()).apply_async((3,))
    immutable = chain(add.si(7), mul.s(2)).delay(100)  # an immutable first step keeps its own
    run_jobs()
    assert partial_chain.get(timeout=5) == 6
    assert isinstance(partial_group, GroupResult) and partial_group.get(timeout=5) == [6, 15]
    assert partial_group.completed_count() == 2 and partial_group.ready() and partial_group.successful()
    assert partial_chord.get(timeout=5) == 9
    assert immutable.get(timeout=5) == 14


def test_link_on_a_single_task_runs_once_with_the_result(queues):
    add, _, _, record, _ = tasks()
    result = add.apply_async((2, 3), link=[record.s("a"), record.si("b")])
    run_jobs()
    assert result.get(timeout=5) == 5  # the task's own result, not its callbacks'
    assert sorted(CALLS, key=str) == sorted([[5, "a"], ["b"]], key=str)


def test_link_error_gets_request_exc_and_traceback_or_only_its_own_arguments(queues):
    _, _, _, record, fail = tasks()
    failed = fail.apply_async((1,), link=record.s("never"), link_error=[errback.s(), record.si("own")])
    run_jobs()
    assert failed.failed()
    assert sorted(CALLS, key=str) == sorted([["errback", failed.id, "ValueError", "failed on purpose"], ["own"]],
                                            key=str)
    with pytest.raises(ValueError, match="failed on purpose"):
        failed.get(timeout=5)


def test_a_groups_link_error_runs_for_each_failing_member(queues):
    add, _, _, _, fail = tasks()
    flow = group(add.s(1, 1), fail.s(), fail.s())
    flow.link_error(errback.s())
    result = flow.delay()
    run_jobs()
    errbacks = [call for call in CALLS if call[0] == "errback"]
    assert sorted(call[1] for call in errbacks) == sorted([result[1].id, result[2].id])
    assert result[0].get(timeout=5) == 2 and result.failed()


def test_a_chain_failure_reaches_the_last_result_and_the_chains_errback_once(queues):
    add, mul, _, _, fail = tasks()
    result = chain(add.s(1, 1), fail.s(), mul.s(2)).on_error(errback.s()).delay()
    run_jobs()
    with pytest.raises(ValueError, match="failed on purpose"):
        result.get(timeout=5)
    assert len([call for call in CALLS if call[0] == "errback"]) == 1


def test_map_starmap_and_chunks(queues):
    add, _, tsum, _, _ = tasks()
    mapped = tsum.map([[1, 2], [3, 4]]).delay()
    starred = add.starmap([(1, 2), (3, 4)]).delay()
    chunked = add.chunks(zip(range(10), range(10)), 3).delay()
    spelled = chunks(add, [(1, 1)], 1).group().delay()
    in_a_chain = (add.s(1, 1) | add.map([5, 6]).set(immutable=True)).delay()
    run_jobs()
    assert mapped.get(timeout=5) == [3, 7]
    assert starred.get(timeout=5) == [3, 7]
    assert chunked.get(timeout=5) == [[0, 2, 4], [6, 8, 10], [12, 14, 16], [18]]
    assert spelled.get(timeout=5) == [[2]]
    assert in_a_chain.get(timeout=5) == [5, 6]
    with pytest.raises(PayloadError, match="chunk size"):
        add.chunks([(1, 1)], 0)


def test_signature_by_name_and_options(queues):
    add, _, _, _, _ = tasks()
    result = signature("cv.add", (1, 2), queue="mail", countdown=0).delay()
    assert result.queue.name == "mail"
    run_jobs()
    assert result.get(timeout=5) == 3
    assert add.s(1)(2) == 3  # a signature called runs here, the call's arguments first
    with pytest.raises(WorkflowError, match="eta"):
        from datetime import UTC, datetime

        chain(add.s(1).set(eta=datetime.now(UTC)), add.s(2)).delay()


def test_task_routes_dict_glob_and_router(queues, settings):
    settings.ECHOMQ = {**settings.ECHOMQ, "TASK_ROUTES": {"cv.mul": {"queue": "mail"}, "cv.t*": "mail"}}
    add, mul, tsum, _, _ = tasks()
    own = shared_task(name="cv.own", queue="default")(lambda: 1)
    assert mul.delay(1, 2).queue.name == "mail" and tsum.delay([1]).queue.name == "mail"
    assert add.delay(1).queue.name == "default" and own.delay().queue.name == "default"
    assert mul.apply_async((1, 2), queue="default").queue.name == "default"  # the call's queue wins
    assert chain(mul.s(1, 2), add.s()).delay().parent.queue.name == "mail"
    settings.ECHOMQ = {**settings.ECHOMQ, "TASK_ROUTES": ["tests.django.test_celery_canvas.route_adds"]}
    assert add.delay(1).queue.name == "mail" and mul.delay(1, 2).queue.name == "default"


def route_adds(name, args, kwargs, options, task=None, **kw):
    return {"queue": "mail"} if name == "cv.add" else None


def test_task_routes_are_checked(settings, redis_url):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "QUEUES": {"default": {}},
                       "TASK_ROUTES": {"a.b": {"queue": "default", "routing_key": "x"}}}
    messages = [error.msg for error in checks.run_checks() if error.id == "echomq.E025"]
    assert any("routing_key" in message for message in messages)
    settings.ECHOMQ = {"REDIS_URL": redis_url, "QUEUES": {"default": {}},
                       "TASK_ROUTES": {"a.b": {"queue": "nowhere"}}}
    messages = [error.msg for error in checks.run_checks() if error.id == "echomq.E025"]
    assert any("nowhere" in message for message in messages)
    for route, said in (({"queue": "default", "priority": 500}, "priority"), ({"queue": ""}, "queue's name")):
        settings.ECHOMQ = {"REDIS_URL": redis_url, "QUEUES": {"default": {}}, "TASK_ROUTES": {"a.b": route}}
        messages = [error.msg for error in checks.run_checks() if error.id == "echomq.E025"]
        assert any(said in message for message in messages), messages
    settings.ECHOMQ = {"REDIS_URL": redis_url, "QUEUES": {"default": {}}, "TASK_ROUTES": "no.such.router"}
    messages = [error.msg for error in checks.run_checks() if error.id == "echomq.E025"]
    assert any("no.such.router" in message for message in messages)


def test_a_task_id_that_is_another_jobs_is_refused_and_nothing_waits_for_it(queues):
    """A caller's id used again (Celery's task_id) in a workflow: the step would never be added nor end, and its
    callback would wait in `deferred` for good (BullMQ's parents stuck in waiting-children). Refused, nothing sent."""
    add, _, _, record, _ = tasks()
    add.apply_async((1, 1), task_id="order-7")
    with pytest.raises(WorkflowError, match="job id 'order-7' is another job's"):
        add.apply_async((2, 2), task_id="order-7", link=record.s())
    assert queues["default"].counts()["deferred"] == 0
    # The same refusal inside the script, for an id taken between the check and the add: the call writes nothing.
    from redis.exceptions import ResponseError

    from echomq_django.core import Plan
    from echomq_django.signatures import expand_links

    plan = Plan.of(expand_links(chain(add.s(3).set(task_id="order-8"), record.s())))
    add.apply_async((4, 4), task_id="order-8")
    home = plan.home
    with pytest.raises(ResponseError, match="TAKEN job id order-8 is another job's"):
        home.scripts.run_confirmed([plan._call(home, plan.steps, True, "0.0")], home.confirm, raise_on_error=True)
    assert queues["default"].counts()["deferred"] == 0
    assert home.client.exists(home.keys.workflow(plan.id)) == 0, "not even the record"
