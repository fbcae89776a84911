"""The web console in a real browser: Debian's chromium under selenium, against a real host
process serving ``--http-listen`` with ``--auth-tokens``, the coding harness in ask-before mode
and a scripted chat-completions model on loopback (as tests/cli/test_cli_quickstart.py does).

A person signs in with a token, finds the parked session by state, pages through the list, opens
the session, approves the write in the browser and watches the turn finish: the decision is
journaled with the signed-in principal, the file is written once, the chain verifies in the
browser. Screenshots of the list and of the session page are saved for CI.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.select import Select
from selenium.webdriver.support.ui import WebDriverWait

from tests.support.host_process import HostProcess
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint

pytestmark = pytest.mark.e2e

ALICE = "alice-console-token-0123"
PRINCIPALS = {
    "tokens": {
        ALICE: {
            "principal": "user:alice",
            "issuer": "example-idp",
            "projects": ["default"],
            "roles": ["writer", "approver"],
        }
    }
}
CODING = [
    "--harness-process",
    "coding=agentsessions.harnesses.coding:CodingHarness",
    "--tool-executor",
    "python:agentsessions.harnesses.coding_tools:write_file",
]
HELLO = "print('hello from the console')\n"
WAIT_S = 30.0
DRAFTS = 11
STALE_RETRIES = 20  # a read that meets an element the console just replaced finds it again


def http_address(host: HostProcess) -> str:
    """The HTTP listener's address from the host's JSON ``serving`` log line."""
    for line in host.log_lines:
        if line.startswith("{"):
            entry = json.loads(line)
            if entry.get("msg") == "serving":
                return str(entry["http"])
    raise AssertionError("the host logged no serving line with an http address")


@pytest.fixture
async def host(tmp_path: Path, endpoint: ScriptedEndpoint) -> AsyncIterator[HostProcess]:
    tokens = tmp_path / "principals.json"
    tokens.write_text(json.dumps(PRINCIPALS))
    args = ["--model", "scripted-gpt", "--model-base-url", endpoint.base_url, *CODING]
    args += ["--auth-tokens", str(tokens), "--http-listen", "127.0.0.1:0"]
    process = HostProcess(tmp_path / "journal.db", tmp_path, args)
    await process.start()
    try:
        yield process
    finally:
        await process.close()


async def parked_session(client: httpx.AsyncClient, endpoint: ScriptedEndpoint, workspace: Path) -> str:
    """Drafts for paging, then a coding session whose turn parks on a write awaiting approval."""
    for index in range(DRAFTS):
        draft = {"session": {"harness": "coding", "metadata": {"name": f"draft-{index}"}}}
        assert (await client.post("/api/v1/sessions", json=draft)).status_code == 200
    created = await client.post(
        "/api/v1/sessions",
        json={
            "session": {"harness": "coding", "metadata": {"name": "hello-script"}, "labels": {"team": "docs"}}
        },
    )
    uid: str = created.json()["metadata"]["uid"]
    endpoint.script(
        Reply.completion(
            "I'll add a hello script.",
            tool_calls=[{"id": "m-1", "name": "write_file", "args": {"path": "hello.py", "content": HELLO}}],
            usage={"prompt_tokens": 120, "completion_tokens": 18},
        ),
        Reply.completion("Added hello.py.", usage={"prompt_tokens": 150, "completion_tokens": 6}),
    )
    config = json.dumps({"workspace": str(workspace), "mode": "ask-before"}).encode()
    body = {
        "config": base64.b64encode(config).decode(),
        "inputs": [{"role": "user", "parts": [{"text": {"text": "add a hello script"}}]}],
    }
    async with client.stream("POST", f"/api/v1/sessions/{uid}/exec", json=body) as response:
        lines = [json.loads(line) async for line in response.aiter_lines() if line]
    assert response.status_code == 200
    assert lines[-1]["session"]["execState"] == "EXEC_AWAITING", lines[-1]
    return uid


def waiting(driver: WebDriver) -> WebDriverWait[WebDriver]:
    """A bounded wait for a condition; the console redraws parts of the page as records arrive."""
    return WebDriverWait(driver, WAIT_S, ignored_exceptions=(StaleElementReferenceException,))


def screenshot(driver: WebDriver, path: Path) -> None:
    """The whole page, beyond the window (chromium's DevTools capture of the page's full size)."""
    metrics: dict[str, Any] = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})
    size = metrics["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot: dict[str, Any] = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": clip}
    )
    path.write_bytes(base64.b64decode(shot["data"]))


def rows(driver: WebDriver) -> list[str]:
    return [
        row.get_attribute("data-uid") or "" for row in driver.find_elements(By.CSS_SELECTOR, "#sessions tr")
    ]


def text(driver: WebDriver, selector: str) -> str:
    """The first match's text; found again when the console redrew it between the find and the read."""
    for _ in range(STALE_RETRIES):
        found = driver.find_elements(By.CSS_SELECTOR, selector)
        try:
            return found[0].text if found else ""
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"{selector}: redrawn {STALE_RETRIES} times while being read")


