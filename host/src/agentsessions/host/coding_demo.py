"""The second part of ``make demo``: the coding agent asks before it writes.

An embedded host (SQLite journal in a temporary directory) serves the coding harness in-process
in ``ask-before`` mode with a scripted model, and runs the host-side executor
``agentsessions.harnesses.coding_tools:write_file``. The model proposes writing ``hello.py``; the
host journals the call and parks the turn awaiting approval; the demo approves; Resume runs the
executor, which writes the file; the journal's chain verifies, and a controller replay serves
every model answer and tool result from the journal (no model call, no write) without changing it.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from grpc import aio

from agentsessions.client import SessionsClient
from agentsessions.harnesses.coding import CodingHarness
from agentsessions.host.controller.controller import Controller
from agentsessions.host.controller.harnesses import HarnessCatalog, StaticHarness
from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.host.journal import canon, open_store
from agentsessions.host.models.scripted import ScriptedModel, assistant_tool_calls, tool_call_part
from agentsessions.host.service.sessions import SessionsServicer
from agentsessions.host.tools import PythonCallableExecutor, ToolRegistry
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc

K = common_pb2.EventKind
WRITE_FILE = "agentsessions.harnesses.coding_tools:write_file"
HELLO = "print('hello from the coding agent')\n"


def scripted_model() -> ScriptedModel:
    return ScriptedModel(
        [
            assistant_tool_calls(
                tool_call_part("m-1", "write_file", {"path": "hello.py", "content": HELLO}),
                text="I'll add a hello script.",
            ),
            "Added hello.py; run it with `python hello.py`.",
        ]
    )


@struct
class CodingHost:
    controller: Controller
    model: ScriptedModel
    address: str


@asynccontextmanager
async def coding_host(journal: Path) -> AsyncIterator[CodingHost]:
    """The coding harness, a scripted model and the write_file executor behind Sessions on loopback."""
    store = await open_store(str(journal))
    tools = ToolRegistry(store, [PythonCallableExecutor.from_import_path(WRITE_FILE)])
    catalog = HarnessCatalog(
        {"coding": StaticHarness(CodingHarness())}, store, RemoteHarness, default="coding"
    )
    model = scripted_model()
    controller = Controller(store, catalog, model, tools)
    server = aio.server()
    session_pb2_grpc.add_SessionsServicer_to_server(SessionsServicer(controller), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield CodingHost(controller, model, f"127.0.0.1:{port}")
    finally:
        await server.stop(None)
        await tools.stop()
        await store.close()


def show(record: common_pb2.LogRecord) -> str:
    ev = record.event
    kind = K.Name(ev.kind).removeprefix("EVENT_")
    body = ev.WhichOneof("body")
    detail = ""
    if body == "message":
        parts = []
        for part in ev.message.parts:
            which = part.WhichOneof("part")
            if which == "text":
                parts.append(repr(part.text.text))
            elif which == "tool_call":
                parts.append(f"<calls {part.tool_call.tool}>")
        detail = " ".join(parts)
    elif body == "execution_start":
        detail = f"harness={ev.execution_start.harness} inputs={ev.execution_start.input_count}"
    elif body == "model":
        detail = f"input_hash={ev.model.input_hash[:12]}…"
    elif body == "tool":
        detail = f"{ev.tool.tool} {common_pb2.Mediation.Name(ev.tool.mediation)} path={ev.tool.args['path']}"
    elif body == "approval":
        detail = f"asks approval for {ev.approval.tool_call_id}"
    elif body == "approval_result":
        verdict = "approved" if ev.approval_result.approved else "denied"
        detail = f"{verdict} by {ev.actor.principal or '?'}: {ev.approval_result.reason!r}"
    elif body == "result":
        outcome = "error" if ev.result.is_error else "ok"
        seqs = f"request #{ev.result.approval_request_seq}, decision #{ev.result.approval_decision_seq}"
        detail = f"{outcome} ({seqs})"
    elif body == "end":
        detail = ev.end.state
    elif body == "lifecycle":
        detail = common_pb2.Lifecycle.Kind.Name(ev.lifecycle.kind)
    return f"  #{record.seq:<3} {kind:<16} {detail}"


async def coding_walkthrough() -> int:
    """Run the ask-before story; 0 when every check holds."""
    with tempfile.TemporaryDirectory(prefix="agentsessions-coding-demo-") as tmp:
        workspace = await asyncio.to_thread(_workspace, Path(tmp))
        target = workspace / "hello.py"
        async with (
            coding_host(Path(tmp) / "coding.db") as host,
            SessionsClient.connect(host.address) as client,
        ):
            return await _story(host, client, workspace, target)


async def _story(host: CodingHost, client: SessionsClient, workspace: Path, target: Path) -> int:
    session = await client.create_session(harness="coding", name="coding-demo")
    uid = session.metadata.uid
    print(f"\ncoding agent: session {uid}, workspace {workspace} (mode ask-before)")
    config = json.dumps({"workspace": str(workspace), "mode": "ask-before"}).encode()
    print("\n> exec 'add a hello script'")
    parked: session_pb2.Session | None = None
    async for update in client.exec(uid, "add a hello script", config=config):
        if update.WhichOneof("update") == "record":
            print(show(update.record))
        elif update.WhichOneof("update") == "session" and update.session.HasField("pending_approval"):
            parked = update.session
    if parked is None:
        print("the turn did not park awaiting approval")
        return 1
    ref = parked.pending_approval
    state = session_pb2.ExecState.Name(parked.exec_state)
    print(f"  parked: {state}, pending {ref.tool_call_id} (request #{ref.request_seq})")
    print(f"  hello.py exists before approval: {(await _file(target))[0] is not None}")

    reviewer = common_pb2.IdentityRef(principal="demo-reviewer", issuer="make-demo")
    decided = await client.approve(ref, uid, approved=True, reason="looks good", identity=reviewer)
    print(f"\n> approve -> decision at seq {decided.decision.seq}")
    resumed = await client.resume(uid)
    print(f"> resume -> {session_pb2.ExecState.Name(resumed.exec_state)}")
    tail = [r async for r in client.replay(uid, from_seq=decided.decision.seq)]
    for record in tail:
        print(show(record))
    content, stamp = await _file(target)
    written = content == HELLO
    print(f"  hello.py exists after approval: {written}")
    if not written:
        return 1

    records = [r async for r in client.replay(uid)]
    prev = ""
    for record in records:
        if (
            record.prev_hash != prev
            or canon.content_hash(record.event, prev, record.seq) != record.content_hash
        ):
            print(f"chain verification failed at seq {record.seq}")
            return 1
        prev = record.content_hash
    print(f"\n> replay: chain of {len(records)} records verifies from genesis")
    asked = len(host.model.calls)
    report = await host.controller.replay(uid)
    after = [r async for r in client.replay(uid)]
    identical = after == records and await _file(target) == (content, stamp)
    new_calls = len(host.model.calls) - asked + report.model_calls
    print(
        f"  controller replay: {report.executions} execution, {report.served_model_calls} model calls "
        f"served from the journal, {new_calls} sent to the model, "
        f"hello.py untouched, journal {'byte-identical' if identical else 'CHANGED'}"
    )
    return 0 if identical and new_calls == 0 else 1


def _workspace(tmp: Path) -> Path:
    workspace = tmp / "repo"
    workspace.mkdir()
    (workspace / "README.md").write_text("A demo repository.\n", encoding="utf-8")
    return workspace


async def _file(path: Path) -> tuple[str | None, int]:
    """The file's text and modification time (None, 0 when it does not exist)."""

    def look() -> tuple[str | None, int]:
        if not path.exists():
            return None, 0
        return path.read_text(encoding="utf-8"), path.stat().st_mtime_ns

    return await asyncio.to_thread(look)
