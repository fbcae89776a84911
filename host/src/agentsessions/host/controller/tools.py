"""What the controller needs from host-executed tools, and the check it makes on harness reports.

Host-run calls are checked with ``agentsessions.host.tools.validate_tool_call`` before their
intent is journaled (I3); receipts follow ``agentsessions.sdk.approval``.
"""

from __future__ import annotations

from typing import Protocol

from agentsessions.host.controller.errors import InvalidApprovalCallError
from agentsessions.host.tools.args import validate_tool_call
from agentsessions.host.tools.errors import InvalidToolCallError
from agentsessions.sdk.approval import host_owned_receipt_field
from agentsessions.sdk.errors import ToolCallRejectedError
from agentsessions.v1 import common_pb2


class ToolInvoker(Protocol):
    """Runs host-mediated tool calls, deduplicated on (session, idempotency key)."""

    async def execute(self, session_uid: str, call: common_pb2.ToolCall) -> common_pb2.ToolResult: ...


def check_host_call(call: common_pb2.ToolCall) -> None:
    """Refuse a call the host must not run, before intent; an invalid approval call is a
    precondition failure (spec 1.1 Exec error mapping), the rest fail like the harness."""
    try:
        validate_tool_call(call)
    except InvalidToolCallError as exc:
        if call.mediation == common_pb2.MEDIATION_REQUIRES_APPROVAL:
            raise InvalidApprovalCallError(f"invalid approval call: {exc}") from exc
        raise


def check_reported_result(result: common_pb2.ToolResult) -> None:
    """A harness may not report a host-owned approval receipt."""
    owned = host_owned_receipt_field(result)
    if owned is not None:
        raise ToolCallRejectedError(
            f"tool result {result.id!r} carries host-owned {owned}; only the host writes approval receipts"
        )
