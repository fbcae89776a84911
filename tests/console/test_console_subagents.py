"""The console's fork tree shows subagent links, in a real browser (chromium under selenium) against a
real host process: a delegating harness's turn starts a child through the host's task tool; the
parent's page lists the child under it, the child's page names the parent and the task call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from agentsessions.client import SessionsClient
from agentsessions.host.controller.subagents import child_uid
from agentsessions.v1 import common_pb2, session_pb2
from tests.console.test_console import WAIT_S, http_address, text, waiting
from tests.support.host_process import HostProcess
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint, scripted_endpoint

pytestmark = pytest.mark.e2e

K = common_pb2.EventKind


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with scripted_endpoint() as served:
        yield served


@pytest.fixture
async def host(tmp_path: Path, endpoint: ScriptedEndpoint) -> AsyncIterator[HostProcess]:
    args = [
        "--model",
        "scripted",
        "--model-base-url",
        endpoint.base_url,
        "--harness-process",
        "delegator=tests.support.subagent_harnesses:Delegator",
        "--harness-process",
        "worker=tests.support.subagent_harnesses:Worker",
        "--http-listen",
        "127.0.0.1:0",
    ]
    process = HostProcess(tmp_path / "journal.db", tmp_path, args)
    await process.start()
    try:
        yield process
    finally:
        await process.close()


def check_tree(driver: WebDriver, base: str, parent: str, child: str) -> None:
    wait = waiting(driver)
    driver.get(f"{base}/#/session/{parent}")
    driver.refresh()
    wait.until(lambda d: "subagent of task call-0" in text(d, "#forks"))
    assert (driver.find_element(By.LINK_TEXT, child).get_attribute("href") or "").endswith(child)
    driver.get(f"{base}/#/session/{child}")
    driver.refresh()
    wait.until(lambda d: "delegated task call-0 to it" in text(d, "#forks"))
    assert (driver.find_element(By.LINK_TEXT, parent).get_attribute("href") or "").endswith(parent)


async def test_the_fork_tree_shows_a_parent_and_its_subagent(
    host: HostProcess, endpoint: ScriptedEndpoint, browser: WebDriver
) -> None:
    endpoint.script(
        Reply.completion(
            "", tool_calls=[{"id": "call-0", "name": "task", "args": {"prompt": "hi", "harness": "worker"}}]
        )
    )
    request = session_pb2.ExecRequest(
        harness="delegator",
        inputs=[
            common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text="go"))])
        ],
    )
    updates = [u async for u in host.sessions.Exec(request, timeout=WAIT_S)]
    parent = updates[0].session.metadata.uid
    execution = next(u.record.event.execution_id for u in updates if u.WhichOneof("update") == "record")
    async with SessionsClient.connect(host.address) as client:
        async with asyncio.timeout(WAIT_S):
            async for update in client.watch(parent):
                if update.HasField("record") and update.record.event.kind == K.EVENT_END:
                    assert update.record.event.end.state == "COMPLETED"
                    break
    child = child_uid(parent, execution, "call-0")
    await asyncio.to_thread(check_tree, browser, f"http://{http_address(host)}", parent, child)
