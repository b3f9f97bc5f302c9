"""The approval inbox (``/``) in a real headless Chromium (Debian's chromium + chromium-driver, selenium):
approve one call (it runs exactly once), reject another with a reason the model reads, edit a third.

``UPDATE_DOCS_SCREENSHOT=1`` also writes the screenshot the docs show (docs/img/inbox.png).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import cast

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait
from temporalio.testing import WorkflowEnvironment

from activities.runtime import Runtime
from tests.api_support import ALICE, ROOT, ServeProcess, indexed_server, write_tokens
from tests.conftest import WorkerFactory
from tests.fakes.http_sink import HttpSink
from tests.fakes.llm_server import FakeLLMServer, Scripted
from tests.waiting import eventually

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WAIT_S = 90  # a hang guard, not a speed requirement
REASON = "sku 2 is discontinued"


@pytest.fixture(scope="module")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """This module's own dev server, with the Agent* search attributes (listing by tenant needs them)."""
    async with indexed_server() as env:
        yield env


@pytest.fixture
def sink() -> Iterator[HttpSink]:
    with HttpSink() as server:
        yield server


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    # `make test` installs both (the Makefile's chromium target); a missing one fails here, never skips.
    assert CHROMIUM and CHROMEDRIVER, "chromium and chromium-driver are needed: make chromium"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,1400"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def post(sink: HttpSink, sku: int) -> tuple[str, str]:
    return ("http_request", json.dumps({"method": "POST", "url": f"{sink.url}/orders", "json": {"sku": sku}}))


def card_of(driver: webdriver.Chrome, sku: int) -> WebElement:
    """The inbox's card of the call for ``sku`` (waits for it to be shown)."""

    def find(d: webdriver.Chrome) -> WebElement | bool:
        for card in d.find_elements(By.CSS_SELECTOR, "article.approval"):
            if f'"sku": {sku}' in card.find_element(By.CSS_SELECTOR, ".args").text:
                return card
        return False

    return cast(WebElement, WebDriverWait(driver, WAIT_S).until(find))


def decided(driver: webdriver.Chrome, card: WebElement) -> str:
    return cast(
        str,
        WebDriverWait(driver, WAIT_S).until(
            lambda _: card.get_attribute("data-decided") and card.find_element(By.CSS_SELECTOR, ".result").text
        ),
    )


def use_inbox(driver: webdriver.Chrome, url: str, screenshot: Path) -> list[str]:
    """Open the inbox as alice, approve sku 1, reject sku 2 with a reason, approve sku 3 edited to sku 33."""
    driver.get(f"{url}/#token={ALICE.token}")
    WebDriverWait(driver, WAIT_S).until(lambda d: "alice" in d.find_element(By.ID, "who").text)
    assert "token=" not in driver.current_url  # the token left the address bar
    first = card_of(driver, 1)
    WebDriverWait(driver, WAIT_S).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "article.approval")) == 3)
    link = first.find_element(By.CSS_SELECTOR, "a.run").get_attribute("href") or ""
    assert "/namespaces/default/workflows/" in link
    driver.save_screenshot(str(screenshot))
    results = []
    first.find_element(By.CSS_SELECTOR, "button.approve").click()
    results.append(decided(driver, first))

    second = card_of(driver, 2)
    second.find_element(By.CSS_SELECTOR, "input.reason").send_keys(REASON)
    second.find_element(By.CSS_SELECTOR, "button.reject").click()
    results.append(decided(driver, second))

    third = card_of(driver, 3)
    third.find_element(By.CSS_SELECTOR, "button.edit").click()
    editor = third.find_element(By.CSS_SELECTOR, "textarea.edited")
    edited = json.loads(editor.get_attribute("value") or "{}")
    edited["json"] = {"sku": 33}
    editor.clear()
    editor.send_keys(json.dumps(edited))
    third.find_element(By.CSS_SELECTOR, "button.save-edit").click()
    results.append(decided(driver, third))
    return results


