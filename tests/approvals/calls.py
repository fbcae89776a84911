"""Client calls and journal readers shared by the approval and lifecycle tests."""

from __future__ import annotations

import json
from typing import Any

from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.echo import EchoModel
from agentsessions.host.models.provider import DeltaCallback
from agentsessions.host.tools import CallableTool, PythonCallableExecutor, ToolContext, ToolRegistry
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.support.host import HostUnderTest, text_input

K = common_pb2.EventKind


# A turn that asked the model, called a tool needing approval and parked (SUSPEND marker).
PARKED_KINDS = [
    "EXECUTION_START",
    "INPUT",
    "MODEL_CALL",
    "OUTPUT",
    "TOOL_CALL",
    "APPROVAL_REQUEST",
    "LIFECYCLE",
]


def records(updates: list[session_pb2.ExecUpdate]) -> list[common_pb2.LogRecord]:
    return [u.record for u in updates if u.WhichOneof("update") == "record"]


def sessions_of(updates: list[session_pb2.ExecUpdate]) -> list[session_pb2.Session]:
    return [u.session for u in updates if u.WhichOneof("update") == "session"]


def kinds(recs: list[common_pb2.LogRecord]) -> list[str]:
    return [K.Name(r.event.kind).removeprefix("EVENT_") for r in recs]


def say(session: str, text: str, **kw: Any) -> session_pb2.ExecRequest:
    return session_pb2.ExecRequest(session=session, inputs=[text_input(text)], **kw)


def outputs(recs: list[common_pb2.LogRecord]) -> list[str]:
    return [
        "".join(p.text.text for p in r.event.message.parts) for r in recs if r.event.kind == K.EVENT_OUTPUT
    ]


def receipts_seen(recs: list[common_pb2.LogRecord]) -> list[dict[str, Any]]:
    """The receipt summaries ToolHarness recorded (its JSON OUTPUTs)."""
    seen = []
    for text in outputs(recs):
        if text.startswith("{"):
            seen.append(json.loads(text))
    return seen


async def new_session(host: HostUnderTest, harness: str, **meta: Any) -> str:
    created: session_pb2.Session = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(harness=harness, **meta))
    )
    return created.metadata.uid


async def get(host: HostUnderTest, uid: str) -> session_pb2.Session:
    got: session_pb2.Session = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
    return got


async def approve(
    host: HostUnderTest,
    ref: common_pb2.ApprovalRef,
    approved: bool | None,
    reason: str = "",
    identity: common_pb2.IdentityRef | None = None,
    session: str = "",
) -> session_pb2.ApproveResponse:
    request = session_pb2.ApproveRequest(
        session=session,
        execution_id=ref.execution_id,
        tool_call_id=ref.tool_call_id,
        request_seq=ref.request_seq,
        reason=reason,
    )
    if approved is not None:
        request.approved = approved
    if identity is not None:
        request.identity.CopyFrom(identity)
    response: session_pb2.ApproveResponse = await host.sessions.Approve(request)
    return response


async def resume(host: HostUnderTest, uid: str) -> session_pb2.Session:
    resumed: session_pb2.Session = await host.sessions.Resume(session_pb2.ResumeRequest(session=uid))
    return resumed


async def journal(store: JournalStore, uid: str) -> list[common_pb2.LogRecord]:
    return await store.read(uid)


class StampTool:
    """A host-run ``stamp`` tool that notes, when it runs, whether its intent was already journaled."""

    def __init__(self, store: JournalStore) -> None:
        self.store = store
        self.runs: list[tuple[ToolContext, dict[str, Any]]] = []
        self.intent_was_journaled: list[bool] = []
        self.fail_with: str | None = None

    async def stamp(self, args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        recs = await self.store.read(context.session_uid)
        self.intent_was_journaled.append(
            any(r.event.kind == K.EVENT_TOOL_CALL and r.event.tool.id == context.call_id for r in recs)
        )
        self.runs.append((context, args))
        if self.fail_with is not None:
            raise RuntimeError(self.fail_with)
        return {"stamped": args.get("text", "")}

    def registry(self) -> ToolRegistry:
        return ToolRegistry(self.store, [PythonCallableExecutor([CallableTool("stamp", self.stamp)])])


def config(**document: Any) -> bytes:
    return json.dumps(document).encode()


class CountingEcho(EchoModel):
    """The echo model, counting provider invocations (replay must make none, I1)."""

    def __init__(self) -> None:
        super().__init__()
        self.invocations = 0

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        self.invocations += 1
        return await super().complete(call, on_delta)
