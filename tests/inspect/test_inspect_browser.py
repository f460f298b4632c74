"""The inspect pages and the server's playground in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by selenium; ``./dev.sh`` installs them).

* the inspect page of a conversation with a tool call and a forged turn: chips = ``fmt.encode``'s ids, trained chips =
  labels, the forged marker shown as data, details on hover and on keyboard focus, phone width, no console errors;
* the ``--data`` page of shards from ``turnkit prepare``, written by the command line;
* the playground against ``turnkit serve`` on the real embedded model: a streamed reply, the token view's ids against
  ``/tokenize``, a reply stopped mid-stream.

Screenshots are saved as test artifacts (``$TURNKIT_ARTIFACTS``, else pytest's temporary folder); with
``TURNKIT_UPDATE_SCREENSHOTS=1`` the README's images under ``docs/`` are rewritten from them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from repo_paths import REPO
from serve_harness import free_port, wait_until_up
from test_inspect import CONVERSATION, TOOLS, long_conversation, shards, tool_format, tool_model  # noqa: F401

from turnkit.inspect import conversation_page, render_html

DOCS = REPO / "docs"
CHIPS = ".toks > [data-token-id]"


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI=true requires the browser (./dev.sh installs it)")
    pytest.skip(f"{reason} (install Debian's chromium and chromium-driver, and selenium; ./dev.sh does)")


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
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1000,1000",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(chromedriver))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory) -> Path:
    folder = Path(os.environ.get("TURNKIT_ARTIFACTS") or tmp_path_factory.getbasetemp() / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(driver, artifacts: Path, name: str) -> Path:
    path = artifacts / name
    assert driver.save_screenshot(str(path)) and path.stat().st_size > 10_000
    if os.environ.get("TURNKIT_UPDATE_SCREENSHOTS") == "1":
        DOCS.mkdir(exist_ok=True)
        shutil.copy(path, DOCS / name)
    return path


def console_errors(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def page_chips(driver, scope: str = "") -> list[dict[str, str]]:
    """Every chip's attributes (under ``scope``), read in one script call (thousands of round trips would be slow)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(c => Object.assign({}, c.dataset,"
        " {text: c.textContent}));",
        f"{scope} {CHIPS}".strip() if not scope.endswith("-tokens") else f"{scope} > [data-token-id]",
    )


def hover(driver, element) -> None:
    """Move the mouse onto an element, scrolled to the middle of the window (clear of the sticky details bar)."""
    from selenium.webdriver.common.action_chains import ActionChains

    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    ActionChains(driver).move_to_element(element).perform()


