"""LiveSessions.Submit on an in-process host: admitted exactly as Exec (same validation, CAS and
statuses), returns once durably admitted, the turn runs with no caller; on_busy REJECT, ENQUEUE
(queued in order, visible to watchers) and INTERRUPT (cancelled as Cancel does, then run); and the
host flag that lets plain Exec turns outlive their caller."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentsessions.ext.v1 import live_pb2
from agentsessions.host.controller.live import LiveSettings
from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.live.world import (
    TEST_SETTINGS,
    WAIT_S,
    LiveHost,
    ends,
    exec_request,
    inputs_in_order,
    live_host,
    submit_request,
)

K = common_pb2.EventKind
LK = common_pb2.Lifecycle


async def test_submit_returns_once_admitted_and_the_turn_runs_with_no_caller(host: LiveHost) -> None:
    uid = await host.create()
    response = await host.live.Submit(submit_request(uid, "hi"))
    assert not response.queued
    assert response.start_seq == 1 and response.execution_id
    assert response.session.metadata.uid == uid
    assert response.session.exec_state == session_pb2.EXEC_RUNNING
    records = await host.records(uid)
    assert [r.event.kind for r in records] == [K.EVENT_EXECUTION_START, K.EVENT_INPUT]  # durable already
    assert records[0].event.execution_id == response.execution_id
    assert await host.harness.next_started() == "hi"
    host.harness.open("hi")
    records = await host.wait_for(uid, lambda rs: bool(ends(rs)), "the turn's END")
    assert [K.Name(r.event.kind) for r in records] == [
        "EVENT_EXECUTION_START",
        "EVENT_INPUT",
        "EVENT_MODEL_CALL",
        "EVENT_OUTPUT",
        "EVENT_END",
    ]
    assert ends(records)[0].event.end.state == "COMPLETED"


async def test_submit_without_a_session_creates_one(host: LiveHost) -> None:
    response = await host.live.Submit(
        live_pb2.SubmitRequest(
            exec=session_pb2.ExecRequest(harness="echo", inputs=[exec_request("", "x").inputs[0]])
        )
    )
    uid = response.session.metadata.uid
    assert uid.startswith("sess-") and response.start_seq == 1
    records = await host.wait_for(uid, lambda rs: bool(ends(rs)), "the turn's END")
    assert inputs_in_order(records) == ["x"]


@pytest.mark.parametrize(
    ("request_", "code", "message"),
    [
        (live_pb2.SubmitRequest(), grpc.StatusCode.INVALID_ARGUMENT, "exec: is required"),
        (
            live_pb2.SubmitRequest(exec=session_pb2.ExecRequest(session="sess-000000000000000000000000")),
            grpc.StatusCode.NOT_FOUND,
            "not found",
        ),
        (
            live_pb2.SubmitRequest(
                exec=session_pb2.ExecRequest(inputs=[common_pb2.Message(parts=[common_pb2.Part()])])
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "exec.inputs[0].role",
        ),
        (
            live_pb2.SubmitRequest(exec=session_pb2.ExecRequest(harness="Not A Label")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "exec.harness",
        ),
        (
            live_pb2.SubmitRequest(exec=session_pb2.ExecRequest(), on_busy=7),  # type: ignore[arg-type]
            grpc.StatusCode.INVALID_ARGUMENT,
            "on_busy",
        ),
    ],
)
async def test_submit_refuses_what_exec_refuses(
    host: LiveHost, request_: live_pb2.SubmitRequest, code: grpc.StatusCode, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.live.Submit(request_)
    assert err.value.code() == code
    assert message in (err.value.details() or "")


async def test_submit_checks_expected_last_seq_as_exec_does(host: LiveHost) -> None:
    uid = await host.create("echo")
    stale = exec_request(uid, "x")
    stale.expected_last_seq = 3
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.live.Submit(live_pb2.SubmitRequest(exec=stale))
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert await host.records(uid) == []
    fresh = exec_request(uid, "x")
    fresh.expected_last_seq = 0
    assert (await host.live.Submit(live_pb2.SubmitRequest(exec=fresh))).start_seq == 1
    queued = exec_request(uid, "y")
    queued.expected_last_seq = 5
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.live.Submit(live_pb2.SubmitRequest(exec=queued, on_busy=live_pb2.ON_BUSY_ENQUEUE))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "exec.expected_last_seq" in (err.value.details() or "")


async def test_reject_answers_aborted_while_a_turn_runs(host: LiveHost) -> None:
    uid = await host.create()
    await host.live.Submit(submit_request(uid, "first"))
    assert await host.harness.next_started() == "first"
    for on_busy in (live_pb2.ON_BUSY_UNSPECIFIED, live_pb2.ON_BUSY_REJECT):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.live.Submit(submit_request(uid, "second", on_busy))
        assert err.value.code() == grpc.StatusCode.ABORTED
    host.harness.open("first")
    records = await host.wait_for(uid, lambda rs: bool(ends(rs)), "the first turn's END")
    assert inputs_in_order(records) == ["first"]


async def test_enqueue_runs_queued_turns_next_in_order_and_watchers_see_the_queue(host: LiveHost) -> None:
    uid = await host.create()
    queues: list[list[str]] = []
    drained = asyncio.Event()

    async def follow() -> None:
        async for update in host.client.watch(uid):
            if update.HasField("queue"):
                queues.append([t.execution_id for t in update.queue.turns])
                if queues[-1] == [] and len(queues) > 1:
                    drained.set()
                    return

    watcher = asyncio.create_task(follow())
    first = await host.live.Submit(submit_request(uid, "a"))
    assert await host.harness.next_started() == "a"
    b = await host.live.Submit(submit_request(uid, "b", live_pb2.ON_BUSY_ENQUEUE))
    c = await host.live.Submit(submit_request(uid, "c", live_pb2.ON_BUSY_ENQUEUE))
    for queued in (b, c):
        assert queued.queued and not queued.execution_id and queued.start_seq == 0
        assert queued.queued_execution_id
    # A plain turn does not jump the queue.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.live.Submit(submit_request(uid, "late"))
    assert err.value.code() == grpc.StatusCode.ABORTED
    for text in ("a", "b", "c"):
        host.harness.open(text)
    records = await host.wait_for(uid, lambda rs: len(ends(rs)) == 3, "three ENDs")
    assert inputs_in_order(records) == ["a", "b", "c"]
    starts = [r.event.execution_id for r in records if r.event.kind == K.EVENT_EXECUTION_START]
    assert starts == [first.execution_id, b.queued_execution_id, c.queued_execution_id]
    assert all(e.event.end.state == "COMPLETED" for e in ends(records))
    async with asyncio.timeout(WAIT_S):
        await drained.wait()
    await watcher
    assert [b.queued_execution_id, c.queued_execution_id] in queues
    assert queues[-1] == []


async def test_enqueue_on_an_idle_session_runs_at_once(host: LiveHost) -> None:
    uid = await host.create("echo")
    response = await host.live.Submit(submit_request(uid, "now", live_pb2.ON_BUSY_ENQUEUE))
    assert not response.queued and response.start_seq == 1


async def test_interrupt_cancels_the_running_turn_as_cancel_does_then_runs(host: LiveHost) -> None:
    uid = await host.create()
    first = await host.live.Submit(submit_request(uid, "long"))
    assert await host.harness.next_started() == "long"
    second = await host.live.Submit(submit_request(uid, "now", live_pb2.ON_BUSY_INTERRUPT))
    assert not second.queued and second.execution_id != first.execution_id
    host.harness.open("now")
    records = await host.wait_for(uid, lambda rs: len(ends(rs)) == 2, "both ENDs")
    by_kind = [(K.Name(r.event.kind), r.event.execution_id) for r in records]
    cut = next(i for i, r in enumerate(records) if r.event.kind == K.EVENT_END)
    assert records[cut].event.execution_id == first.execution_id
    assert records[cut].event.end.state == "CANCELED"
    assert "interrupted by a newer turn" in records[cut].event.end.error.description
    assert records[cut + 1].event.lifecycle.kind == LK.LIFECYCLE_CANCEL
    assert by_kind[cut + 2] == ("EVENT_EXECUTION_START", second.execution_id)
    assert records[-1].event.end.state == "COMPLETED"
    assert inputs_in_order(records) == ["long", "now"]


async def test_interrupt_goes_ahead_of_queued_turns(host: LiveHost) -> None:
    uid = await host.create()
    await host.live.Submit(submit_request(uid, "a"))
    assert await host.harness.next_started() == "a"
    await host.live.Submit(submit_request(uid, "queued", live_pb2.ON_BUSY_ENQUEUE))
    await host.live.Submit(submit_request(uid, "urgent", live_pb2.ON_BUSY_INTERRUPT))
    host.harness.open("urgent")
    host.harness.open("queued")
    records = await host.wait_for(uid, lambda rs: len(ends(rs)) == 3, "three ENDs")
    assert inputs_in_order(records) == ["a", "urgent", "queued"]
    assert [e.event.end.state for e in ends(records)] == ["CANCELED", "COMPLETED", "COMPLETED"]


async def test_a_plain_exec_turn_is_cancelled_when_its_caller_leaves(host: LiveHost) -> None:
    uid = await host.create()
    call = host.sessions.Exec(exec_request(uid, "bye"))
    assert (await call.read()).WhichOneof("update") == "session"
    assert await host.harness.next_started() == "bye"
    call.cancel()
    records = await host.wait_for(
        uid, lambda rs: any(r.event.kind == K.EVENT_ERROR for r in rs), "the caller-went-away ERROR"
    )
    assert records[-1].event.error.description == "execution cancelled: the caller went away"
    assert ends(records) == []
    # The cancelled turn lets go of the session just after its ERROR is durable.
    async with host.controller.guards.hold_when_free(uid):
        pass
    # Not interrupted work: a new turn runs, and nothing recovers the abandoned one.
    host.harness.open("next")
    after = [u async for u in host.client.exec(uid, "next")]
    assert after[-1].record.event.end.state == "COMPLETED"
    assert inputs_in_order(await host.records(uid)) == ["bye", "next"]


async def test_with_detach_exec_a_plain_exec_turn_outlives_its_caller(store: JournalStore) -> None:
    settings = LiveSettings(**{**TEST_SETTINGS.__dict__, "detach_exec": True})
    async with live_host(store, settings=settings) as host:
        uid = await host.create()
        call = host.sessions.Exec(exec_request(uid, "stay"))
        assert (await call.read()).WhichOneof("update") == "session"
        assert await host.harness.next_started() == "stay"
        call.cancel()
        host.harness.open("stay")
        records = await host.wait_for(uid, lambda rs: bool(ends(rs)), "the END")
        assert ends(records)[0].event.end.state == "COMPLETED"
        assert not any(r.event.kind == K.EVENT_ERROR for r in records)
        # A caller that stays sees the same stream as without the flag.
        async with host.controller.guards.hold_when_free(uid):
            pass  # the detached turn lets go of the session just after its END
        host.harness.open("again")
        kinds = [u.WhichOneof("update") for u in [u async for u in host.client.exec(uid, "again")]]
        assert kinds[0] == "session" and kinds.count("record") == 5
