"""The chat page at ``/``: its files as served (same-origin only, a strict CSP), and, where Chromium and
Playwright are installed (the README's test command installs both), the page driven in a real headless browser
against ``lightspeed serve`` with SmolLM2: replies stream in, equal the API's greedy answer with the whole
conversation as context, show their speed, survive a reload, and a rejected request loses nothing typed."""
from __future__ import annotations

import re
import shutil

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi import FastAPI
from fastapi.testclient import TestClient

from lightspeed.serve.page import POLICY, add_chat_page

KEY = "page-key-7"
CTX = 512
MODEL = "SmolLM2-135M-Instruct.Q4_1"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def test_page_files_are_self_contained() -> None:
    app = FastAPI()
    add_chat_page(app)
    client = TestClient(app)
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == POLICY
    html = page.text
    # every script, style sheet and link is a path on this server: nothing from a CDN, so it works offline
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert refs and all(r.startswith("/") and not r.startswith("//") for r in refs), refs
    for path, kind in (("/chat.js", "javascript"), ("/chat.css", "css")):
        r = client.get(path)
        assert r.status_code == 200 and kind in r.headers["content-type"] and len(r.content) > 500
        assert "http://" not in r.text and "https://" not in r.text
    script = client.get("/chat.js").text
    assert "/v1/chat/completions" in script and "innerHTML" not in script


@pytest.fixture(scope="module")
def page_server():
    if CHROMIUM is None:
        pytest.skip("no Chromium installed (the README's test command installs Debian's chromium when run as root)")
    pytest.importorskip("playwright", reason="playwright is not installed (pip install -e '.[test]')")
    import lightspeed.api as lsa
    try:
        lsa.default_model_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    from serve_process import ServerProcess
    # the batch and context of test_serve_api: its compiled programs are reused
    proc = ServerProcess(["--max-batch", "8", "--context", str(CTX), "--api-key", KEY])
    try:
        yield proc.wait_ready(timeout=400)
    finally:
        assert proc.stop() == 0, "\n".join(proc.log[-20:])


@pytest.fixture(scope="module")
def browser(page_server):
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()


def _api_reply(url: str, messages: list[dict], max_tokens: int) -> str:
    import httpx
    r = httpx.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=300,
                   json={"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _settings(page, key: str, max_tokens: int) -> None:
    page.click("#toggle-settings")
    page.fill("#api-key", key)
    page.dispatch_event("#api-key", "change")
    page.fill("#temperature", "0")
    page.dispatch_event("#temperature", "change")
    page.fill("#max-tokens", str(max_tokens))
    page.dispatch_event("#max-tokens", "change")


def _send(page, text: str) -> str:
    from playwright.sync_api import expect
    before = page.locator(".message.assistant").count()
    page.fill("#input", text)
    page.press("#input", "Enter")
    # the turn is over when its reply is on the page and the page takes input again (locator waits: the
    # page's CSP forbids the string evaluation that wait_for_function needs, and the test keeps the CSP on)
    expect(page.locator(".message.assistant")).to_have_count(before + 1, timeout=120_000)
    expect(page.locator("#send")).to_be_enabled(timeout=120_000)
    return page.locator(".message.assistant .content").nth(before).text_content()


def test_chat_in_a_browser_streams_keeps_the_conversation_and_its_speed(page_server, browser) -> None:
    from playwright.sync_api import expect
    url, n = page_server, 12
    page = browser.new_page()
    page.goto(url + "/")
    _settings(page, KEY, n)
    expect(page.locator("#model")).to_have_text(re.compile("^SmolLM2"), timeout=30_000)

    first = _send(page, "Name a colour.")
    assert first and first == _api_reply(url, [{"role": "user", "content": "Name a colour."}], n)
    stats = page.text_content("#stats")
    assert re.search(r"\d+ tokens · first token \d+ ms · [\d.]+ tokens/s", stats), stats

    # the second turn is answered with the first as context
    second = _send(page, "And another one?")
    history = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": first},
               {"role": "user", "content": "And another one?"}]
    assert second == _api_reply(url, history, n)

    # a reload keeps the conversation (it lives in the browser's storage)
    page.reload()
    page.wait_for_selector(".message.assistant")
    texts = page.locator(".message .content").all_text_contents()
    assert texts == ["Name a colour.", first, "And another one?", second]

    # a new chat forgets it, for good
    page.click("#new-chat")
    page.reload()
    assert page.locator(".message").count() == 0
    page.close()


def test_a_rejected_request_keeps_what_was_typed(page_server, browser) -> None:
    page = browser.new_page()
    page.goto(page_server + "/")
    _settings(page, "wrong-key", 8)
    page.fill("#input", "Hello there")
    page.press("#input", "Enter")
    page.wait_for_selector(".message.error", timeout=30_000)
    assert "API key" in page.text_content(".message.error")
    assert page.input_value("#input") == "Hello there"
    assert page.locator(".message.user").count() == 0 and page.locator(".message.assistant").count() == 0
    page.close()
