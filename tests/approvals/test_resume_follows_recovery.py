"""A Resume that arrives while the host's own recovery holds the session (it continues a decided
approval two seconds after the decision, or finishes a turn a crash cut short) waits for that
recovery and answers with the session as it left it, instead of ABORTED "busy"; any other holder
still answers ABORTED at once."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.calls import StampTool, approve, config, new_session, records, say, sessions_of
from tests.approvals.harnesses import ToolHarness
from tests.chaos.scenario import wait_until
from tests.support.host import HostUnderTest, running_host

WAIT_S = 30.0


async def _parked_and_approved(host: HostUnderTest) -> str:
    """A session whose turn parked on an approval that is now decided (approved), not continued."""
    uid = await new_session(host, "tooler")
    parked = await host.exec(say(uid, "hi", config=config(calls=[{"mediation": "approval"}])))
    assert records(parked)
    await approve(host, sessions_of(parked)[-1].pending_approval, True, session=uid)
    return uid


async def test_a_resume_waits_for_the_hosts_own_recovery_instead_of_answering_busy(
    store: JournalStore,
) -> None:
    stamp = StampTool(store)
    async with running_host(store, local={"tooler": ToolHarness()}, tools=stamp.registry()) as host:
        uid = await _parked_and_approved(host)
        guards = host.controller.guards

        async with guards.hold(uid, recovery=True):  # as the recoverer holds it while it works
            resume = asyncio.ensure_future(host.sessions.Resume(session_pb2.ResumeRequest(session=uid)))
            await wait_until("the Resume to wait at the guard", lambda: guards.users(uid) == 2)
            assert not resume.done()

        async with asyncio.timeout(WAIT_S):
            resumed: session_pb2.Session = await resume
        assert resumed.exec_state == session_pb2.EXEC_COMPLETED
        assert len(stamp.runs) == 1
        kinds = [r.event.kind for r in await store.read(uid)]
        assert kinds.count(common_pb2.EVENT_END) == 1


async def test_a_resume_that_finds_another_operation_holding_the_session_is_still_aborted(
    store: JournalStore,
) -> None:
    stamp = StampTool(store)
    async with running_host(store, local={"tooler": ToolHarness()}, tools=stamp.registry()) as host:
        uid = await _parked_and_approved(host)

        async with host.controller.guards.hold(uid):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await host.sessions.Resume(session_pb2.ResumeRequest(session=uid), timeout=WAIT_S)
        assert refused.value.code() == grpc.StatusCode.ABORTED
        assert "busy" in (refused.value.details() or "")
        assert stamp.runs == []
