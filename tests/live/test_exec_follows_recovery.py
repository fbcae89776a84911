"""An Exec without inputs sent while the host's own recovery continues the session's approval-bearing
turn (two seconds after a decision nobody continued, or after a crash) follows that turn to its end
instead of answering ABORTED "busy": the turn's records, live, then the session as it left it; the
tool runs once. Any other holder of the session, or an Exec with inputs, is still ABORTED at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agentsessions.host.controller.recoverer import DECISION_GRACE_S
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.tools import CallableTool, PythonCallableExecutor, ToolContext, ToolRegistry
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.calls import approve, config, kinds, records, say, sessions_of
from tests.approvals.harnesses import ToolHarness
from tests.chaos.scenario import wait_until
from tests.journal.test_live_tables import live_of
from tests.live.world import WAIT_S, LiveHost, exec_request, live_host


class HeldTool:
    """A host-run ``stamp`` tool that, once started, waits until the test lets it finish."""

    def __init__(self, store: JournalStore) -> None:
        self.store = store
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.runs = 0

    async def stamp(self, args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
        self.runs += 1
        self.started.set()
        async with asyncio.timeout(WAIT_S):
            await self.release.wait()
        return {"stamped": args.get("text", "")}

    def registry(self) -> ToolRegistry:
        return ToolRegistry(self.store, [PythonCallableExecutor([CallableTool("stamp", self.stamp)])])


@pytest.fixture
async def tool(store: JournalStore) -> HeldTool:
    return HeldTool(store)


@pytest.fixture
async def host(store: JournalStore, tool: HeldTool) -> AsyncIterator[LiveHost]:
    async with live_host(store, local={"tooler": ToolHarness()}, tools=tool.registry()) as h:
        yield h


async def _decided(host: LiveHost) -> str:
    """A session whose turn parked on an approval that is now approved, and not continued."""
    uid = await host.create("tooler")
    parked = [
        u async for u in host.sessions.Exec(say(uid, "hi", config=config(calls=[{"mediation": "approval"}])))
    ]
    await approve(host, sessions_of(parked)[-1].pending_approval, True, session=uid)  # type: ignore[arg-type]
    return uid


async def _recovery_holding_the_tool(host: LiveHost, tool: HeldTool, uid: str) -> None:
    """Wait (past the decision's grace) until the host's recovery runs the approved tool, which
    holds it there: the recovery holds the session until the test releases the tool."""
    async with asyncio.timeout(WAIT_S + DECISION_GRACE_S):
        await tool.started.wait()
    assert host.controller.guards.recovering(uid)


async def test_an_inputless_exec_follows_the_hosts_recovery_of_a_decided_turn(
    host: LiveHost, tool: HeldTool
) -> None:
    uid = await _decided(host)
    await _recovery_holding_the_tool(host, tool, uid)

    async def inputless() -> list[session_pb2.ExecUpdate]:
        return [u async for u in host.sessions.Exec(session_pb2.ExecRequest(session=uid), timeout=WAIT_S)]

    following = asyncio.ensure_future(inputless())
    feed = live_of(host.store).feed
    await wait_until("the inputless Exec to follow the turn", lambda: feed.watched(uid) > 0)
    assert not following.done()
    tool.release.set()
    async with asyncio.timeout(WAIT_S):
        updates = await following

    assert updates[0].WhichOneof("update") == "session"  # the session first, as every Exec
    streamed = kinds(records(updates))
    assert streamed[0] == "EXECUTION_START"  # the turn from its first record
    # ... through the decision, the receipt and the END, where it stops (not the recovery's RESUME).
    assert streamed.count("TOOL_RESULT") == 1 and streamed.count("END") == 1
    assert streamed.index("APPROVAL_RESULT") < streamed.index("TOOL_RESULT") < streamed.index("END")
    assert streamed[-1] == "END"
    assert updates[-1].WhichOneof("update") == "session", "it ends as a recovering Exec does"
    assert updates[-1].session.exec_state == session_pb2.EXEC_COMPLETED
    assert tool.runs == 1  # followed, not run again
    journal = kinds(await host.records(uid))
    assert journal.count("END") == 1 and journal.count("TOOL_RESULT") == 1


async def test_an_exec_with_inputs_meeting_the_recovery_is_refused_as_before(
    host: LiveHost, tool: HeldTool
) -> None:
    """New inputs never follow: the turn is not finished (FAILED_PRECONDITION, saying it is decided)."""
    uid = await _decided(host)
    await _recovery_holding_the_tool(host, tool, uid)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in host.sessions.Exec(exec_request(uid, "more"), timeout=WAIT_S):
            pass
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is decided" in (refused.value.details() or "")
    tool.release.set()


async def test_an_inputless_exec_meeting_any_other_holder_is_still_aborted(host: LiveHost) -> None:
    uid = await _decided(host)
    async with host.controller.guards.hold(uid):  # an operation of a client, not the recovery
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in host.sessions.Exec(session_pb2.ExecRequest(session=uid), timeout=WAIT_S):
                pass
    assert refused.value.code() == grpc.StatusCode.ABORTED
    assert "busy" in (refused.value.details() or "")
    assert common_pb2.EVENT_TOOL_RESULT not in [r.event.kind for r in await host.records(uid)]
