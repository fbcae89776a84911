"""Journals the store tests write by hand."""

from __future__ import annotations

from agentsessions.v1 import common_pb2


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
