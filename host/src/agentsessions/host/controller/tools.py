"""What the controller needs from host-executed tools, and the checks it makes before
journaling a tool intent (I3: no key, no unmediated call, only JSON-shaped arguments)."""

from __future__ import annotations

from typing import Protocol

from agentsessions.sdk.errors import SinkError, ToolCallRejectedError
from agentsessions.v1 import common_pb2

# The receipt text of a denied call (spec 4.6), as error and as content.
APPROVAL_DENIED_TEXT = "Tool execution denied by approval decision."


class NoToolExecutorError(SinkError):
    """A host-mediated call names a tool no executor serves (raised after intent)."""


class ToolInvoker(Protocol):
    """Runs host-mediated tool calls, deduplicated on (session, idempotency key)."""

    def has_tool(self, name: str) -> bool: ...

    async def execute(self, session_uid: str, call: common_pb2.ToolCall) -> common_pb2.ToolResult: ...


_HOST_TIERS = (common_pb2.MEDIATION_CONTROLLER_MEDIATED, common_pb2.MEDIATION_REQUIRES_APPROVAL)


def check_host_tool_call(call: common_pb2.ToolCall) -> None:
    """Refuse, before any intent is journaled, a call the host must not execute."""
    from agentsessions.host.tools.args import InvalidToolArgumentsError, validate_tool_args

    if call.mediation not in _HOST_TIERS:
        raise ToolCallRejectedError(
            f"tool call {call.id!r}: mediation {common_pb2.Mediation.Name(call.mediation)} is not "
            "host-executed; report in-harness results with report()"
        )
    if not call.id:
        raise ToolCallRejectedError("tool call id is required for host-executed calls")
    if not call.idempotency_key:
        raise ToolCallRejectedError(
            f"tool call {call.id!r}: {common_pb2.Mediation.Name(call.mediation)} requires an idempotency_key"
        )
    try:
        validate_tool_args(call.args if call.HasField("args") else None)
    except InvalidToolArgumentsError as exc:
        raise ToolCallRejectedError(f"tool call {call.id!r}: {exc}") from exc


def check_reported_result(result: common_pb2.ToolResult) -> None:
    """A harness may not report a host-owned approval receipt."""
    if (
        result.approval_request_seq
        or result.approval_decision_seq
        or result.code == common_pb2.ToolResult.APPROVAL_DENIED
    ):
        raise ToolCallRejectedError(
            f"tool result {result.id!r} carries host-owned approval receipt fields; only the host writes receipts"
        )
