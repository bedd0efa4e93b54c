"""A small Celery project's tasks module, moved to echomq by changing its imports (docs/migrating-from-celery.md).

Before, this file began `from celery import group, shared_task` and `from celery.exceptions import
SoftTimeLimitExceeded`; nothing else changed. tests/django/test_celery_project.py runs it through a worker.
"""

from echomq_django.celery import group, shared_task  # was: from celery import ...
from echomq_django.celery.exceptions import SoftTimeLimitExceeded  # was: from celery.exceptions import ...


class GatewayBusy(Exception):
    """The payment provider asks us to come back later."""


class PaymentDeclined(Exception):
    """The card was declined: no retry helps."""


@shared_task
def line_total(price_cents, quantity):
    return price_cents * quantity


@shared_task
def order_total(line_totals):
    return sum(line_totals)


@shared_task(bind=True, max_retries=3, default_retry_delay=1, rate_limit="100/s")
def charge(self, total_cents, card):
    if card == "declined":
        raise PaymentDeclined(f"card declined for {total_cents}")
    if card == "busy-once" and self.request.retries == 0:
        raise self.retry(exc=GatewayBusy("try again"), countdown=0.1)
    return {"charged": total_cents, "attempt": self.request.retries + 1, "queue":
            self.request.delivery_info["routing_key"]}


@shared_task(autoretry_for=(GatewayBusy,), retry_backoff=True, retry_backoff_max=2, max_retries=2)
def reserve_stock(sku):
    return {"reserved": sku}


@shared_task(soft_time_limit=5)
def ship(payment):
    try:
        return {"shipped": True, **payment}
    except SoftTimeLimitExceeded:  # (Celery's pattern: clean up when the soft limit comes)
        return {"shipped": False}


@shared_task(ignore_result=True)
def send_receipt(shipment, email):
    return f"receipt for {shipment['charged']} to {email}"


@shared_task
def refund(request, exc, traceback):
    """An error callback, as Celery 5 calls one: the failed task's request, its exception and traceback."""
    return {"refunded_after": request.id, "error": f"{type(exc).__name__}: {exc}"}


def place_order(lines, card, email, queue=None):
    """What the project's checkout view does: the order's total (a chord), then charge, ship and a receipt; a
    refund if any of it fails for good. `queue`: of the steps that have no route (the demo's)."""
    checkout = (group(line_total.s(price, quantity) for price, quantity in lines) | order_total.s()
                | charge.s(card=card) | ship.s() | send_receipt.s(email))
    return checkout.apply_async(link_error=refund.s(), queue=queue)
