"""The quickstart driven with the ``agentsessions`` command alone (no grpcurl, no Python client).

A real host process serves the coding harness (a host-started harness process) in ask-before mode,
with the OpenAI-compatible provider pointed at a scripted chat-completions endpoint on loopback and
the host-run ``write_file`` executor. The CLI creates a session, runs a turn that streams and parks
on the write, approves it (the turn continues and writes the file), forks, and verifies both chains.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.cli.conftest import cli
from tests.support.host_process import HostProcess
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint

pytestmark = pytest.mark.e2e

HELLO = "print('hello from the CLI quickstart')\n"
UID = re.compile(r"^sess-[0-9a-f]{24}$")
CODING = [
    "--harness-process",
    "coding=agentsessions.harnesses.coding:CodingHarness",
    "--tool-executor",
    "python:agentsessions.harnesses.coding_tools:write_file",
]


@pytest.fixture
async def host(tmp_path: Path, endpoint: ScriptedEndpoint) -> AsyncIterator[HostProcess]:
    process = HostProcess(
        tmp_path / "journal.db",
        tmp_path,
        ["--model", "scripted-gpt", "--model-base-url", endpoint.base_url, *CODING],
    )
    await process.start()
    try:
        yield process
    finally:
        await process.close()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "README.md").write_text("A repository for the CLI quickstart.\n")
    return folder


def ask_before(workspace: Path) -> str:
    return json.dumps({"workspace": str(workspace), "mode": "ask-before"})


def write_hello() -> Reply:
    return Reply.completion(
        "I'll add a hello script.",
        tool_calls=[{"id": "m-1", "name": "write_file", "args": {"path": "hello.py", "content": HELLO}}],
    )


async def test_quickstart_with_the_cli_alone(
    host: HostProcess, endpoint: ScriptedEndpoint, workspace: Path
) -> None:
    server = host.address
    created = await cli("create", "--harness", "coding", "--name", "quickstart", server=server)
    assert created.code == 0 and created.err == "", created
    uid = created.out.strip()
    assert UID.match(uid), created

    # A turn that streams its output, proposes a write and parks on the approval (exit 5).
    endpoint.script(write_hello(), Reply.completion("Added hello.py; run it with `python hello.py`."))
    parked = await cli(
        "exec", "-s", uid, "--config", ask_before(workspace), "add a hello script", server=server
    )
    assert parked.code == 5, parked
    lines = parked.out.splitlines()
    assert lines[0] == "> add a hello script"
    assert lines[1] == "I'll add a hello script."
    assert lines[2].startswith("-> write_file {") and '"path":"hello.py"' in lines[2]
    assert lines[2].endswith("(run by the host after approval)")
    assert re.fullmatch(r"\?  write_file awaits approval \(call \S+, request #6\)", lines[3]), parked
    assert f"decide with: agentsessions approve {uid}" in parked.err
    assert not (workspace / "hello.py").exists()

    shown = await cli("get", uid, server=server)
    assert "AWAITING" in shown.out and "(request #6)" in shown.out, shown

    # Approve the pending call: the decision is journaled, the turn continues and completes.
    approved = await cli("approve", uid, "--reason", "looks good", "--actor", "reviewer", server=server)
    assert approved.code == 0, approved
    out = approved.out.splitlines()
    assert out[0] == "=  approved by reviewer: looks good", approved
    assert "decision recorded at seq 8" in approved.err
    assert any(line.startswith("<- write_file: {") for line in out), approved
    assert "Added hello.py; run it with `python hello.py`." in out
    assert (workspace / "hello.py").read_text() == HELLO
    assert len(endpoint.received) == 2, "one request per model call, none repeated on recovery"

    state = json.loads((await cli("get", uid, "--json", server=server)).out)
    assert state["execState"] == "EXEC_COMPLETED"
    head = int(state["lastSeq"])

    forked = await cli("fork", uid, "--at", str(head), "--child-name", "follow-up", server=server)
    assert forked.code == 0, forked
    (child,) = forked.out.split()
    assert UID.match(child)

    verified = await cli("verify", uid, child, server=server)
    assert verified.code == 0, verified
    assert f"ok: session {uid}: chain of {head} records verifies from genesis" in verified.out
    assert f"ok: session {child}: chain of " in verified.out

    log = await cli("log", uid, server=server)
    kinds = [line.split()[1] for line in log.out.splitlines()]
    assert (
        kinds.count("MODEL_CALL") == 2
        and kinds.count("APPROVAL_RESULT") == 1
        and kinds[-1]
        in (
            "END",
            "LIFECYCLE",
        )
    )


async def test_deny_continues_the_turn_without_running_the_tool(
    host: HostProcess, endpoint: ScriptedEndpoint, workspace: Path
) -> None:
    server = host.address
    uid = (await cli("create", "--harness", "coding", server=server)).out.strip()
    endpoint.script(write_hello(), Reply.completion("Understood, I left the repository alone."))
    parked = await cli(
        "exec", "-s", uid, "--config", ask_before(workspace), "add a hello script", server=server
    )
    assert parked.code == 5, parked
    denied = await cli("deny", uid, "--reason", "not now", server=server)
    assert denied.code == 0, denied
    assert "=  denied by an unnamed caller: not now" in denied.out
    assert "<- write_file: not run, the approval was denied" in denied.out
    assert "Understood, I left the repository alone." in denied.out
    assert not (workspace / "hello.py").exists()
    again = await cli("approve", uid, server=server)
    assert again.code == 1 and "has no pending approval" in again.err, again


async def test_approve_no_continue_leaves_the_turn_for_resume(
    host: HostProcess, endpoint: ScriptedEndpoint, workspace: Path
) -> None:
    server = host.address
    uid = (await cli("create", "--harness", "coding", server=server)).out.strip()
    endpoint.script(write_hello(), Reply.completion("Done."))
    assert (await cli("exec", "-s", uid, "--config", ask_before(workspace), "go", server=server)).code == 5
    recorded = await cli("approve", uid, "--no-continue", "--json", server=server)
    assert recorded.code == 0, recorded
    decision = json.loads(recorded.out)
    assert decision["decision"]["event"]["kind"] == "EVENT_APPROVAL_RESULT"
    assert not (workspace / "hello.py").exists()
    resumed = await cli("resume", uid, server=server)
    assert resumed.code == 0 and "exec=COMPLETED" in resumed.out, resumed
    assert (workspace / "hello.py").read_text() == HELLO
