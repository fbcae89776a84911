"""The host's side of the approval exchange, frame by frame, against a raw peer (spec 5.5; 6.1
``TestWireApprovalFailedAckPreservesDurableRequest``, 6.3 park and reply round trips)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest
from google.protobuf import struct_pb2

from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.approvals.calls import StampTool, approve, get, journal, kinds, new_session, records, say
from tests.approvals.raw_peer import Conversation, end_event, parked_event, raw_peer, tool_call_event
from tests.support.host import running_host

K = common_pb2.EventKind


def gated_call() -> common_pb2.ToolCall:
    args = struct_pb2.Struct()
    args.update({"text": "raw"})
    return common_pb2.ToolCall(
        id="g1",
        tool="stamp",
        args=args,
        mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL,
        idempotency_key="key-g1",
    )


Ack = Callable[[Conversation, common_pb2.ApprovalRef], None]


def good_ack(conversation: Conversation, ref: common_pb2.ApprovalRef) -> None:
    conversation.send(parked_event(ref))


def bare_ack(conversation: Conversation, ref: common_pb2.ApprovalRef) -> None:
    conversation.send(common_pb2.Event(kind=K.EVENT_PARKED))


def wrong_seq_ack(conversation: Conversation, ref: common_pb2.ApprovalRef) -> None:
    wrong = common_pb2.ApprovalRef()
    wrong.CopyFrom(ref)
    wrong.request_seq += 1
    conversation.send(parked_event(wrong))


def end_instead(conversation: Conversation, ref: common_pb2.ApprovalRef) -> None:
    conversation.send(end_event())


def extra_after_ack(conversation: Conversation, ref: common_pb2.ApprovalRef) -> None:
    conversation.send(parked_event(ref))
    conversation.send(end_event())


def no_ack(conversation: Conversation, ref: common_pb2.ApprovalRef) -> None:
    pass


class Peer:
    """Sends the gated call; answers a park with ``first_ack`` once, then acknowledges properly;
    after a decision it reads the receipt and ends COMPLETED."""

    def __init__(self, first_ack: Ack) -> None:
        self.acks = [first_ack]

    async def __call__(self, conversation: Conversation) -> None:
        conversation.send(tool_call_event(gated_call()))
        frame = await conversation.recv()
        assert frame is not None
        kind = frame.WhichOneof("frame")
        if kind == "park":
            ack = self.acks.pop() if self.acks else good_ack
            ack(conversation, frame.park)
            return
        if kind == "approval":
            await conversation.recv()
            conversation.send(end_event())


def frame_kinds(frames: list[harness_pb2.ControllerFrame]) -> list[str | None]:
    return [f.WhichOneof("frame") for f in frames]


async def test_park_frame_ack_and_decided_reply_frames(store: JournalStore) -> None:
    stamp = StampTool(store)
    async with (
        raw_peer(Peer(good_ack)) as (address, peer),
        running_host(store, remote={"raw": address}, tools=stamp.registry()) as host,
    ):
        uid = await new_session(host, "raw")
        updates = await host.exec(say(uid, "hi"))
        assert kinds(records(updates)) == [
            "EXECUTION_START",
            "INPUT",
            "TOOL_CALL",
            "APPROVAL_REQUEST",
            "LIFECYCLE",
        ]
        (first,) = peer.conversations
        execution_id = first.execution_id
        (park,) = first.received
        assert (park.session, park.execution_id) == (uid, execution_id)
        assert park.park == common_pb2.ApprovalRef(
            execution_id=execution_id, tool_call_id="g1", request_seq=4
        )
        final = updates[-1].session
        assert final.exec_state == session_pb2.EXEC_AWAITING and final.pending_approval == park.park

        decision = (await approve(host, park.park, True, "go", session=uid)).decision
        recovered = records(await host.exec(session_pb2.ExecRequest(session=uid)))
        assert kinds(recovered) == ["TOOL_RESULT", "END"]
        second = peer.conversations[1]
        assert second.execution_id == execution_id, "recovery re-drives the same execution"
        assert [m.parts[0].text.text for m in second.start.start.inputs] == ["hi"]
        assert frame_kinds(second.received) == ["approval", "tool"]
        approval, tool = second.received
        for frame in (approval, tool):
            assert (frame.session, frame.execution_id) == (uid, execution_id)
        assert approval.approval == common_pb2.ApprovalResult(
            tool_call_id="g1", approved=True, reason="go", request_seq=4
        )
        assert tool.tool == recovered[0].event.result
        assert (tool.tool.approval_request_seq, tool.tool.approval_decision_seq) == (4, decision.seq)
        assert tool.tool.output == struct_pb2.Struct(fields={"stamped": struct_pb2.Value(string_value="raw")})
        assert len(stamp.runs) == 1


@pytest.mark.parametrize(
    "first_ack",
    [bare_ack, wrong_seq_ack, end_instead, extra_after_ack, no_ack],
    ids=["bare-parked", "wrong-request-seq", "end-instead", "event-after-ack", "no-ack"],
)
async def test_a_failed_park_acknowledgement_keeps_the_durable_request(
    store: JournalStore, first_ack: Ack
) -> None:
    stamp = StampTool(store)
    async with (
        raw_peer(Peer(first_ack)) as (address, _),
        running_host(store, remote={"raw": address}, tools=stamp.registry()) as host,
    ):
        uid = await new_session(host, "raw")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(say(uid, "hi"))
        assert err.value.code() == grpc.StatusCode.INTERNAL
        recs = await journal(store, uid)
        assert kinds(recs) == ["EXECUTION_START", "INPUT", "TOOL_CALL", "APPROVAL_REQUEST", "ERROR"]
        got = await get(host, uid)
        assert got.exec_state == session_pb2.EXEC_AWAITING
        ref = got.pending_approval
        assert (ref.tool_call_id, ref.request_seq) == ("g1", 4)
        assert stamp.runs == []

        await approve(host, ref, True, session=uid)
        recovered = records(await host.exec(session_pb2.ExecRequest(session=uid)))
        assert kinds(recovered) == ["TOOL_RESULT", "END"]
        assert recovered[0].event.result.approval_request_seq == 4
        assert len(stamp.runs) == 1
        assert (await get(host, uid)).exec_state == session_pb2.EXEC_COMPLETED