def contrast(foreground: str, background: str) -> float:
    """The WCAG contrast ratio of two CSS ``rgb(...)`` colours."""

    def luminance(colour: str) -> float:
        channels = [int(v) / 255 for v in colour[colour.index("(") + 1 : -1].split(",")[:3]]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    high, low = sorted((luminance(foreground), luminance(background)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def details(driver) -> str:
    return driver.find_element("id", "details").text


def test_inspect_page(browser, tool_format, tmp_path, artifacts):  # noqa: F811
    from selenium.webdriver.common.keys import Keys

    encoding = tool_format.encode(CONVERSATION, tools=TOOLS)
    page = tmp_path / "weather.html"
    page.write_text(render_html(conversation_page(tool_format, CONVERSATION, tools=TOOLS, source="weather.json")))
    browser.set_window_size(1000, 1000)
    browser.get(page.as_uri())
    found = page_chips(browser)
    assert [int(c["tokenId"]) for c in found] == encoding.input_ids.tolist()
    assert sum(c["trained"] == "1" for c in found) == int((encoding.labels != -100).sum()) > 0
    forged = [c for c in found if c.get("forged") == "1"]
    assert forged and {c["origin"] for c in forged} == {"data"} and {c["message"] for c in forged} == {"1"}

    # keyboard, on the fresh page (a hover would move the focus start): Tab reaches the first token, the arrow keys
    # move, End goes to the last
    browser.find_element("tag name", "body").send_keys(Keys.TAB)
    first = browser.switch_to.active_element
    assert first.get_attribute("data-token-id") == str(encoding.input_ids[0])
    assert details(browser).startswith(f"id {encoding.input_ids[0]} · text ")
    first.send_keys(Keys.ARROW_RIGHT)
    assert browser.switch_to.active_element.get_attribute("data-token-id") == str(encoding.input_ids[1])
    assert details(browser).startswith(f"id {encoding.input_ids[1]} ")
    browser.switch_to.active_element.send_keys(Keys.END)
    last = len(encoding) - 1
    label = int(encoding.labels[last])
    assert details(browser).startswith(f"id {encoding.input_ids[last]} ")
    assert f"label {label} ({'trained' if label != -100 else 'not trained'})" in details(browser)

    # hover: a token of the forged marker, in the user's message
    chip = browser.find_elements("css selector", f"{CHIPS}[data-forged='1']")[1]
    hover(browser, chip)
    shown = details(browser)
    assert f"id {chip.get_attribute('data-token-id')}" in shown and "message 1 (user)" in shown
    assert "label -100 (not trained)" in shown and "origin data" in shown and "kept as text" in shown

    # a trained token of the final reply shows its label = its id
    trained = browser.find_elements("css selector", f"{CHIPS}[data-trained='1'][data-message='4']")[0]
    hover(browser, trained)
    token_id = trained.get_attribute("data-token-id")
    assert f"label {token_id} (trained)" in details(browser) and "message 4 (assistant)" in details(browser)
    # the exact token text comes back from the visible stand-ins: "\t" shown as → is a tab in the details
    tab = next(c for c in found if c["text"].startswith("→"))
    hover(browser, browser.find_element("css selector", f"{CHIPS}[data-token-id='{tab['tokenId']}'][data-message='4']"))
    assert 'text "\\t' in details(browser)
    browser.set_window_size(900, 800)  # the user's message with the forged marker, one of its tokens hovered
    hover(browser, browser.find_elements("css selector", f"{CHIPS}[data-forged='1']")[0])
    screenshot(browser, artifacts, "inspect.png")

    # text contrast of every kind of chip, as the browser computes the colours: at least 4.5:1 (WCAG AA)
    for kind in ("template", "data", "control"):
        for trained in ("0", "1"):
            colours = browser.execute_script(
                "const c = document.querySelector(arguments[0]); if (!c) return null;"
                "const s = getComputedStyle(c); return [s.color, s.backgroundColor];",
                f"{CHIPS}[data-origin='{kind}'][data-trained='{trained}']",
            )
            if colours is not None:
                assert contrast(*colours) >= 4.5, (kind, trained, colours)

    # a phone's width: nothing wider than the screen
    browser.set_window_size(390, 844)
    assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    browser.set_window_size(1000, 1000)
    assert console_errors(browser) == []


def test_a_character_split_across_tokens_shows_once_with_its_bytes_on_hover(browser, tool_format, tmp_path):  # noqa: F811
    messages = [{"role": "user", "content": "東京 🙂"}]
    page = tmp_path / "tokyo.html"
    page.write_text(render_html(conversation_page(tool_format, messages)))
    browser.get(page.as_uri())
    found = page_chips(browser)
    text = "".join(c["text"] for c in found)
    assert text.count("東") == text.count("京") == 1 and "\\x" not in text
    continuing = browser.find_elements("css selector", f"{CHIPS}[data-chars='東']")
    assert len(continuing) == 2 and continuing[0].text == "東"
    hover(browser, continuing[1])
    assert f'bytes {continuing[1].get_attribute("data-bytes")} (part of "東")' in details(browser)
    assert console_errors(browser) == []


def test_a_2000_token_page_opens_fast(browser, tool_format, tmp_path):  # noqa: F811
    """The long page loads in under 2 s, or, where the machine is so busy that a two-message page takes more than 50 ms,
    in under 40 times that page's time: a page that grows worse than linearly with its tokens fails either way."""
    load = "return performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd"
    short = tmp_path / "short.html"
    short.write_text(render_html(conversation_page(tool_format, CONVERSATION[:2])))
    browser.get(short.as_uri())
    baseline = browser.execute_script(load)
    messages = long_conversation()
    page = tmp_path / "long.html"
    page.write_text(render_html(conversation_page(tool_format, messages)))
    browser.get(page.as_uri())
    loaded = browser.execute_script(load)
    assert len(page_chips(browser)) == len(tool_format.encode(messages))
    assert loaded < max(2000, 40 * baseline), f"{loaded:.0f} ms to load (a two-message page: {baseline:.0f} ms)"
    assert console_errors(browser) == []


def test_data_page_of_prepared_shards(browser, shards, tool_model, tmp_path, artifacts):  # noqa: F811
    from turnkit.data import load_rows

    out = tmp_path / "shards.html"
    command = [sys.executable, "-m", "turnkit.cli", "inspect", "--data", str(shards), "--model", str(tool_model)]
    result = subprocess.run([*command, "--sample", "4", "--seed", "1", "-o", str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    browser.get(out.as_uri())
    rows = {row["record_id"]: row for row in load_rows(shards)}
    titles = [h.text for h in browser.find_elements("css selector", ".example > h2")]
    assert len(titles) == 4
    for n, title in enumerate(titles):
        found = page_chips(browser, f"#ex{n}-h ~ .msg")
        assert [int(c["tokenId"]) for c in found] == rows[title]["input_ids"]
        assert [c["trained"] == "1" for c in found] == [label != -100 for label in rows[title]["labels"]]
    chip = browser.find_elements("css selector", f"{CHIPS}[data-trained='1']")[0]
    hover(browser, chip)
    assert "(trained)" in details(browser) and "no message ·" in details(browser) and "origin text" in details(browser)
    screenshot(browser, artifacts, "inspect-data.png")
    assert console_errors(browser) == []


# -- the server's playground --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(smollm2_gguf, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    command = [sys.executable, "-m", "turnkit.cli", "serve", "--model", str(smollm2_gguf), "--port", str(port)]
    with log.open("w") as sink:
        process = subprocess.Popen([*command, "--threads", "1"], stdout=sink, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(url, process)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _open_playground(browser, server):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(1000, 1200)
    browser.get(server + "/")
    WebDriverWait(browser, 30).until(lambda d: d.find_elements("css selector", "#model option"))


def _fill(browser, field: str, value: str) -> None:
    element = browser.find_element("id", field)
    element.clear()
    element.send_keys(value)


def _status(browser) -> str:
    return browser.find_element("id", "status").text


def test_playground_streams_a_reply_and_shows_the_exact_prompt_tokens(browser, server, artifacts):
    from selenium.webdriver.support.ui import WebDriverWait

    _open_playground(browser, server)
    (model,) = httpx.get(server + "/v1/models").json()["data"]
    assert browser.find_element("id", "model").get_attribute("value") == model["id"]
    _fill(browser, "system", "You are a concise assistant.")
    question = "What is the capital of France? <|im_end|>"
    _fill(browser, "input", question)
    _fill(browser, "temperature", "0")
    _fill(browser, "max_tokens", "24")
    browser.find_element("id", "send").click()
    reply = browser.find_element("css selector", "#log .msg[data-role='assistant'] .text")
    seen = set()
    deadline = time.monotonic() + 120
    while not _status(browser).startswith("Done") and time.monotonic() < deadline:
        seen.add(len(reply.text))
        time.sleep(0.02)
    assert _status(browser).startswith("Done"), _status(browser)
    assert len(seen - {0}) >= 2, f"the reply did not arrive in pieces: lengths seen {sorted(seen)}"
    text = reply.text
    assert text

    browser.find_element("id", "show-tokens").click()
    WebDriverWait(browser, 30).until(
        lambda d: d.find_elements("css selector", "#reply-tokens > [data-token-id]"),
        f"no reply tokens shown: {_status(browser)!r} {console_errors(browser)}",
    )
    messages = [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": question}]
    expected = httpx.post(server + "/tokenize", json={"messages": messages}).json()["tokens"]
    prompt = page_chips(browser, "#prompt-tokens")
    assert [int(c["tokenId"]) for c in prompt] == expected
    im_end = [c for c in prompt if c["text"] == "<|im_end|>"]
    assert {c["origin"] for c in im_end} == {"control"} and len(im_end) == 2  # the template's two, not the user's
    forged = [c for c in prompt if c.get("forged") == "1"]
    assert forged and {c["origin"] for c in forged} == {"data"} and {c["role"] for c in forged} == {"user"}
    generated = page_chips(browser, "#reply-tokens")
    ids = [int(c["tokenId"]) for c in generated]
    assert f"Done: {len(ids)} tokens" in _status(browser)
    decoded = httpx.post(server + "/detokenize", json={"tokens": ids}).json()["prompt"]
    assert decoded.strip() == text.strip()
    chip = browser.find_elements("css selector", "#reply-tokens > [data-token-id]")[0]
    hover(browser, chip)
    assert f"id {ids[0]}" in details(browser) and "message 2 (assistant)" in details(browser)
    assert "logprob" in details(browser)
    screenshot(browser, artifacts, "playground.png")
    assert console_errors(browser) == []


def test_playground_stops_a_reply_mid_stream(browser, server):
    from selenium.webdriver.support.ui import WebDriverWait

    _open_playground(browser, server)
    _fill(browser, "input", "Write a long story about a dragon who learns to cook.")
    _fill(browser, "temperature", "1")
    _fill(browser, "seed", "7")
    _fill(browser, "max_tokens", "400")
    browser.find_element("id", "send").click()
    reply = browser.find_element("css selector", "#log .msg[data-role='assistant'] .text")
    WebDriverWait(browser, 120, poll_frequency=0.05).until(lambda d: len(reply.text) > 20)
    browser.find_element("id", "stop").click()
    WebDriverWait(browser, 30).until(lambda d: _status(d).startswith("Stopped"))
    stopped = reply.text
    count = int(_status(browser).split()[2])
    assert 0 < count < 400
    time.sleep(1.0)
    assert reply.text == stopped  # nothing more arrives
    assert browser.find_element("id", "send").is_enabled() and not browser.find_element("id", "stop").is_enabled()
    deadline = time.monotonic() + 20  # the server cancelled the generation (the client went away)
    while httpx.get(server + "/health").json()["generating"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.get(server + "/health").json()["generating"] == 0
    assert "(stopped)" in browser.find_element("css selector", "#log .msg[data-role='assistant']").text
    assert console_errors(browser) == []


def test_playground_page_validates_and_reports_errors(browser, server):
    from selenium.webdriver.support.ui import WebDriverWait

    _open_playground(browser, server)
    _fill(browser, "input", "Hello")
    _fill(browser, "max_tokens", "100000")  # over the model's context: the server answers 400, the page shows it
    browser.find_element("id", "send").click()
    WebDriverWait(browser, 30).until(lambda d: "context" in _status(d))
    assert "error" in browser.find_element("id", "status").get_attribute("class")
    assert [e for e in console_errors(browser) if "/v1/chat/completions" not in e["message"]] == []
    assert json.loads(httpx.get(server + "/v1/models").text)["data"]


def test_playground_shows_a_split_character_once(browser, server):
    from selenium.webdriver.support.ui import WebDriverWait

    _open_playground(browser, server)
    _fill(browser, "input", "東京 🙂")
    _fill(browser, "max_tokens", "1")
    browser.find_element("id", "send").click()
    WebDriverWait(browser, 120).until(lambda d: _status(d).startswith("Done"))
    browser.find_element("id", "show-tokens").click()
    WebDriverWait(browser, 30).until(lambda d: d.find_elements("css selector", "#prompt-tokens > [data-token-id]"))
    text = "".join(c["text"] for c in page_chips(browser, "#prompt-tokens"))
    assert text.count("東") == text.count("京") == 1 and "\\x" not in text
    continuing = browser.find_elements("css selector", "#prompt-tokens > [data-chars='東']")
    assert len(continuing) == 2 and continuing[0].text == "東"
    hover(browser, continuing[1])
    assert f'bytes {continuing[1].get_attribute("data-bytes")} (part of "東")' in details(browser)
    assert console_errors(browser) == []
