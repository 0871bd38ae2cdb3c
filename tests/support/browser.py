"""A real Chromium for the console's page tests and screenshots (selenium).

``open_chromium`` starts Debian's headless Chromium through its chromedriver
(``make observability-tools`` installs both); a test that needs it fails with
that command when they are absent, and skips only when ``EQUEUE_SKIP_BROWSER=1``
says so explicitly. ``browser_problems`` reads the browser log for JavaScript
errors and Content-Security-Policy violations; ``wait_round`` waits for the
page to apply a poll round (``document.body.dataset.round``, set by
console.js); ``login`` signs in through the console's login page.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL = "make observability-tools"
SKIP_ENV = "EQUEUE_SKIP_BROWSER"


def require_chromium() -> None:
    """Fail (naming the install command) when Chromium or its driver is missing;
    skip only when ``EQUEUE_SKIP_BROWSER=1``."""
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"{SKIP_ENV}=1: the real-browser tests are skipped")
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} not installed: run `{INSTALL}` (as root), "
            f"or set {SKIP_ENV}=1 to skip the browser tests"
        )


@contextmanager
def open_chromium(window: tuple[int, int] = (1280, 900)) -> Iterator[webdriver.Chrome]:
    """A headless Chromium (WebDriver), quit on exit; its console log is kept
    at level ALL so ``browser_problems`` sees errors and CSP reports."""
    require_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        f"--window-size={window[0]},{window[1]}", "--hide-scrollbars",
    ):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_window_size(*window)
        driver.set_page_load_timeout(30)
        yield driver
    finally:
        driver.quit()


PROBLEM_MARKERS = ("Content Security Policy", "Content-Security-Policy", "Uncaught")
"""Messages that are problems whatever their level."""


API_REFUSAL = re.compile(r"/api/v1/\S* - Failed to load resource: .* status of 4\d\d")
"""An API answer 4xx (a topic not found, a token refused): the page shows it."""


def browser_problems(driver: WebDriver) -> list[str]:
    """JavaScript errors and CSP violations logged since the last call (the
    log is drained by reading it). Not problems: /favicon.ico, and the JSON
    API answering 4xx (Chrome logs each as an error; the page shows them)."""
    problems = []
    entries: list[dict[str, Any]] = driver.get_log("browser")  # type: ignore[attr-defined]  # Chrome only
    for entry in entries:
        message = str(entry.get("message", ""))
        if "favicon.ico" in message or API_REFUSAL.search(message):
            continue
        if entry.get("level") == "SEVERE" or any(m in message for m in PROBLEM_MARKERS):
            problems.append(f"{entry.get('level')}: {message}")
    return problems


def current_round(driver: WebDriver) -> int:
    value = driver.execute_script("return document.body ? document.body.dataset.round : null")
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def wait_round(driver: WebDriver, n: int, timeout_s: float = 20.0) -> int:
    """Wait until the page has applied poll round ``n`` or later; the round."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = current_round(driver)
        if got >= n:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the page applied round {got}, not {n}, within {timeout_s:.0f}s "
                f"({driver.current_url}; problems: {browser_problems(driver)})"
            )
        time.sleep(0.1)


def login(driver: WebDriver, base_url: str, token: str, timeout_s: float = 15.0) -> str:
    """Sign in through ``/login`` with ``token``; the user name the page shows.

    The page posts the token to /api/v1/login (a session cookie) and then
    shows the user in the nav bar (``#whoami[data-user]``)."""
    driver.get(base_url.rstrip("/") + "/login")
    deadline = time.monotonic() + timeout_s
    while not driver.find_elements(By.ID, "login-token"):  # built once whoami answered
        if time.monotonic() > deadline:
            raise AssertionError(f"no login form at {base_url}/login within {timeout_s:.0f}s")
        time.sleep(0.05)
    field = driver.find_element(By.ID, "login-token")
    field.clear()
    field.send_keys(token)
    driver.find_element(By.ID, "login-submit").click()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            user = driver.execute_script(
                "var w = document.getElementById('whoami'); return w ? w.dataset.user : null"
            )
            failure = driver.execute_script(
                "var e = document.getElementById('login-error'); return e ? e.textContent : ''"
            )
        except WebDriverException:
            user, failure = None, ""  # the page is navigating
        if user:
            return str(user)
        if failure:
            raise AssertionError(f"login refused: {failure}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not logged in within {timeout_s:.0f}s ({driver.current_url})")
        time.sleep(0.1)
