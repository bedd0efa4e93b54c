"""A real browser: headless Chromium logs into the admin, retries failed jobs and checks that the lists fit."""

import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from tests.django.test_admin import failed_job, stalled_jobs
from tests.helpers import fetch, kill_lock

SCREENSHOTS = Path(__file__).resolve().parents[2] / ".artifacts"
DOCS = Path(__file__).resolve().parents[2] / "docs"
WIDTH = 1400
# What operators' jobs look like: dotted function paths and reasons with long unbroken words.
LONG_NAME = "demo_project.demo_app.jobs.reconcile_the_quarterly_ledger_of_every_subsidiary"
LONG_REASON = ("IntegrityError: duplicate key value violates unique constraint "
               "ledger_entries_subsidiary_id_quarter_account_reference_currency_key " * 2)


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extras")
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        message = "needs Debian's chromium and chromium-driver packages (.ci/run installs them)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--window-size={WIDTH},900"):
        options.add_argument(flag)
    session = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver), options=options)
    session.implicitly_wait(5)
    yield session
    session.quit()


def log_in(browser, live_server, next_url: str) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("operator", password="a-long-password")
    browser.get(f"{live_server.url}/admin/login/?next={next_url}")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys("a-long-password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()


def screenshot(browser, name: str, *, docs: bool = False) -> None:
    """Save a screenshot under .artifacts/; with ECHOMQ_DOCS_SCREENSHOTS=1, docs/admin.md's copy in docs/ too."""
    SCREENSHOTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOTS / name))
    if docs and os.environ.get("ECHOMQ_DOCS_SCREENSHOTS") == "1":
        assert browser.save_screenshot(str(DOCS / name))


@pytest.mark.slow
def test_an_operator_retries_a_failed_job_in_a_real_browser(browser, live_server, echomq_settings, queue,
                                                           transactional_db):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    job_id = failed_job(queue, reason="card declined <b>twice</b>", name="charge")
    log_in(browser, live_server, "/admin/echomq/failedjob/")

    assert "card declined <b>twice</b>" in browser.find_element(By.ID, "result_list").text, "shown as text"
    browser.find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("retry_selected")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()

    assert "1 job(s) sent back to wait" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    screenshot(browser, "admin-failed-set-retried.png")
    assert queue.get_state(job_id) == "wait"


@pytest.mark.slow
def test_an_operator_retries_a_job_from_its_page(browser, live_server, echomq_settings, queue, transactional_db):
    from selenium.webdriver.common.by import By

    job_id = failed_job(queue, reason="gateway timeout", name="charge")
    log_in(browser, live_server, "/admin/echomq/failedjob/")
    browser.find_element(By.LINK_TEXT, job_id).click()
    assert browser.current_url.endswith(f"/admin/echomq/failedjob/q/{job_id}/")
    assert "2023-11-14 22:13:20 UTC" in browser.find_element(By.CSS_SELECTOR, "table.echomq-job").text
    screenshot(browser, "admin-failed-job-page.png")
    browser.find_element(By.CSS_SELECTOR, "input[value=Retry]").click()
    assert f"Job {job_id} of q sent back to wait" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert queue.get_state(job_id) == "wait"


def overflow(browser) -> dict:
    """How the result table sits in a 1,400 px window: its right edge, and whether its box scrolls."""
    return browser.execute_script("""
        const table = document.getElementById("result_list");
        const box = table.closest(".results");
        const last = table.querySelector("thead th:last-child");
        return {window: document.documentElement.clientWidth, table: table.getBoundingClientRect().right,
                last: last.getBoundingClientRect().right, scrolls: box.scrollWidth > box.clientWidth,
                page: document.documentElement.scrollWidth};""")


@pytest.mark.slow
@pytest.mark.parametrize("model, column", [("failedjob", "finished at"), ("stalledjob", "next sweep will")])
def test_the_lists_fit_a_1400_px_window_with_every_column_in_sight(browser, live_server, echomq_settings, queue,
                                                                   transactional_db, model, column):
    from selenium.webdriver.common.by import By

    for _ in range(3):
        failed_job(queue, name=LONG_NAME, reason=LONG_REASON)
    long_one = queue.add(LONG_NAME, {"n": 1}, job_id="x" * 128)
    fetch(queue, token="another")
    kill_lock(queue, long_one)
    stalled_jobs(queue, 3, 1)  # marks these and the long one
    log_in(browser, live_server, f"/admin/echomq/{model}/")
    screenshot(browser, f"admin-{model}-{WIDTH}px.png")
    header = browser.find_element(By.CSS_SELECTOR, "#result_list thead").text.lower()
    assert column in header
    cells = browser.find_elements(By.CSS_SELECTOR, "td.field-dotted_name")
    assert LONG_NAME in [cell.get_attribute("textContent") for cell in cells], "shown whole, dots included"
    sizes = overflow(browser)
    assert not sizes["scrolls"] and sizes["last"] <= sizes["window"] and sizes["page"] <= sizes["window"], sizes


