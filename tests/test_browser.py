"""One real browser: headless Chromium logs into the admin, opens the failed set and retries a job."""

import os
import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import User

from tests.test_admin import failed_job

SCREENSHOTS = Path(__file__).resolve().parents[1] / ".artifacts"


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
                 "--window-size=1400,900"):
        options.add_argument(flag)
    session = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver), options=options)
    session.implicitly_wait(5)
    yield session
    session.quit()


@pytest.mark.slow
def test_an_operator_retries_a_failed_job_in_a_real_browser(browser, live_server, echomq_settings, queue,
                                                           transactional_db):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    job_id = failed_job(queue, reason="card declined <b>twice</b>", name="charge")
    User.objects.create_superuser("operator", password="a-long-password")

    browser.get(f"{live_server.url}/admin/login/?next=/admin/echomq/failedjob/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys("a-long-password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()

    assert "card declined <b>twice</b>" in browser.find_element(By.ID, "result_list").text, "shown as text"
    browser.find_element(By.CSS_SELECTOR, "input.action-select").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("retry_selected")
    browser.find_element(By.CSS_SELECTOR, "button[name=index]").click()

    assert "1 job(s) sent back to wait" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    SCREENSHOTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOTS / "admin-failed-set-retried.png"))
    assert queue.get_state(job_id) == "wait"