def drive_console(driver: WebDriver, base: str, uid: str, shots: Path) -> None:
    """What a person does in the console, step by step (selenium is synchronous: a thread runs it)."""
    wait = waiting(driver)
    driver.get(f"{base}/")
    # Before signing in the host answers 401 and the console says so.
    wait.until(lambda d: "UNAUTHENTICATED (HTTP 401)" in text(d, "#notice"))
    driver.find_element(By.ID, "token").send_keys(ALICE)
    driver.find_element(By.CSS_SELECTOR, "#sign-in button").click()
    wait.until(lambda d: len(rows(d)) == DRAFTS + 1)
    assert rows(driver)[0] == uid  # newest first
    assert "AWAITING" in driver.find_element(By.CSS_SELECTOR, f'tr[data-uid="{uid}"]').text
    assert "AWAITING 1" in text(driver, "#summary") and f"PENDING {DRAFTS}" in text(driver, "#summary")
    screenshot(driver, shots / "console-sessions.png")

    # By state: only the parked session.
    Select(driver.find_element(By.ID, "state")).select_by_value("AWAITING")
    driver.find_element(By.CSS_SELECTOR, "form.filters button").click()
    wait.until(lambda d: rows(d) == [uid])
    # Paging: ten a page, then the rest, then back.
    Select(driver.find_element(By.ID, "state")).select_by_value("")
    Select(driver.find_element(By.ID, "page-size")).select_by_value("10")
    driver.find_element(By.CSS_SELECTOR, "form.filters button").click()
    wait.until(lambda d: len(rows(d)) == 10)
    first_page = rows(driver)
    driver.find_element(By.ID, "next-page").click()
    wait.until(lambda d: len(rows(d)) == DRAFTS + 1 - 10)
    assert not set(rows(driver)) & set(first_page)
    driver.find_element(By.ID, "previous-page").click()
    wait.until(lambda d: rows(d) == first_page)

    # The session: its pending approval, approved here; the turn finishes on the page.
    driver.find_element(By.LINK_TEXT, uid).click()
    wait.until(lambda d: d.find_elements(By.ID, "approve"))
    # The panel is drawn again as the session's records arrive: read it through the wait.
    wait.until(lambda d: "write_file awaits approval" in text(d, "#approval h2"))
    wait.until(lambda d: '"path": "hello.py"' in text(d, "#approval pre"))
    driver.find_element(By.ID, "approval-reason").send_keys("looks good")
    driver.find_element(By.ID, "approve").click()
    wait.until(lambda d: text(d, "#session-state") == "COMPLETED")
    wait.until(lambda d: "approved by user:alice (request #" in text(d, "#timeline"))
    assert "looks good" in text(driver, "#timeline")
    assert "Added hello.py." in text(driver, "#timeline")
    assert not driver.find_elements(By.ID, "approve")


def check_session_page(driver: WebDriver, base: str, uid: str, child: str, shots: Path) -> None:
    """The session again, fresh: chain verified in the browser, fork tree, usage per model."""
    wait = waiting(driver)
    driver.get(f"{base}/#/session/{uid}")
    driver.refresh()
    wait.until(lambda d: text(d, "#chain").startswith("✓ chain verified in this browser"))
    header = driver.find_element(By.CSS_SELECTOR, "#session-header dl").text
    assert "COMPLETED" in text(driver, "#session-state")
    marks = [cell.text for cell in driver.find_elements(By.CSS_SELECTOR, "#timeline td.mark")]
    assert marks and set(marks) == {"✓"}, marks
    assert f"{len(marks)} records from genesis" in text(driver, "#chain"), header
    wait.until(lambda d: "follow-up" in text(d, "#forks"))
    assert (driver.find_element(By.LINK_TEXT, "follow-up").get_attribute("href") or "").endswith(child)
    usage = text(driver, "#usage-table")
    assert "scripted-gpt 2 270 24 0" in usage.replace("\n", " "), usage
    screenshot(driver, shots / "console-session.png")


async def test_approving_in_the_browser_finishes_the_turn(
    host: HostProcess, endpoint: ScriptedEndpoint, browser: WebDriver, screenshots: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "repo"
    workspace.mkdir()
    base = f"http://{http_address(host)}"
    headers = {"Authorization": f"Bearer {ALICE}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=WAIT_S) as client:
        uid = await parked_session(client, endpoint, workspace)
        assert not (workspace / "hello.py").exists()

        await asyncio.to_thread(drive_console, browser, base, uid, screenshots)

        assert (workspace / "hello.py").read_text() == HELLO
        assert len(endpoint.received) == 2, "one request per model call"
        async with client.stream("GET", f"/api/v1/sessions/{uid}/records") as response:
            records = [json.loads(line) async for line in response.aiter_lines() if line]
        decisions = [r["event"] for r in records if r["event"]["kind"] == "EVENT_APPROVAL_RESULT"]
        assert len(decisions) == 1
        assert decisions[0]["actor"] == {"principal": "user:alice", "issuer": "example-idp"}
        assert decisions[0]["approvalResult"]["approved"] is True

        forked = await client.post(f"/api/v1/sessions/{uid}/fork", json={"childNames": ["follow-up"]})
        assert forked.status_code == 200, forked.text
        child = forked.json()["children"][0]["metadata"]["uid"]
        await asyncio.to_thread(check_session_page, browser, base, uid, child, screenshots)
    assert (screenshots / "console-sessions.png").stat().st_size > 0
    assert (screenshots / "console-session.png").stat().st_size > 0
