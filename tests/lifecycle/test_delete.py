"""DeleteSession over the real wire (the reference leaves it UNIMPLEMENTED; docs/approvals.md
says what this host does).

A deleted session is gone for every later call (NOT_FOUND) and never listed again, also after a
restart. Its journal rows are kept by default (an operator's audit trail, readable with the
journal tools) and dropped with ``--purge-on-delete``. A running turn is cancelled first, so the
harness is told and the journal records how the turn ended.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
import pytest

from agentsessions.host.app import build_app
from agentsessions.host.config import HostConfig
from agentsessions.host.journal import open_store
from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.calls import StampTool, config, journal, kinds, new_session, say
from tests.approvals.harnesses import BlockingHarness, ToolHarness
from tests.approvals.raw_peer import Conversation, raw_peer
from tests.lifecycle.streams import BackgroundExec
from tests.support.host import HostUnderTest, running_host, text_output
from tests.support.processes import HarnessProcess

K = common_pb2.EventKind
LK = common_pb2.Lifecycle.Kind
NotFoundCall = Callable[[HostUnderTest, str], Awaitable[object]]


async def delete(host: HostUnderTest, uid: str) -> session_pb2.Session:
    deleted: session_pb2.Session = await host.sessions.DeleteSession(
        session_pb2.DeleteSessionRequest(uid=uid)
    )
    return deleted


async def listed(host: HostUnderTest) -> list[str]:
    page = await host.sessions.ListSessions(session_pb2.ListSessionsRequest(page_size=500))
    return [s.metadata.uid for s in page.sessions]


async def _exec(host: HostUnderTest, uid: str) -> object:
    return await host.exec(say(uid, "hi"))


LATER_CALLS: dict[str, NotFoundCall] = {
    "GetSession": lambda h, uid: h.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid)),
    "DeleteSession": lambda h, uid: h.sessions.DeleteSession(session_pb2.DeleteSessionRequest(uid=uid)),
    "Exec": _exec,
    "Resume": lambda h, uid: h.sessions.Resume(session_pb2.ResumeRequest(session=uid)),
    "Suspend": lambda h, uid: h.sessions.Suspend(session_pb2.SuspendRequest(session=uid)),
    "Fork": lambda h, uid: h.sessions.Fork(session_pb2.ForkRequest(session=uid)),
    "Cancel": lambda h, uid: h.sessions.Cancel(session_pb2.CancelRequest(session=uid)),
    "Approve": lambda h, uid: h.sessions.Approve(
        session_pb2.ApproveRequest(
            session=uid, execution_id="0000000000000001", tool_call_id="c", request_seq=1, approved=True
        )
    ),
}


async def assert_gone(host: HostUnderTest, uid: str) -> None:
    for name, call in LATER_CALLS.items():
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(host, uid)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, name
    assert uid not in await listed(host)


async def test_a_deleted_session_is_gone_but_its_journal_is_kept(
    store: JournalStore, journal_path: str
) -> None:
    async with running_host(store) as host:
        uid = await new_session(host, "echo", metadata=common_pb2.ResourceMetadata(name="doomed"))
        keep = await new_session(host, "echo")
        await host.exec(say(uid, "hi"))
        assert uid in await listed(host)
        deleted = await delete(host, uid)
        assert deleted.metadata.uid == uid and deleted.metadata.name == "doomed"
        assert deleted.last_seq == 5 and deleted.exec_state == session_pb2.EXEC_COMPLETED
        await assert_gone(host, uid)
        assert await listed(host) == [keep]
        recs = await journal(store, uid)
        assert kinds(recs) == ["EXECUTION_START", "INPUT", "MODEL_CALL", "OUTPUT", "END"]
        assert await store.verify(uid) == 5
        # Replay answers a deleted session like an unknown one: an empty stream (the rows stay for audit).
        assert [r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid))] == []

    reopened = await open_store(journal_path)
    try:
        async with running_host(reopened) as host:
            await assert_gone(host, uid)
            assert len(await journal(reopened, uid)) == 5
    finally:
        await reopened.close()


async def test_purge_on_delete_drops_the_journal_and_tool_receipts(store: JournalStore) -> None:
    stamp = StampTool(store)
    async with running_host(
        store, local={"tooler": ToolHarness()}, tools=stamp.registry(), purge_on_delete=True
    ) as host:
        uid = await new_session(host, "tooler")
        recs = [
            u.record
            for u in await host.exec(say(uid, "hi", config=config(calls=[{"mediation": "mediated"}])))
            if u.WhichOneof("update") == "record"
        ]
        key = next(r.event.tool.idempotency_key for r in recs if r.event.kind == K.EVENT_TOOL_CALL)
        assert await store.get_tool_receipt(uid, key) is not None
        await delete(host, uid)
        await assert_gone(host, uid)
        assert await journal(store, uid) == []
        assert [r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid))] == []
        assert await store.get_tool_receipt(uid, key) is None


async def test_the_purge_flag_reaches_the_controller() -> None:
    for purge in (False, True):
        app = await build_app(HostConfig(listen="127.0.0.1:0", journal="memory:", purge_on_delete=purge))
        try:
            assert app.controller is not None and app.controller.purge_on_delete is purge
        finally:
            await app.close()


async def test_deleting_a_running_in_process_turn_cancels_it_first(store: JournalStore) -> None:
    async with running_host(store, local={"blocker": BlockingHarness()}) as host:
        uid = await new_session(host, "blocker")
        run = BackgroundExec(host, say(uid, "go"))
        execution_id = await run.started()
        deleted = await delete(host, uid)
        assert deleted.metadata.uid == uid
        assert (await run.outcome())[0] == grpc.StatusCode.CANCELLED
        recs = await journal(store, uid)
        assert kinds(recs) == ["EXECUTION_START", "INPUT", "OUTPUT", "END", "LIFECYCLE"]
        assert recs[3].event.end.state == "CANCELED" and recs[3].event.execution_id == execution_id
        assert recs[4].event.lifecycle.kind == LK.LIFECYCLE_CANCEL
        assert recs[4].event.lifecycle.detail == "session deleted"
        await assert_gone(host, uid)


async def test_deleting_a_running_remote_turn_tells_the_harness(store: JournalStore) -> None:
    async def script(conversation: Conversation) -> None:
        conversation.send(text_output("working"))
        await conversation.recv()
        conversation.send(common_pb2.Event(kind=K.EVENT_END, end=common_pb2.HarnessEnd(state="CANCELED")))

    async with raw_peer(script) as (address, peer), running_host(store, remote={"raw": address}) as host:
        uid = await new_session(host, "raw")
        run = BackgroundExec(host, say(uid, "go"))
        await run.started()
        await delete(host, uid)
        assert (await run.outcome())[0] == grpc.StatusCode.CANCELLED
        (conversation,) = peer.conversations
        assert [f.WhichOneof("frame") for f in conversation.received] == ["cancel"]
        assert conversation.received[0].cancel.reason == "session deleted"
        await assert_gone(host, uid)


async def test_deleting_a_parked_session(store: JournalStore, tooler_process: HarnessProcess) -> None:
    stamp = StampTool(store)
    async with running_host(store, remote={"tooler": tooler_process.address}, tools=stamp.registry()) as host:
        uid = await new_session(host, "tooler")
        updates = await host.exec(say(uid, "hi"))
        ref = updates[-1].session.pending_approval
        deleted = await delete(host, uid)
        assert deleted.exec_state == session_pb2.EXEC_AWAITING and deleted.pending_approval == ref
        await assert_gone(host, uid)
        assert stamp.runs == []
