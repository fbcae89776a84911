"""Approval receipt rules both ends of Harness.Connect check (spec section 5.5).

A receipt is the ToolResult the host returns for a decided REQUIRES_APPROVAL call. Its approval
fields are host-owned: a harness never reports them, and the host never sends them without the
decision they belong to.
"""

from __future__ import annotations

from agentsessions.v1 import common_pb2

DENIED_MESSAGE = "Tool execution denied by approval decision."


def denied_receipt(call_id: str, request_seq: int, decision_seq: int) -> common_pb2.ToolResult:
    """The receipt of a call its decision denied: APPROVAL_DENIED with ``DENIED_MESSAGE``."""
    return common_pb2.ToolResult(
        id=call_id,
        is_error=True,
        code=common_pb2.ToolResult.APPROVAL_DENIED,
        error=DENIED_MESSAGE,
        content=[common_pb2.Part(text=common_pb2.TextPart(text=DENIED_MESSAGE))],
        approval_request_seq=request_seq,
        approval_decision_seq=decision_seq,
    )


def host_owned_receipt_field(result: common_pb2.ToolResult) -> str | None:
    """The name of the host-owned approval field a result carries, or None when it carries none."""
    if result.approval_request_seq != 0:
        return "approval_request_seq"
    if result.approval_decision_seq != 0:
        return "approval_decision_seq"
    if result.code == common_pb2.ToolResult.APPROVAL_DENIED:
        return "code APPROVAL_DENIED"
    return None


def receipt_conflict(decision: common_pb2.ApprovalResult, receipt: common_pb2.ToolResult) -> str | None:
    """Why a receipt does not belong to its decision, or None when it does."""
    if receipt.approval_request_seq != decision.request_seq:
        return (
            f"approval receipt approval_request_seq {receipt.approval_request_seq} does not match "
            f"decision request_seq {decision.request_seq}"
        )
    if receipt.approval_decision_seq <= 0:
        return f"approval receipt approval_decision_seq {receipt.approval_decision_seq} must be positive"
    code = receipt.code
    if decision.approved:
        executed = code == common_pb2.ToolResult.CODE_UNSPECIFIED and not receipt.is_error
        failed = code == common_pb2.ToolResult.EXECUTOR_ERROR and receipt.is_error
        if executed or failed:
            return None
    elif code == common_pb2.ToolResult.APPROVAL_DENIED and receipt.is_error:
        return None
    return "approval receipt status conflicts with decision"


def decision_from_receipt(tool_call_id: str, receipt: common_pb2.ToolResult) -> common_pb2.ApprovalResult:
    """The decision a receipt implies (no reason: a receipt does not carry one)."""
    return common_pb2.ApprovalResult(
        tool_call_id=tool_call_id,
        approved=receipt.code != common_pb2.ToolResult.APPROVAL_DENIED,
        request_seq=receipt.approval_request_seq,
    )
