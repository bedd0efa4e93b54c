"""Odd text in the failed list's filters and search: a list page, or Django's "bad filter" redirect, never a 500.

PostgreSQL refuses NUL in a query's text (psycopg raises ValueError when the page is read); SQLite takes it.
"""

import pytest

from echomq_django.mirror import sync_queue
from tests.django.test_admin_bulk import FAILED_LIST, root  # noqa: F401 (a fixture)
from tests.helpers import fail_jobs

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("query", ["?error=a%00b", "?q=a%00b", "?error_class=a%00b", "?name=%00",
                                   "?error=" + "%25_" * 2000, "?error=%ED%A0%80", "?q=%5C%25%27%22"])
def test_the_failed_list_answers_any_filter_text(root, queue, query):  # noqa: F811
    fail_jobs(queue, 1, reason="card a\x00b declined", error_class="shop.errors.CardDeclined")
    sync_queue(queue)
    response = root.get(FAILED_LIST + query)
    assert response.status_code in (200, 302), response.status_code


def test_a_reason_that_held_a_nul_is_found_by_the_same_text(root, queue):  # noqa: F811
    [job_id] = fail_jobs(queue, 1, reason="card a\x00b declined")
    sync_queue(queue)
    assert f">{job_id}</a>" in root.get(FAILED_LIST + "?error=a%00b").content.decode()


@pytest.mark.parametrize("page", ["/admin/echomq/outboxjob/", "/admin/echomq/schedule/"])
@pytest.mark.parametrize("query", ["?q=a%00b", "?queue=%00"])
def test_the_outbox_and_schedule_lists_answer_a_nul_in_their_search_and_filters(root, echomq_settings,  # noqa: F811
                                                                                 page, query):
    response = root.get(page + query)
    assert response.status_code in (200, 302), response.status_code
