"""Cancel over the real wire (the reference leaves it UNIMPLEMENTED; docs/approvals.md says what
this host does).

Cancel of a running turn stops it: an in-process harness's task is cancelled, a remote harness
gets a Cancel frame. The host journals END{CANCELED} and a LIFECYCLE_CANCEL marker, the
session reads EXEC_CANCELED and the Exec stream ends CANCELLED. A turn parked on an approval is
closed the same way. Cancel of an idle or finished session returns it unchanged; Cancel is
idempotent.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.calls import StampTool, approve, get, journal, kinds, new_session, records, resume, say
from tests.approvals.harnesses import BlockingHarness, ToolHarness
from tests.approvals.raw_peer import Conversation, raw_peer
from tests.lifecycle.held import HeldDescribe, until, wait_for
from tests.lifecycle.streams import BackgroundExec
from tests.support.host import HostUnderTest, running_host, text_output
from tests.support.processes import HarnessProcess

K = common_pb2.EventKind
LK = common_pb2.Lifecycle.Kind


async def cancel(
    host: HostUnderTest, uid: str, reason: str = "", execution_id: str = ""
) -> session_pb2.Session:
    session: session_pb2.Session = await host.sessions.Cancel(
        session_pb2.CancelRequest(session=uid, execution_id=execution_id, reason=reason)
    )
    return session


def assert_cancelled_tail(recs: list[common_pb2.LogRecord], execution_id: str, reason: str) -> None:
    end, marker = recs[-2].event, recs[-1].event
    assert end.kind == K.EVENT_END and end.execution_id == execution_id
    assert end.end.state == "CANCELED" and end.end.error.description == reason
    assert marker.kind == K.EVENT_LIFECYCLE and not marker.execution_id
    assert marker.lifecycle.kind == LK.LIFECYCLE_CANCEL and marker.lifecycle.detail == reason


async def check_cancel_of_running_turn(host: HostUnderTest, store: JournalStore, harness: str) -> None:
    uid = await new_session(host, harness)
    run = BackgroundExec(host, say(uid, "go"))
    execution_id = await run.started()
    assert (await get(host, uid)).exec_state == session_pb2.EXEC_RUNNING

    cancelled = await cancel(host, uid, "user pressed stop")
    assert cancelled.exec_state == session_pb2.EXEC_CANCELED
    code, details = await run.outcome()
    assert code == grpc.StatusCode.CANCELLED
    assert "user pressed stop" in details
    recs = await journal(store, uid)
    assert kinds(recs) == ["EXECUTION_START", "INPUT", "OUTPUT", "END", "LIFECYCLE"]
    assert_cancelled_tail(recs, execution_id, "user pressed stop")
    assert run.records() == recs, "the stream relayed every record before its CANCELLED status"
    assert await store.verify(uid) == 5

    again = await cancel(host, uid, "and again")
    assert again == await get(host, uid)
    assert again.exec_state == session_pb2.EXEC_CANCELED and again.last_seq == 5
    assert len(await journal(store, uid)) == 5, "a second Cancel journals nothing"

    # The session goes on: a new turn (on the echo harness), and a controller replay that skips the
    # cancelled execution (its harness stopped at an arbitrary point) and re-runs the rest.
    follow = records(await host.exec(say(uid, "after", harness="echo")))
    assert kinds(follow)[-1] == "END"
    report = await host.controller.replay(uid)
    assert (report.executions, report.model_calls) == (1, 0)
    assert report.outputs == ["echo:after"]


async def test_cancel_a_running_in_process_turn(store: JournalStore) -> None:
    async with running_host(store, local={"blocker": BlockingHarness()}) as host:
        await check_cancel_of_running_turn(host, store, "blocker")


async def test_cancel_a_running_turn_of_a_harness_process(
    store: JournalStore, blocker_process: HarnessProcess
) -> None:
    async with running_host(store, remote={"blocker": blocker_process.address}) as host:
        await check_cancel_of_running_turn(host, store, "blocker")


async def test_the_cancel_frame_on_the_wire(store: JournalStore) -> None:
    async def script(conversation: Conversation) -> None:
        conversation.send(text_output("working"))
        frame = await conversation.recv()
        reason = frame.cancel.reason if frame is not None else ""
        conversation.send(
            common_pb2.Event(
                kind=K.EVENT_END,
                end=common_pb2.HarnessEnd(state="CANCELED", error=common_pb2.Error(description=reason)),
            )
        )

    async with raw_peer(script) as (address, peer), running_host(store, remote={"raw": address}) as host:
        uid = await new_session(host, "raw")
        run = BackgroundExec(host, say(uid, "go"))
        execution_id = await run.started()
        await cancel(host, uid, "enough")
        assert (await run.outcome())[0] == grpc.StatusCode.CANCELLED
        (conversation,) = peer.conversations
        (frame,) = conversation.received
        assert frame.WhichOneof("frame") == "cancel" and frame.cancel.reason == "enough"
        assert (frame.session, frame.execution_id) == (uid, execution_id)
        assert_cancelled_tail(await journal(store, uid), execution_id, "enough")


async def test_cancel_names_the_execution_it_means(store: JournalStore) -> None:
    async with running_host(store, local={"blocker": BlockingHarness()}) as host:
        uid = await new_session(host, "blocker")
        run = BackgroundExec(host, say(uid, "go"))
        execution_id = await run.started()
        other = await cancel(host, uid, "wrong turn", execution_id="ffffffffffffffff")
        assert other.exec_state == session_pb2.EXEC_RUNNING, "Cancel of another execution is a no-op"
        await cancel(host, uid, "right turn", execution_id=execution_id)
        assert (await run.outcome())[0] == grpc.StatusCode.CANCELLED
        assert_cancelled_tail(await journal(store, uid), execution_id, "right turn")


async def test_cancel_of_an_idle_or_finished_session_returns_it_unchanged(store: JournalStore) -> None:
    async with running_host(store) as host:
        uid = await new_session(host, "echo")
        before = await get(host, uid)
        assert await cancel(host, uid, "nothing to stop") == before
        assert before.exec_state == session_pb2.EXEC_PENDING
        await host.exec(say(uid, "hi"))
        finished = await get(host, uid)
        assert await cancel(host, uid, "too late") == finished
        assert finished.exec_state == session_pb2.EXEC_COMPLETED
        assert len(await journal(store, uid)) == 5

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await cancel(host, "sess-000000000000000000000000")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await cancel(host, "")
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_cancel_closes_a_turn_parked_on_an_approval(
    store: JournalStore, tooler_process: HarnessProcess
) -> None:
    stamp = StampTool(store)
    async with running_host(store, remote={"tooler": tooler_process.address}, tools=stamp.registry()) as host:
        uid = await new_session(host, "tooler")
        updates = await host.exec(say(uid, "hi"))
        ref = updates[-1].session.pending_approval
        cancelled = await cancel(host, uid, "not needed any more")
        assert cancelled.exec_state == session_pb2.EXEC_CANCELED
        assert not cancelled.HasField("pending_approval")
        recs = await journal(store, uid)
        assert kinds(recs)[-3:] == ["LIFECYCLE", "END", "LIFECYCLE"]
        assert_cancelled_tail(recs, ref.execution_id, "not needed any more")

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await approve(host, ref, True, session=uid)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (await cancel(host, uid, "again")).last_seq == len(recs)
        resumed = await resume(host, uid)
        assert resumed.exec_state == session_pb2.EXEC_CANCELED, "nothing to re-drive"
        follow = records(await host.exec(say(uid, "next", config=b'{"calls": []}')))
        assert kinds(follow)[-1] == "END"
        assert stamp.runs == []
        report = await host.controller.replay(uid)
        assert report.executions == 1 and report.model_calls == 0


# -- Cancel while the turn is still being admitted ----------------------------------------------


async def test_cancel_while_an_exec_is_in_its_describe_ends_that_turn_canceled(store: JournalStore) -> None:
    harness = HeldDescribe(EchoHarness())
    async with running_host(store, local={"held": harness}) as host:
        uid = await new_session(host, "held")
        harness.hold()
        run = BackgroundExec(host, say(uid, "go"))
        await wait_for("the Exec's Describe", harness.entered)
        # The session is held by the Exec's admission; no turn is driven yet.
        assert host.controller.guards.busy(uid) and uid not in host.controller._core.driver.running
        cancelling = asyncio.create_task(cancel(host, uid, "stopped before it ran"))
        # Let the Describe go only once the host has taken the Cancel in (or answered it).
        await until(
            "the Cancel armed", lambda: cancelling.done() or host.controller.guards.armed(uid) is not None
        )
        harness.release()
        cancelled = await cancelling
        assert cancelled.exec_state == session_pb2.EXEC_CANCELED
        code, details = await run.outcome()
        assert code == grpc.StatusCode.CANCELLED
        assert "stopped before it ran" in details
        recs = await journal(store, uid)
        assert kinds(recs) == ["EXECUTION_START", "INPUT", "END", "LIFECYCLE"]
        assert_cancelled_tail(recs, recs[0].event.execution_id, "stopped before it ran")
        assert run.records() == recs
        assert harness.runs == 0, "the cancelled turn's harness never ran"
        assert await store.verify(uid) == 4
        # The session takes the next turn at once.
        follow = records(await host.exec(say(uid, "after")))
        assert kinds(follow)[-1] == "END" and harness.runs == 1


async def test_cancel_naming_another_execution_leaves_a_turn_in_its_describe_alone(
    store: JournalStore,
) -> None:
    harness = HeldDescribe(EchoHarness())
    async with running_host(store, local={"held": harness}) as host:
        uid = await new_session(host, "held")
        harness.hold()
        run = BackgroundExec(host, say(uid, "go"))
        await wait_for("the Exec's Describe", harness.entered)
        cancelling = asyncio.create_task(cancel(host, uid, "not that one", execution_id="ffffffffffffffff"))
        await until(
            "the Cancel armed", lambda: cancelling.done() or host.controller.guards.armed(uid) is not None
        )
        harness.release()
        await cancelling
        assert (await run.outcome())[0] == grpc.StatusCode.OK
        assert kinds(await journal(store, uid))[-1] == "END"
        assert (await get(host, uid)).exec_state == session_pb2.EXEC_COMPLETED


async def test_cancel_while_an_inputless_exec_recovers_a_parked_turn_closes_it(store: JournalStore) -> None:
    stamp = StampTool(store)
    harness = HeldDescribe(ToolHarness())
    async with running_host(store, local={"tooler": harness}, tools=stamp.registry()) as host:
        uid = await new_session(host, "tooler")
        updates = await host.exec(say(uid, "hi"))
        ref = updates[-1].session.pending_approval
        harness.hold()
        recovering = BackgroundExec(host, session_pb2.ExecRequest(session=uid))
        await wait_for("the recovering Exec's Describe", harness.entered)
        cancelling = asyncio.create_task(cancel(host, uid, "not needed any more"))
        await until(
            "the Cancel armed", lambda: cancelling.done() or host.controller.guards.armed(uid) is not None
        )
        harness.release()
        cancelled = await cancelling  # (was: ABORTED, the session busy with the recovering Exec)
        assert cancelled.exec_state == session_pb2.EXEC_CANCELED
        assert (await recovering.outcome())[0] == grpc.StatusCode.OK  # it found the gate undecided
        recs = await journal(store, uid)
        assert kinds(recs)[-3:] == ["LIFECYCLE", "END", "LIFECYCLE"]
        assert_cancelled_tail(recs, ref.execution_id, "not needed any more")
        assert stamp.runs == []