async def test_the_inbox_approves_rejects_and_edits_in_a_real_browser(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    sink: HttpSink,
    browser: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    tokens = write_tokens(tmp_path / "tokens.json")
    address = dev_env.client.service_client.config.target_host
    llm.enqueue(Scripted(tool_calls=[post(sink, 1), post(sink, 2), post(sink, 3)]), Scripted(text="two ordered"))
    runtime.search_attributes_ready = True
    async with run_worker(dev_env.client, runtime) as tq:
        api = await asyncio.to_thread(
            ServeProcess, address, tq, tokens, tmp_path / "api.log", env={"AGENT_STORE_URL": runtime.settings.store_url}
        )
        try:
            async with httpx.AsyncClient(base_url=api.url, headers=ALICE.headers, timeout=60) as http:
                started = await http.post("/v1/runs", json={"task": "order skus 1, 2 and 3"})
                assert started.status_code == 201, started.text
                wid = started.json()["workflow_id"]
                # The browser blocks: it runs in a thread while the worker goes on in this loop.
                results = await asyncio.to_thread(use_inbox, browser, api.url, tmp_path / "inbox.png")

                async def closed() -> dict[str, object] | None:
                    view = (await http.get(f"/v1/runs/{wid}")).json()
                    return view if view["state"] == "completed" else None

                view = await eventually(closed, "the run completes after the three decisions")
        finally:
            await asyncio.to_thread(api.stop)

    assert all(results), results
    assert view["output"] == "two ordered"
    assert {d["reviewer"] for d in view["decisions"]} == {"alice"}  # type: ignore[attr-defined]
    # Exactly one delivery each of the approved call and of the edited one; the rejected one never ran.
    bodies = sorted(json.loads(w.body)["sku"] for w in sink.writes())
    assert bodies == [1, 33]
    tool_messages = [m["content"] for m in llm.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert any(REASON in m for m in tool_messages), tool_messages
    assert (tmp_path / "inbox.png").stat().st_size > 10_000
    if os.environ.get("UPDATE_DOCS_SCREENSHOT") == "1":
        shutil.copyfile(tmp_path / "inbox.png", ROOT / "docs" / "img" / "inbox.png")


def answer_in_inbox(driver: webdriver.Chrome, url: str, option: str) -> str:
    driver.get(f"{url}/#token={ALICE.token}")

    def question(d: webdriver.Chrome) -> WebElement | bool:
        cards = [c for c in d.find_elements(By.CSS_SELECTOR, "article.approval") if c.get_attribute("data-key")]
        return next((c for c in cards if "Which region?" in c.find_element(By.CSS_SELECTOR, ".question").text), False)

    card = cast(WebElement, WebDriverWait(driver, WAIT_S).until(question))
    assert not card.find_element(By.CSS_SELECTOR, ".call-actions").is_displayed()  # a question: no approve/reject
    [button] = [b for b in card.find_elements(By.CSS_SELECTOR, "button.option") if b.text == option]
    button.click()
    return decided(driver, card)


async def test_the_inbox_answers_a_question_with_one_of_its_options(
    dev_env: WorkflowEnvironment,
    runtime: Runtime,
    run_worker: WorkerFactory,
    llm: FakeLLMServer,
    browser: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    tokens = write_tokens(tmp_path / "tokens.json")
    address = dev_env.client.service_client.config.target_host
    asked = json.dumps({"question": "Which region?", "options": ["eu", "us"], "allow_free_text": False})
    llm.enqueue(Scripted(tool_calls=[("ask_human", asked)]), Scripted(text="eu it is"))
    runtime.search_attributes_ready = True
    async with run_worker(dev_env.client, runtime) as tq:
        api = await asyncio.to_thread(ServeProcess, address, tq, tokens, tmp_path / "api.log")
        try:
            async with httpx.AsyncClient(base_url=api.url, headers=ALICE.headers, timeout=60) as http:
                started = await http.post("/v1/runs", json={"task": "pick a region"})
                assert started.status_code == 201, started.text
                wid = started.json()["workflow_id"]
                result = await asyncio.to_thread(answer_in_inbox, browser, api.url, "eu")

                async def closed() -> dict[str, object] | None:
                    view = (await http.get(f"/v1/runs/{wid}")).json()
                    return view if view["state"] == "completed" else None

                view = await eventually(closed, "the run completes after the answer")
        finally:
            await asyncio.to_thread(api.stop)
    assert result and view["output"] == "eu it is"
    tool_messages = [m["content"] for m in llm.requests[1]["body"]["messages"] if m["role"] == "tool"]
    assert any("eu" in m for m in tool_messages), tool_messages