def run_a_known_day(queue) -> dict[str, list[str]]:
    """Jobs that report progress and log, some that fail, a sweep's sample, and some still waiting."""
    from echomq_django.core import JobOptions, Worker, WorkerOptions
    from echomq_django.queues import make_sweeper

    def handler(job):
        if job.name == "doomed":
            raise ValueError("the input is malformed <b>")
        for row in range(1, 4):
            job.log(f"imported row {row} of 3")
            job.update_progress({"percent": round(100 * row / 3), "rows": row})
        job.log("note from the customer file: <script>alert(1)</script>")
        return row

    done = [queue.add("import_rows", {"n": n}) for n in range(6)]
    doomed = [queue.add("doomed", opts=JobOptions(attempts=1)) for _ in range(2)]
    worker = Worker(queue.name, handler, queue.client, WorkerOptions(prefix=queue.keys.prefix, block_timeout_s=0.2))
    assert worker.run(burst=True) == 8
    waiting = [queue.add("later", {"n": n}) for n in range(3)]
    sweeper = make_sweeper([queue.name], long_running=False)
    sweeper.sweep(sweeper.targets[0], force=True)  # samples the waiting depth
    return {"completed": done, "failed": doomed, "wait": waiting}


def series_points(browser) -> dict[str, int]:
    """Data points per series kind in the charts on the page."""
    from selenium.webdriver.common.by import By

    points: dict[str, int] = {}
    for line in browser.find_elements(By.CSS_SELECTOR, "svg polyline.echomq-series"):
        kind = next(c for c in line.get_attribute("class").split() if c.startswith("echomq-series-"))
        points[kind] = points.get(kind, 0) + int(line.get_attribute("data-points"))
    return points


def colours(browser) -> tuple[str, str]:
    """The completed line's stroke colour and the page background, as the browser computed them."""
    return tuple(browser.execute_script("""
        const line = document.querySelector("polyline.echomq-series-completed");
        return [getComputedStyle(line).stroke, getComputedStyle(document.body).backgroundColor];"""))


@pytest.mark.slow
def test_an_operator_sees_the_charts_a_state_list_and_a_job_with_its_progress_and_logs(
        browser, live_server, echomq_settings, queue, transactional_db):
    from selenium.webdriver.common.by import By

    jobs = run_a_known_day(queue)
    log_in(browser, live_server, "/admin/echomq/queue/?refresh=0")
    charts = browser.find_elements(By.CSS_SELECTOR, "section.echomq-queue-charts svg")
    assert len(charts) == 2, "throughput and waiting depth"
    points = series_points(browser)
    assert points["echomq-series-completed"] > 0 and points["echomq-series-failed"] > 0, points
    assert points["echomq-series-waiting"] > 0, points
    light_line, light_page = colours(browser)
    screenshot(browser, "admin-dashboard.png", docs=True)
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia",
                            {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    browser.refresh()
    dark_line, dark_page = colours(browser)
    assert light_line != light_page and dark_line != dark_page and light_page != dark_page, \
        (light_line, light_page, dark_line, dark_page)
    screenshot(browser, "admin-dashboard-dark.png")
    browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})

    browser.find_element(By.CSS_SELECTOR, "a[href$='/q/completed/']").click()  # the completed count
    listed = browser.find_element(By.CSS_SELECTOR, "#content-main table").text
    assert all(job_id in listed for job_id in jobs["completed"]) and "import_rows" in listed
    screenshot(browser, "admin-job-list.png", docs=True)

    browser.find_element(By.LINK_TEXT, jobs["completed"][0]).click()
    page = browser.find_element(By.ID, "content-main").text
    assert "imported row 3 of 3" in page and "file: <script>alert(1)</script>" in page, "log lines, as text"
    assert '"percent": 100' in page and "Log (4 lines)" in page
    browser.set_window_size(WIDTH, browser.execute_script("return document.documentElement.scrollHeight") + 150)
    screenshot(browser, "admin-job-page.png", docs=True)  # the whole page, progress and log included
