"""The documentation site in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver`` through selenium,
as ``tests/inspect/test_inspect_browser.py`` drives them), served over HTTP from ``mkdocs build --strict``'s output.

Navigation from the home page to a guide, the search box finding a page, the API reference rendered from the
docstrings, the screenshots on the inspect guide, and, on every page visited, no console error and no request that
leaves the machine (no web fonts, no CDN: the machines' network is closed, and a reader's may be).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_inspect_browser import _unavailable


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site_url(built_site: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(built_site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium is not installed")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if not chromium or not chromedriver:
        _unavailable("chromium or chromedriver is not installed")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-docs-profile')}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    # the console, and every request the page makes (Chrome's DevTools events)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(chromedriver))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("TURNKIT_ARTIFACTS") or tmp_path_factory.getbasetemp() / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _wait(driver, condition, timeout: float = 30):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(condition)


def _problems(driver, site_url: str) -> tuple[list[str], list[str]]:
    """Console errors, and requests to anywhere but the site, since the last call (reading the logs empties them)."""
    errors = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    outside = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            url = message["params"]["request"]["url"]
            if url.startswith(("http:", "https:", "ws:", "wss:")) and not url.startswith(site_url):
                outside.append(url)  # (chrome:// pages are the browser's own, data: and blob: the page's)
    return errors, outside


def _open(driver, url: str) -> None:
    driver.get(url)
    _wait(driver, lambda d: d.execute_script("return document.readyState") == "complete")


def _assert_clean(driver, site_url: str, where: str) -> None:
    errors, outside = _problems(driver, site_url)
    assert errors == [], f"{where}: console errors {errors}"
    assert outside == [], f"{where}: requests that leave the machine {outside}"


def test_navigation_from_the_home_page(browser, site_url, artifacts):
    from selenium.webdriver.common.by import By

    _open(browser, site_url + "/")
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text == "Getting started"
    nav = {link.get_attribute("textContent").strip() for link in browser.find_elements(By.CSS_SELECTOR, ".md-nav a")}
    for title in ("Concepts", "Render and encode", "Serving", "Auditing with doctor", "Troubleshooting", "Benchmarks"):
        assert title in nav, title
    browser.save_screenshot(str(artifacts / "docs-home.png"))
    _assert_clean(browser, site_url, "home")

    link = browser.find_element(By.XPATH, "//nav[contains(@class, 'md-nav--primary')]//a[normalize-space()='Serving']")
    browser.execute_script("arguments[0].click()", link)  # the sidebar link, as a reader clicks it
    _wait(browser, lambda d: d.current_url.rstrip("/").endswith("/guides/serve"))
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text == "Serving"
    tables = browser.find_elements(By.CSS_SELECTOR, "article table")
    assert tables and "/v1/chat/completions" in tables[0].text
    _assert_clean(browser, site_url, "guides/serve")


def test_search_finds_a_page(browser, site_url, artifacts):
    from selenium.webdriver.common.by import By

    _open(browser, site_url + "/")
    box = browser.find_element(By.CSS_SELECTOR, "input.md-search__input")
    box.click()
    box.send_keys("prefix-unstable")
    # the results are redrawn as the query grows: read their links in one script call, until the doctor guide is one
    targets = _wait(
        browser,
        lambda d: [
            href
            for href in d.execute_script(
                "return Array.from(document.querySelectorAll('.md-search-result__item a')).map(a => a.href)"
            )
            if "/guides/doctor/" in href
        ],
    )
    assert targets
    browser.save_screenshot(str(artifacts / "docs-search.png"))
    _assert_clean(browser, site_url, "search")


def test_the_api_reference_renders_the_docstrings(browser, site_url, artifacts):
    from selenium.webdriver.common.by import By

    _open(browser, site_url + "/reference/chatformat/")
    heading = browser.find_element(By.ID, "turnkit.ChatFormat.render")
    assert "render" in heading.text
    signatures = browser.find_elements(By.CSS_SELECTOR, ".doc-signature")
    assert any("add_generation_prompt" in signature.text for signature in signatures)
    assert "Args:" not in browser.find_element(By.CSS_SELECTOR, "article").text  # Google sections are rendered
    browser.save_screenshot(str(artifacts / "docs-reference.png"))
    _assert_clean(browser, site_url, "reference/chatformat")

    for page in ("errors", "encoding", "parsing", "serve", "doctor"):
        _open(browser, f"{site_url}/reference/{page}/")
        assert browser.find_elements(By.CSS_SELECTOR, ".doc-heading"), page
        _assert_clean(browser, site_url, f"reference/{page}")


def test_the_screenshots_load(browser, site_url):
    from selenium.webdriver.common.by import By

    _open(browser, site_url + "/guides/inspect/")
    images = browser.find_elements(By.CSS_SELECTOR, "article img")
    assert len(images) == 3
    for image in images:
        assert browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", image), (
            image.get_attribute("src")
        )
    _assert_clean(browser, site_url, "guides/inspect")
