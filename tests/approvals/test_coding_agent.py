"""The coding agent end to end over the real wire, in ask-before mode.

The coding harness runs in its own process; the host runs the scripted model and the host-side
executor ``agentsessions.harnesses.coding_tools:write_file``. The model asks to write a file:
the host journals the intent and parks; nothing is written until a person approves; Resume then
writes the file exactly once, the model sees the result and answers; a controller replay serves
everything from the journal (no model call, no write) and leaves the journal byte-identical.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.scripted import ScriptedModel, assistant_tool_calls, tool_call_part
from agentsessions.host.tools import PythonCallableExecutor, ToolRegistry
from agentsessions.sdk.callids import idempotency_key
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.calls import (
    PARKED_KINDS,
    approve,
    get,
    journal,
    kinds,
    new_session,
    outputs,
    records,
    resume,
    say,
)
from tests.support.host import running_host
from tests.support.processes import HarnessProcess, harness_process, serve_argv

K = common_pb2.EventKind


@pytest.fixture
async def coding_process() -> AsyncIterator[HarnessProcess]:
    async with harness_process(serve_argv("agentsessions.harnesses.coding:CodingHarness")) as proc:
        yield proc


def host_tools(store: JournalStore) -> ToolRegistry:
    executors = [
        PythonCallableExecutor.from_import_path(f"agentsessions.harnesses.coding_tools:{name}")
        for name in ("write_file", "edit_file", "run_shell")
    ]
    return ToolRegistry(store, executors)


def script() -> ScriptedModel:
    return ScriptedModel(
        [
            assistant_tool_calls(
                tool_call_part("m-1", "write_file", {"path": "hello.py", "content": "print('hello')\n"}),
                text="I will add the script.",
            ),
            "Added hello.py, which prints hello.",
        ]
    )


@pytest.mark.parametrize("decision", ["approve", "deny"])
async def test_ask_before_write_parks_then_the_host_writes_once(
    store: JournalStore, coding_process: HarnessProcess, tmp_path: Path, decision: str
) -> None:
    workspace = tmp_path / "repo"
    workspace.mkdir()
    (workspace / "README.md").write_text("a repo\n", encoding="utf-8")
    target = workspace / "hello.py"
    model = script()
    coding_config = json.dumps({"workspace": str(workspace), "mode": "ask-before"}).encode()
    async with running_host(
        store, remote={"coding": coding_process.address}, model=model, tools=host_tools(store)
    ) as host:
        uid = await new_session(host, "coding")
        updates = await host.exec(say(uid, "add a hello script", config=coding_config))
        recs = records(updates)
        assert kinds(recs) == PARKED_KINDS
        execution_id = recs[0].event.execution_id
        call = recs[4].event.tool
        assert call.tool == "write_file" and call.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL
        assert call.id == "m-1", "the model's own call id is the journaled one"
        assert call.idempotency_key == idempotency_key(execution_id, "m-1")
        assert dict(call.args) == {
            "path": "hello.py",
            "content": "print('hello')\n",
            "workspace": str(workspace.resolve()),
        }
        ref = updates[-1].session.pending_approval
        assert (ref.tool_call_id, ref.request_seq) == (call.id, 6)
        assert not target.exists(), "nothing is written before the decision"
        assert len(model.calls) == 1

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(say(uid, "hurry up"))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION

        await approve(host, ref, decision == "approve", f"{decision}d in review", session=uid)
        resumed = await resume(host, uid)
        assert resumed.exec_state == session_pb2.EXEC_COMPLETED
        recs = await journal(store, uid)
        assert kinds(recs)[7:] == [
            "APPROVAL_RESULT",
            "TOOL_RESULT",
            "MODEL_CALL",
            "OUTPUT",
            "END",
            "LIFECYCLE",
        ]
        receipt = recs[8].event.result
        assert (receipt.approval_request_seq, receipt.approval_decision_seq) == (6, 8)
        if decision == "approve":
            assert target.read_text(encoding="utf-8") == "print('hello')\n"
            assert not receipt.is_error and receipt.code == common_pb2.ToolResult.CODE_UNSPECIFIED
        else:
            assert not target.exists()
            assert receipt.code == common_pb2.ToolResult.APPROVAL_DENIED
        assert outputs(recs)[-1] == "Added hello.py, which prints hello."
        assert len(model.calls) == 2 and model.remaining == 0
        # The model saw the receipt as the tool's answer, correlated to its own call id.
        tool_message = model.calls[1].messages[-1]
        assert tool_message.role == "tool" and tool_message.parts[0].tool_result.id == "m-1"
        assert tool_message.parts[0].tool_result.is_error == (decision == "deny")

        written = target.stat().st_mtime_ns if target.exists() else None
        before = await journal(store, uid)
        report = await host.controller.replay(uid)
        assert (report.executions, report.model_calls) == (1, 0)
        assert len(model.calls) == 2, "the scripted model is never asked again"
        assert await journal(store, uid) == before
        assert (target.stat().st_mtime_ns if target.exists() else None) == written, "replay wrote nothing"
        assert (await get(host, uid)).exec_state == session_pb2.EXEC_COMPLETED
        assert await store.verify(uid) == len(before)
