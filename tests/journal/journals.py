"""Journals the store tests write by hand."""

from __future__ import annotations

import asyncio
import sys

from agentsessions.v1 import common_pb2


def inp(text: str) -> common_pb2.Event:
    """A user INPUT with one text part."""
    ev = common_pb2.Event(kind=common_pb2.EVENT_INPUT)
    ev.message.role = "user"
    ev.message.parts.add().text.text = text
    return ev


_OTHER_PROCESS = """
import asyncio, sys
from agentsessions.host.journal import open_store
from agentsessions.v1 import common_pb2

async def main() -> None:
    store = await open_store(sys.argv[1])
    event = common_pb2.Event(kind=common_pb2.EVENT_INPUT)
    event.message.parts.add().text.text = "from another process"
    fence = await store.new_fence("s") if sys.argv[3] == "mint" else 0
    await store.append("s", [event], expected_head=int(sys.argv[2]), fence=fence)
    await store.close()

asyncio.run(main())
"""


async def other_process_appends(path: str, expected_head: int, *, mint_fence: bool = False) -> None:
    """Another process opens the journal at ``path`` and appends "from another process" to session
    ``s`` at ``expected_head`` (under a fence it mints first with ``mint_fence``, else fence 0)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _OTHER_PROCESS, path, str(expected_head), "mint" if mint_fence else "same"
    )
    assert await asyncio.wait_for(proc.wait(), timeout=60) == 0


def parked_turn(execution_id: str = "x") -> list[common_pb2.Event]:
    """A turn that stopped at an approval: EXECUTION_START, TOOL_CALL ``t1`` (``rm``, requires
    approval), its APPROVAL_REQUEST."""
    call = common_pb2.ToolCall(id="t1", tool="rm", mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL)
    return [
        common_pb2.Event(kind=common_pb2.EVENT_EXECUTION_START, execution_id=execution_id),
        common_pb2.Event(kind=common_pb2.EVENT_TOOL_CALL, execution_id=execution_id, tool=call),
        common_pb2.Event(
            kind=common_pb2.EVENT_APPROVAL_REQUEST,
            execution_id=execution_id,
            approval=common_pb2.ApprovalRequest(tool_call_id="t1"),
        ),
    ]
