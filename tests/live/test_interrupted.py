"""No execution is left without END or ERROR: an Exec on a session whose last execution was cut
short (no END, no ERROR, and here no lease either: a journal written before leases, or a lease
lost) first recovers it, then runs the new turn; with recovery off it is refused, naming Resume,
and nothing is written."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from agentsessions.host.journal.store import JournalStore, SessionRow
from agentsessions.sdk import text_message
from agentsessions.v1 import common_pb2, session_pb2
from tests.live.world import TEST_SETTINGS, ends, exec_request, inputs_in_order, live_host

K = common_pb2.EventKind
LK = common_pb2.Lifecycle


async def interrupted_session(store: JournalStore) -> str:
    """A session whose one execution was cut right after its inputs were journaled."""
    uid = "sess-" + "ab" * 12
    await store.create_session(SessionRow(uid=uid, project="default", harness="echo"))
    start = common_pb2.Event(
        execution_id="00000000000000aa",
        kind=K.EVENT_EXECUTION_START,
        execution_start=common_pb2.ExecutionStart(input_count=1, harness="echo", harness_version="1"),
    )
    first = common_pb2.Event(
        execution_id="00000000000000aa", kind=K.EVENT_INPUT, message=text_message("user", "first")
    )
    await store.append(uid, [start, first], expected_head=0, fence=0, mint_fence=True)
    return uid


async def test_an_exec_on_an_interrupted_session_recovers_it_first(store: JournalStore) -> None:
    uid = await interrupted_session(store)
    async with live_host(store) as host:
        before = await host.client.get_session(uid)
        assert before.exec_state == session_pb2.EXEC_RUNNING
        stale = exec_request(uid, "next")
        stale.expected_last_seq = 1
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [u async for u in host.sessions.Exec(stale)]
        assert err.value.code() == grpc.StatusCode.ABORTED  # checked before the recovery writes
        assert len(await host.records(uid)) == 2
        fresh = exec_request(uid, "next")
        fresh.expected_last_seq = 2  # the head the caller saw, before the recovery
        streamed = [u.record async for u in host.sessions.Exec(fresh) if u.WhichOneof("update") == "record"]
        records = await host.records(uid)
        after = await host.client.get_session(uid)
    kinds = [K.Name(r.event.kind) for r in records]
    assert kinds == [
        "EVENT_EXECUTION_START",
        "EVENT_INPUT",
        "EVENT_MODEL_CALL",
        "EVENT_OUTPUT",
        "EVENT_END",
        "EVENT_LIFECYCLE",
        "EVENT_EXECUTION_START",
        "EVENT_INPUT",
        "EVENT_MODEL_CALL",
        "EVENT_OUTPUT",
        "EVENT_END",
    ]
    assert records[5].event.lifecycle.kind == LK.LIFECYCLE_RESUME
    assert [e.event.end.state for e in ends(records)] == ["COMPLETED", "COMPLETED"]
    assert ends(records)[0].event.execution_id == "00000000000000aa"
    assert streamed == records[6:]  # the Exec streams its own turn
    assert inputs_in_order(records) == ["first", "next"]
    assert after.exec_state == session_pb2.EXEC_COMPLETED
    assert await store.verify(uid) == 11


async def test_with_recovery_off_the_exec_is_refused_naming_resume(store: JournalStore) -> None:
    uid = await interrupted_session(store)
    async with live_host(store, settings=dataclasses.replace(TEST_SETTINGS, recover=False)) as host:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [u async for u in host.client.exec(uid, "next")]
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "Resume" in (err.value.details() or "")
        assert len(await host.records(uid)) == 2
        await host.client.resume(uid)
        done = [u async for u in host.client.exec(uid, "next")]
        assert done[-1].record.event.end.state == "COMPLETED"
        assert [e.event.end.state for e in ends(await host.records(uid))] == ["COMPLETED", "COMPLETED"]
