"""A small Celery project (demo_project/shop/tasks.py), moved to echomq by changing its imports, run by a worker."""

import pytest
from django.core.management import call_command

from demo_project.shop import tasks
from echomq_django.celery import AsyncResult, chain, chord, states
from echomq_django.core import Queue

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def shop(settings, redis_url, prefix, redis_client):
    settings.ECHOMQ = {"REDIS_URL": redis_url, "PREFIX": prefix, "QUEUES": {"default": {}, "mail": {}},
                       "TASK_ROUTES": {"demo_project.shop.tasks.send_*": {"queue": "mail"}}}
    return {name: Queue(name, redis_client, prefix=prefix) for name in ("default", "mail")}


def work(rounds=8):
    for _ in range(rounds):
        for queue in ("default", "mail"):
            call_command("echomq_worker", "--queue", queue, "--burst", "-v", "0")
        for queue in ("default", "mail"):  # the retries' countdowns, made due now
            from echomq_django.testing import _promote_all

            _promote_all(queue)


def test_an_order_goes_through_charge_ship_and_receipt_with_a_retry(shop):
    receipt = tasks.place_order([(250, 2), (100, 1)], "busy-once", "ada@example.com")
    work()
    assert receipt.get(timeout=10) == "receipt for 600 to ada@example.com"
    shipped = receipt.parent
    assert shipped.get(timeout=10) == {"shipped": True, "charged": 600, "attempt": 2, "queue": "default"}
    assert receipt.queue.name == "mail", "routed by TASK_ROUTES"
    assert [job for job in shop["default"].get_jobs("completed", 0, 100) if job.name.endswith("refund")] == []


def test_a_declined_card_fails_at_once_and_refunds_once(shop):
    receipt = tasks.place_order([(100, 1)], "declined", "bob@example.com")
    work()
    with pytest.raises(tasks.PaymentDeclined, match="card declined for 100"):
        receipt.get(timeout=10)
    assert receipt.state == states.FAILURE
    refunds = [job for job in shop["default"].get_jobs("completed", 0, 100) if job.name.endswith("refund")]
    assert len(refunds) == 1 and refunds[0].returnvalue["error"] == "PaymentDeclined: card declined for 100"
    charged = [job for job in shop["default"].get_jobs("failed", 0, 100) if job.name.endswith("charge")]
    assert len(charged) == 1 and charged[0].attempts_made == 1, "not retried: only self.retry retries"
    assert refunds[0].returnvalue["refunded_after"] == charged[0].id


def test_apply_async_options_and_autoretry_with_backoff(shop):
    later = tasks.reserve_stock.apply_async(("sku-1",), countdown=60, expires=120, queue="mail")
    assert AsyncResult(later.id).state == states.PENDING and shop["mail"].get_state(later.id) == "delayed"
    job = shop["mail"].get_job(later.id)
    assert job.opts.backoff.jitter and job.opts.backoff.max_ms == 2000 and job.opts.attempts == 3
    total = chord([tasks.line_total.s(10, 3), tasks.line_total.s(5, 2)], tasks.order_total.s()).delay()
    both = chain(tasks.line_total.s(7), tasks.order_total.s()).delay(3)  # line_total(3, 7): a partial call
    work()
    assert later.get(timeout=10) == {"reserved": "sku-1"}
    assert total.get(timeout=10) == 40
    with pytest.raises(TypeError):  # order_total(21): sum() of an int, as in Celery
        both.get(timeout=10)
