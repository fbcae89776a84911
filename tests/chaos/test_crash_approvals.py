"""Nothing lost on crash around an approval (spec 4.6, 5.5), with real processes.

The crash harness's tool call is REQUIRES_APPROVAL: the turn parks at it, the call is approved, and
the turn is resumed. The host is killed with SIGKILL while parked, inside the approved tool call, or
after its receipt; a new host on the same journal finishes the turn. The decision is journaled once,
the approved call's effect happens once, and the receipt names the request and the decision.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from agentsessions.v1 import common_pb2, session_pb2
from tests.chaos.scenario import (
    MODEL_CALLS,
    SCRIPT_KINDS,
    CrashScenario,
    kind_names,
    of_kind,
    verify_chain,
    wait_until,
)
from tests.support.crash_harness import REPORT_ID, TOOL_CALL_ID, USAGE, idempotency_key

pytestmark = pytest.mark.e2e

K = common_pb2.EventKind
LK = common_pb2.Lifecycle.Kind

# One approved turn: parked at the call, decided, resumed to the end (the script's turn with the
# approval request and result right after its TOOL_CALL).
_AT_TOOL_CALL = SCRIPT_KINDS.index(K.EVENT_TOOL_CALL) + 1
APPROVED_TURN_KINDS = [
    *SCRIPT_KINDS[:_AT_TOOL_CALL],
    K.EVENT_APPROVAL_REQUEST,
    K.EVENT_APPROVAL_RESULT,
    *SCRIPT_KINDS[_AT_TOOL_CALL:],
]


async def approve(world: CrashScenario, uid: str, ref: common_pb2.ApprovalRef) -> None:
    await world.host.sessions.Approve(
        session_pb2.ApproveRequest(
            session=uid,
            execution_id=ref.execution_id,
            tool_call_id=ref.tool_call_id,
            request_seq=ref.request_seq,
            approved=True,
            reason="chaos",
        ),
        timeout=60,
    )


@pytest.mark.parametrize("cut", ["after_park", "during_tool_call", "after_tool_call"])
class TestKillHostAroundApproval:
    async def test_approved_call_runs_once(self, scenario: CrashScenario, cut: str) -> None:
        turn = scenario.exec_turn(cut, approval=True)
        assert await turn.status() == grpc.StatusCode.OK
        parked = turn.updates[-1].session
        assert parked.exec_state == session_pb2.EXEC_AWAITING
        ref = parked.pending_approval
        assert ref.tool_call_id == TOOL_CALL_ID
        uid = turn.session

        if cut == "after_park":
            await scenario.host.kill()
            await scenario.host.start()
            view = await scenario.host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid), timeout=60)
            assert view.exec_state == session_pb2.EXEC_AWAITING
            assert view.pending_approval == ref
            await approve(scenario, uid, ref)
        else:
            await approve(scenario, uid, ref)
            resuming = asyncio.create_task(scenario.resume(uid))
            if cut == "during_tool_call":
                await wait_until("the approved call to start", lambda: len(scenario.tool_entries()) == 1)
            else:
                await wait_until("the resumed run to stop", lambda: scenario.harness_stops() == [cut])
            await scenario.host.kill()
            with pytest.raises(grpc.aio.AioRpcError) as cut_off:
                await resuming
            assert cut_off.value.code() == grpc.StatusCode.UNAVAILABLE
            await scenario.host.start()

        scenario.release()
        session = await scenario.resume(uid)
        assert session.exec_state == session_pb2.EXEC_COMPLETED
        records = await scenario.records(uid)
        names = kind_names(records)
        assert [r.event.kind for r in records if r.event.kind != K.EVENT_LIFECYCLE] == APPROVED_TURN_KINDS, (
            names
        )
        lifecycle = [r.event.lifecycle.kind for r in of_kind(records, K.EVENT_LIFECYCLE)]
        assert lifecycle == [LK.LIFECYCLE_SUSPEND, LK.LIFECYCLE_RESUME], names
        (end,) = of_kind(records, K.EVENT_END)
        assert end.event.end.state == "COMPLETED"

        assert len(scenario.model.requests) == MODEL_CALLS
        key = idempotency_key(ref.execution_id)
        assert [e["key"] for e in scenario.tool_effects()] == [key]
        reruns = 1 if cut == "during_tool_call" else 0
        assert [a["key"] for a in scenario.tool_attempts()] == [key] * (1 + reruns)

        (request,) = of_kind(records, K.EVENT_APPROVAL_REQUEST)
        (decision,) = of_kind(records, K.EVENT_APPROVAL_RESULT)
        assert request.seq == ref.request_seq
        assert decision.event.approval_result.approved
        receipt, report = of_kind(records, K.EVENT_TOOL_RESULT)
        assert report.event.result.id == REPORT_ID
        assert receipt.event.result.id == TOOL_CALL_ID
        assert not receipt.event.result.is_error
        assert receipt.event.result.code == common_pb2.ToolResult.CODE_UNSPECIFIED
        assert receipt.event.result.approval_request_seq == request.seq
        assert receipt.event.result.approval_decision_seq == decision.seq
        assert [u.event.usage for u in of_kind(records, K.EVENT_USAGE)] == [USAGE, USAGE]
        await verify_chain(scenario, uid, records)
