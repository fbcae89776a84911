"""Session state derived from the journal: the view of a session row and its open approval gate.

Pure functions of what the journal holds (and whether this host runs a turn of the session right
now); nothing here reads the store or writes anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentsessions.host.controller.errors import InvalidExecutionLogError
from agentsessions.host.controller.executions import Execution, latest_execution, recorded_effects
from agentsessions.host.journal.execstate import ExecProjection
from agentsessions.host.journal.store import SessionRow
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2


@struct(frozen=True)
class SessionView:
    """A session row with the state derived from its journal."""

    row: SessionRow
    exec_state: int
    pending_approval: common_pb2.ApprovalRef | None = None


@struct
class Gate:
    """An owned approval gate of the latest execution that has no receipt yet."""

    execution: Execution
    tool_call_id: str
    request_seq: int  # 0 when the crash cut fell between TOOL_CALL and APPROVAL_REQUEST
    decided: bool
    tool: str = ""


def open_gate(events: Sequence[common_pb2.Event], executions: list[Execution]) -> Gate | None:
    """The latest execution's first approval-bearing tool call without a receipt, if any."""
    latest = latest_execution(executions)
    if latest is None or latest.completed or latest.legacy or latest.inherited:
        return None
    try:
        effects, _ = recorded_effects(events, latest)
    except InvalidExecutionLogError:
        return None
    for eff in effects:
        if eff.kind != "tool" or eff.reply is not None:
            continue
        if eff.call.tool.mediation != common_pb2.MEDIATION_REQUIRES_APPROVAL:
            continue
        request_seq = eff.approval_request[0] if eff.approval_request else 0
        return Gate(
            latest, eff.call.tool.id, request_seq, eff.approval_result is not None, eff.call.tool.tool
        )
    return None


def was_cancelled(events: Sequence[common_pb2.Event], ex: Execution) -> bool:
    return ex.end_index is not None and events[ex.end_index].end.state == "CANCELED"


def derive_view(
    row: SessionRow,
    events: Sequence[common_pb2.Event],
    executions: list[Execution],
    *,
    running_here: bool,
) -> SessionView:
    """``exec_state`` (and the pending approval) from the journal's latest execution, first-seen
    order; ``running_here`` says whether this host is running a turn of the session."""
    if row.last_seq == 0:
        return SessionView(row, session_pb2.EXEC_PENDING)
    gate = open_gate(events, executions)
    if gate is not None:
        ref = common_pb2.ApprovalRef(
            execution_id=gate.execution.id, tool_call_id=gate.tool_call_id, request_seq=gate.request_seq
        )
        return SessionView(row, session_pb2.EXEC_AWAITING, ref)
    if running_here:
        return SessionView(row, session_pb2.EXEC_RUNNING)
    latest = latest_execution(executions)
    if latest is None:
        return SessionView(row, session_pb2.EXEC_COMPLETED)
    if latest.end_index is not None:
        state = events[latest.end_index].end.state
        if state == "CANCELED":
            return SessionView(row, session_pb2.EXEC_CANCELED)
        if state not in ("", "COMPLETED"):
            return SessionView(row, session_pb2.EXEC_FAILED)
        return SessionView(row, session_pb2.EXEC_COMPLETED)
    if latest.error_indexes:
        return SessionView(row, session_pb2.EXEC_FAILED)
    # No END and no ERROR: the turn is in flight on another host, or a crash cut it short.
    # Either way it has not finished; Resume completes an interrupted one from the journal.
    return SessionView(row, session_pb2.EXEC_RUNNING)


def projected_view(row: SessionRow, projection: ExecProjection, *, running_here: bool) -> SessionView:
    """The same view as ``derive_view``, from the execution state the row projects from its
    journal (``journal.execstate``), without reading the journal."""
    if row.last_seq == 0:
        return SessionView(row, session_pb2.EXEC_PENDING)
    if projection.invalid:
        return SessionView(row, session_pb2.EXEC_FAILED)
    latest = projection.latest
    gate = latest.gate() if latest is not None else None
    if latest is not None and gate is not None:
        ref = common_pb2.ApprovalRef(
            execution_id=latest.id, tool_call_id=gate.id, request_seq=gate.request_seq
        )
        return SessionView(row, session_pb2.EXEC_AWAITING, ref)
    if running_here:
        return SessionView(row, session_pb2.EXEC_RUNNING)
    if latest is None:
        return SessionView(row, session_pb2.EXEC_COMPLETED)
    if latest.end_state is not None:
        if latest.end_state == "CANCELED":
            return SessionView(row, session_pb2.EXEC_CANCELED)
        if latest.end_state not in ("", "COMPLETED"):
            return SessionView(row, session_pb2.EXEC_FAILED)
        return SessionView(row, session_pb2.EXEC_COMPLETED)
    if latest.errored:
        return SessionView(row, session_pb2.EXEC_FAILED)
    return SessionView(row, session_pb2.EXEC_RUNNING)
