"""REQUIRES_APPROVAL over the real wire (spec 1.1 Approve, 4.6, 5.5; 6.1 approval_wire, 6.2 approval_*).

The harness runs in its own process (ToolHarness behind ``agentsessions-harness serve``): it asks
the echo model, then makes one gated ``stamp`` call. The host journals the intent and the
request, parks the execution, and the Exec ends OK with the awaiting Session. A decision is
journaled by Approve; recovery (Resume, or Exec without inputs) serves the decision and the
receipt; a controller replay then reproduces everything with no model call and no tool run.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from agentsessions.host.journal import open_store
from agentsessions.host.journal.store import JournalStore
from agentsessions.sdk.approval import DENIED_MESSAGE
from agentsessions.v1 import common_pb2, session_pb2
from tests.approvals.calls import (
    PARKED_KINDS,
    CountingEcho,
    StampTool,
    approve,
    config,
    get,
    journal,
    kinds,
    new_session,
    receipts_seen,
    records,
    resume,
    say,
    sessions_of,
)
from tests.support.host import HostUnderTest, counting_ids, running_host
from tests.support.processes import HarnessProcess

K = common_pb2.EventKind
LK = common_pb2.Lifecycle.Kind
ALICE = common_pb2.IdentityRef(principal="alice", issuer="tests", subject="u-1")


class Rig:
    """What the tests of one session share across host restarts."""

    def __init__(self, store: JournalStore, tooler: HarnessProcess) -> None:
        self.store = store
        self.tooler = tooler
        self.stamp = StampTool(store)
        self.model = CountingEcho()

    @contextlib.asynccontextmanager
    async def host(self, store: JournalStore | None = None) -> AsyncIterator[HostUnderTest]:
        if store is not None:
            self.store = store
            self.stamp.store = store
        async with running_host(
            self.store,
            remote={"tooler": self.tooler.address},
            tools=self.stamp.registry(),
            model=self.model,
            new_id=counting_ids(),
        ) as h:
            yield h


@pytest.fixture
def rig(store: JournalStore, tooler_process: HarnessProcess) -> Rig:
    return Rig(store, tooler_process)


async def park(host: HostUnderTest, uid: str, text: str = "hi", **kw: Any) -> list[session_pb2.ExecUpdate]:
    updates = await host.exec(say(uid, text, **kw))
    return updates


def pending(session: session_pb2.Session) -> common_pb2.ApprovalRef:
    assert session.HasField("pending_approval"), session
    return session.pending_approval


async def test_park_round_trip_journals_intent_and_request_then_ends_ok_awaiting(rig: Rig) -> None:
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        updates = await park(host, uid)
        assert updates[0].WhichOneof("update") == "session"
        assert updates[-1].WhichOneof("update") == "session", "a final Session frame follows the park"
        recs = records(updates)
        assert kinds(recs) == PARKED_KINDS
        call, request, marker = recs[4].event, recs[5].event, recs[6].event
        execution_id = recs[0].event.execution_id
        assert call.tool.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL
        assert call.tool.id == "call-0" and call.tool.idempotency_key == f"{execution_id}-0"
        assert request.execution_id == execution_id
        assert request.approval == common_pb2.ApprovalRequest(tool_call_id="call-0")
        assert marker.lifecycle.kind == LK.LIFECYCLE_SUSPEND and not marker.execution_id
        assert "END" not in kinds(recs) and "ERROR" not in kinds(recs)
        final = updates[-1].session
        assert final.exec_state == session_pb2.EXEC_AWAITING
        assert pending(final) == common_pb2.ApprovalRef(
            execution_id=execution_id, tool_call_id="call-0", request_seq=recs[5].seq
        )
        assert final.last_seq == 7
        got = await get(host, uid)
        assert got.exec_state == session_pb2.EXEC_AWAITING and pending(got) == pending(final)
        assert got.compute_state == session_pb2.COMPUTE_COLD
        assert rig.stamp.runs == [] and rig.model.invocations == 1
        assert await rig.store.verify(uid) == 7


async def test_approve_validates_the_request(rig: Rig) -> None:
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        ref = pending(sessions_of(await park(host, uid))[-1])
        invalid = [
            (
                session_pb2.ApproveRequest(
                    session=uid,
                    execution_id=ref.execution_id,
                    tool_call_id="call-0",
                    request_seq=ref.request_seq,
                ),
                "approved",
            ),
            (
                session_pb2.ApproveRequest(session=uid, tool_call_id="call-0", request_seq=6, approved=True),
                "execution_id",
            ),
            (
                session_pb2.ApproveRequest(
                    session=uid, execution_id=ref.execution_id, request_seq=6, approved=True
                ),
                "tool_call_id",
            ),
            (
                session_pb2.ApproveRequest(
                    session=uid,
                    execution_id=ref.execution_id,
                    tool_call_id="call-0",
                    request_seq=0,
                    approved=True,
                ),
                "request_seq",
            ),
            (
                session_pb2.ApproveRequest(
                    execution_id=ref.execution_id, tool_call_id="call-0", request_seq=6, approved=True
                ),
                "session",
            ),
        ]
        for request, field in invalid:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await host.sessions.Approve(request)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
            assert field in (err.value.details() or ""), err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await approve(host, ref, True, session="sess-000000000000000000000000")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        wrong = [
            common_pb2.ApprovalRef(execution_id=ref.execution_id, tool_call_id="call-0", request_seq=5),
            common_pb2.ApprovalRef(execution_id=ref.execution_id, tool_call_id="call-9", request_seq=6),
            common_pb2.ApprovalRef(execution_id="ffffffffffffffff", tool_call_id="call-0", request_seq=6),
        ]
        for stale in wrong:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await approve(host, stale, True, session=uid)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, stale
        assert (await rig.store.head(uid)).seq == 7, "refused decisions journal nothing"


async def test_decision_record_and_retries(rig: Rig) -> None:
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        ref = pending(sessions_of(await park(host, uid))[-1])
        response = await approve(host, ref, True, "looks fine", ALICE, session=uid)
        decision = response.decision
        assert decision.seq == 8
        event = decision.event
        assert event.kind == K.EVENT_APPROVAL_RESULT and event.execution_id == ref.execution_id
        assert event.approval_result == common_pb2.ApprovalResult(
            tool_call_id="call-0", approved=True, reason="looks fine", request_seq=ref.request_seq
        )
        assert event.actor == ALICE
        assert event.ts.seconds > 0
        assert (await rig.store.read(uid, 8, 8)) == [decision]
        assert response.session.metadata.uid == uid and response.session.last_seq == 8
        assert rig.stamp.runs == [], "Approve never runs the tool"
        assert rig.model.invocations == 1

        again = await approve(host, ref, True, "looks fine", ALICE, session=uid)
        assert again.decision == decision, "an exact retry returns the original record"
        for changed in [
            dict(approved=False, reason="looks fine", identity=ALICE),
            dict(approved=True, reason="other words", identity=ALICE),
            dict(approved=True, reason="looks fine", identity=common_pb2.IdentityRef(principal="bob")),
            dict(approved=True, reason="looks fine", identity=None),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await approve(host, ref, session=uid, **changed)  # type: ignore[arg-type]
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, changed
        assert (await rig.store.head(uid)).seq == 8

        await resume(host, uid)
        later = await approve(host, ref, True, "looks fine", ALICE, session=uid)
        assert later.decision == decision, "retries return the original record even after the receipt"


async def test_omitted_identity_equals_an_empty_one(rig: Rig) -> None:
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        ref = pending(sessions_of(await park(host, uid))[-1])
        first = await approve(host, ref, False, session=uid)
        assert not first.decision.event.HasField("actor")
        retry = await approve(host, ref, False, identity=common_pb2.IdentityRef(), session=uid)
        assert retry.decision == first.decision


def expected_receipt(outcome: str, request_seq: int, decision_seq: int) -> common_pb2.ToolResult:
    receipt = common_pb2.ToolResult(
        id="call-0", approval_request_seq=request_seq, approval_decision_seq=decision_seq
    )
    if outcome == "deny":
        receipt.is_error = True
        receipt.code = common_pb2.ToolResult.APPROVAL_DENIED
        receipt.error = DENIED_MESSAGE
        receipt.content.add().text.text = DENIED_MESSAGE
    elif outcome == "executor-error":
        message = "RuntimeError: the stamp pad is dry"
        receipt.is_error = True
        receipt.code = common_pb2.ToolResult.EXECUTOR_ERROR
        receipt.error = message
        receipt.content.add().text.text = message
    else:
        receipt.output.update({"stamped": "echo:hi"})
    return receipt


@pytest.mark.parametrize("via", ["resume", "exec"])
@pytest.mark.parametrize("outcome", ["approve", "deny", "executor-error"])
async def test_recovery_serves_decision_then_receipt_and_replays_without_effects(
    rig: Rig, outcome: str, via: str
) -> None:
    if outcome == "executor-error":
        rig.stamp.fail_with = "the stamp pad is dry"
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        ref = pending(sessions_of(await park(host, uid))[-1])
        decision = (await approve(host, ref, outcome != "deny", f"{outcome} it", session=uid)).decision
        if via == "resume":
            session = await resume(host, uid)
            tail = await journal(rig.store, uid)
            tail = tail[decision.seq :]
            assert kinds(tail) == ["TOOL_RESULT", "OUTPUT", "END", "LIFECYCLE"]
            assert tail[-1].event.lifecycle.kind == LK.LIFECYCLE_RESUME
        else:
            updates = await host.exec(session_pb2.ExecRequest(session=uid))
            assert updates[0].WhichOneof("update") == "session"
            assert updates[-1].WhichOneof("update") == "session", "recovery ends with a final Session"
            tail = records(updates)
            assert kinds(tail) == ["TOOL_RESULT", "OUTPUT", "END"]
            session = updates[-1].session
        assert session.exec_state == session_pb2.EXEC_COMPLETED
        assert not session.HasField("pending_approval")
        receipt = tail[0].event.result
        assert tail[0].event.execution_id == ref.execution_id
        assert receipt == expected_receipt(outcome, ref.request_seq, decision.seq)
        # The harness in the other process got the same receipt (approval frame, then tool frame).
        (seen,) = receipts_seen(tail)
        assert seen["code"] == common_pb2.ToolResult.Code.Name(receipt.code)
        assert (seen["approval_request_seq"], seen["approval_decision_seq"]) == (
            ref.request_seq,
            decision.seq,
        )
        assert seen["is_error"] == receipt.is_error and seen["error"] == receipt.error
        runs = 0 if outcome == "deny" else 1
        assert len(rig.stamp.runs) == runs
        if runs:
            context, _ = rig.stamp.runs[0]
            assert context.idempotency_key == f"{ref.execution_id}-0", "the original key is re-driven"
            assert rig.stamp.intent_was_journaled == [True]
        assert rig.model.invocations == 1, "recovery serves the recorded completion"
        assert await rig.store.verify(uid) == len(await journal(rig.store, uid))

        before = await journal(rig.store, uid)
        report = await host.controller.replay(uid)
        assert (report.executions, report.model_calls) == (1, 0)
        assert rig.model.invocations == 1 and len(rig.stamp.runs) == runs
        assert await journal(rig.store, uid) == before, "replay is read-only"

        follow_up = records(await host.exec(say(uid, "again", config=config(calls=[]))))
        assert kinds(follow_up) == ["EXECUTION_START", "INPUT", "MODEL_CALL", "OUTPUT", "END"]


async def test_new_inputs_are_refused_until_the_receipt(rig: Rig) -> None:
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        ref = pending(sessions_of(await park(host, uid))[-1])
        for _ in ("undecided", "decided"):
            call = host.sessions.Exec(say(uid, "more"))
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call.read()  # refused before any frame
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "call-0" in (err.value.details() or "")
            if _ == "undecided":
                await approve(host, ref, True, session=uid)
        assert (await rig.store.head(uid)).seq == 8
        assert kinds(records(await host.exec(session_pb2.ExecRequest(session=uid))))[-1] == "END"
        assert kinds(records(await host.exec(say(uid, "more", config=config(calls=[])))))[-1] == "END"


async def test_undecided_recovery_returns_the_paused_session_without_running(rig: Rig) -> None:
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        ref = pending(sessions_of(await park(host, uid))[-1])
        resumed = await resume(host, uid)
        assert resumed.exec_state == session_pb2.EXEC_AWAITING and pending(resumed) == ref
        updates = await host.exec(session_pb2.ExecRequest(session=uid))
        assert records(updates) == []
        assert pending(updates[-1].session) == ref
        assert (await rig.store.head(uid)).seq == 7 and rig.model.invocations == 1


async def test_recovery_checks_expected_last_seq(rig: Rig) -> None:
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        ref = pending(sessions_of(await park(host, uid))[-1])
        await approve(host, ref, True, session=uid)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(session_pb2.ExecRequest(session=uid, expected_last_seq=7))
        assert err.value.code() == grpc.StatusCode.ABORTED
        assert (await rig.store.head(uid)).seq == 8
        recs = records(await host.exec(session_pb2.ExecRequest(session=uid, expected_last_seq=8)))
        assert kinds(recs) == ["TOOL_RESULT", "OUTPUT", "END"]


async def test_a_later_gate_parks_again_without_a_resume_marker(rig: Rig) -> None:
    two = config(calls=[{"id": "first"}, {"id": "second"}])
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        first = pending(sessions_of(await park(host, uid, config=two))[-1])
        assert first.tool_call_id == "first"
        await approve(host, first, True, session=uid)
        resumed = await resume(host, uid)
        second = pending(resumed)
        assert second.tool_call_id == "second" and second.execution_id == first.execution_id
        assert resumed.exec_state == session_pb2.EXEC_AWAITING
        tail = (await journal(rig.store, uid))[8:]
        assert kinds(tail) == ["TOOL_RESULT", "OUTPUT", "TOOL_CALL", "APPROVAL_REQUEST", "LIFECYCLE"]
        assert tail[-1].event.lifecycle.kind == LK.LIFECYCLE_SUSPEND, "parked again: no RESUME marker"
        assert second.request_seq == tail[3].seq
        await approve(host, second, False, session=uid)
        done = await resume(host, uid)
        assert done.exec_state == session_pb2.EXEC_COMPLETED
        assert [s["code"] for s in receipts_seen(await journal(rig.store, uid))] == [
            "CODE_UNSPECIFIED",
            "APPROVAL_DENIED",
        ]
        assert len(rig.stamp.runs) == 1
        report = await host.controller.replay(uid)
        assert report.model_calls == 0 and len(rig.stamp.runs) == 1


async def test_host_restarts_between_park_decision_and_receipt(rig: Rig, journal_path: str) -> None:
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        ref = pending(sessions_of(await park(host, uid))[-1])
    await rig.store.close()

    second = await open_store(journal_path)
    try:
        async with rig.host(second) as host:
            got = await get(host, uid)
            assert got.exec_state == session_pb2.EXEC_AWAITING and pending(got) == ref
            await approve(host, ref, True, "after a restart", ALICE, session=uid)
    finally:
        await second.close()

    third = await open_store(journal_path)
    try:
        async with rig.host(third) as host:
            got = await get(host, uid)
            assert got.exec_state == session_pb2.EXEC_AWAITING, "decided but not yet receipted"
            resumed = await resume(host, uid)
            assert resumed.exec_state == session_pb2.EXEC_COMPLETED
            recs = await journal(third, uid)
            assert kinds(recs)[7:] == ["APPROVAL_RESULT", "TOOL_RESULT", "OUTPUT", "END", "LIFECYCLE"]
            assert recs[8].event.result.approval_decision_seq == 8
            assert len(rig.stamp.runs) == 1 and rig.model.invocations == 1
            assert await third.verify(uid) == 12
            report = await host.controller.replay(uid)
            assert report.model_calls == 0 and len(rig.stamp.runs) == 1
    finally:
        await third.close()
        rig.store = await open_store(journal_path)  # the fixture closes it


async def test_fork_copied_requests_cannot_be_decided(rig: Rig) -> None:
    async with rig.host() as host:
        uid = await new_session(host, "tooler")
        ref = pending(sessions_of(await park(host, uid))[-1])
        forked = await host.sessions.Fork(session_pb2.ForkRequest(session=uid))
        (child,) = forked.children
        child_uid = child.metadata.uid
        assert not child.HasField("pending_approval")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await approve(host, ref, True, session=child_uid)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "fork" in (err.value.details() or "")
        head = (await rig.store.head(child_uid)).seq
        assert head == 8  # seven copied records and the FORK marker
        # The child may run a new turn; the parent's request stays decidable in the parent.
        recs = records(await host.exec(say(child_uid, "child turn", config=config(calls=[]))))
        assert kinds(recs)[-1] == "END"
        decided = await approve(host, ref, True, session=uid)
        assert decided.decision.seq == 8
