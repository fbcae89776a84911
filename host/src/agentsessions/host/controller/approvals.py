"""Approval gates: a person's decision (Approve), the host's own decisions at an open gate (the
approval policy's rules, session grants and expiry, journaled when a session is looked at or
recovered), and what recovery does with a gate before it re-drives the parked execution."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import sessions
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.errors import FailedPreconditionError
from agentsessions.host.controller.executions import Execution, latest_execution, recorded_effects
from agentsessions.host.controller.state import Gate, SessionView, open_gate
from agentsessions.host.controller.writer import OnRecord
from agentsessions.host.journal.store import SessionRow
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

K = common_pb2


@struct(frozen=True)
class Decision:
    """A person's decision on one approval request (the Approve call)."""

    execution_id: str
    tool_call_id: str
    request_seq: int
    approved: bool
    reason: str = ""
    identity: common_pb2.IdentityRef | None = None  # who the caller claims to be


async def settle_if_free(core: Core, row: SessionRow) -> bool:
    """Looking at an awaiting session applies the host's own decisions (an expiry above all);
    True when a decision was journaled."""
    if core.guards.busy(row.uid):
        return False  # whoever holds the session (maybe this call's caller) acts on it
    async with core.guards.hold(row.uid):
        return await settle(core, row)


async def settle(
    core: Core, row: SessionRow, fence: int | None = None, on_record: OnRecord | None = None
) -> bool:
    """Journal the approval policy's decision (rule, session grant, expiry) on the latest
    execution's undecided request, if it has one; True when a decision was journaled."""
    events, executions = await sessions.read(core, row)
    gate = open_gate(events, executions)
    if gate is None or gate.decided or gate.request_seq == 0:
        return False
    decision = core.policy.settle(
        row.project, row.uid, row.fork_seq, events, gate.execution.id, gate.tool_call_id, gate.request_seq
    )
    if decision is None:
        return False
    if fence is None:
        fence = await core.writer.mint(row.uid, len(events))
    (rec,) = await core.writer.append(row.uid, [decision], len(events), fence)
    if on_record is not None:
        await on_record(rec)
    return True


async def unblock(
    core: Core, row: SessionRow, gate: Gate, *, fence: int | None = None, on_record: OnRecord | None = None
) -> Execution | None:
    """Before recovery re-drives the execution parked at ``gate``: repair a request the crash cut
    off, let the host decide what it may; the execution to re-drive, or None when the request
    stays undecided (the session stays paused, nothing runs)."""
    if gate.decided:
        return gate.execution
    if gate.request_seq == 0 and gate.tool in core.policy.host_decided:
        return gate.execution  # the host's own gate (a task call) makes its request when re-driven
    if gate.request_seq == 0:
        await _repair(core, row.uid, gate, fence)
    if not await settle(core, row, fence, on_record):
        return None
    return latest_execution((await sessions.read(core, row))[1]) or gate.execution


async def _repair(core: Core, uid: str, gate: Gate, fence: int | None) -> None:
    """Journal the APPROVAL_REQUEST a crash cut off between the TOOL_CALL and its request."""
    head = (await core.store.head(uid)).seq
    if fence is None:
        fence = await core.writer.mint(uid, head)
    request = common_pb2.Event(
        execution_id=gate.execution.id,
        kind=K.EVENT_APPROVAL_REQUEST,
        approval=common_pb2.ApprovalRequest(tool_call_id=gate.tool_call_id),
    )
    await core.writer.append(uid, [request], head, fence)


async def approve(
    core: Core, call: CallContext, uid: str, d: Decision
) -> tuple[SessionView, common_pb2.LogRecord]:
    """Journal a decision on an owned request (exact retries return the original record)."""
    # With authentication the decision's actor is the authenticated caller (access.py).
    actor = core.access.actor(call, d.identity) or common_pb2.IdentityRef()
    execution_id, tool_call_id, request_seq = d.execution_id, d.tool_call_id, d.request_seq
    async with core.guards.hold(uid):
        row = await sessions.row(core, call, uid)
        events, executions = await sessions.read(core, row)
        target = next((ex for ex in executions if ex.id == execution_id and not ex.legacy), None)
        if target is None:
            raise FailedPreconditionError(
                f"execution {execution_id!r} has no approval request in session {uid}"
            )
        if target.inherited:
            raise FailedPreconditionError(
                f"approval request {request_seq} was copied from the parent session by a fork; "
                "it cannot be decided here (Exec a new turn instead)"
            )
        effects, _ = recorded_effects(events, target)
        effect = next(
            (
                e
                for e in effects
                if e.kind == "tool"
                and e.call.tool.id == tool_call_id
                and e.approval_request is not None
                and e.approval_request[0] == request_seq
            ),
            None,
        )
        if effect is None:
            raise FailedPreconditionError(
                f"no approval request for tool call {tool_call_id!r} at seq {request_seq} "
                f"in execution {execution_id!r}"
            )
        if effect.approval_result is not None:
            seq, decision = effect.approval_result
            recorded = decision.approval_result
            if recorded.approved == d.approved and recorded.reason == d.reason and decision.actor == actor:
                (rec,) = await core.store.read(uid, seq, seq)
                return await sessions.look(core, call, uid), rec
            by = f" by {decision.actor.principal}" if decision.actor.principal else ""
            raise FailedPreconditionError(
                f"tool call {tool_call_id!r} was already decided at seq {seq}{by} with different values"
            )
        if effect.reply is not None:
            raise FailedPreconditionError(f"tool call {tool_call_id!r} already has a receipt")
        latest = latest_execution(executions)
        if latest is not target or target.completed:
            raise FailedPreconditionError(
                f"approval request {request_seq} is stale: "
                f"execution {execution_id!r} is no longer the live turn"
            )
        assert effect.approval_request is not None
        expired = core.policy.expired(row.project, uid, effect.approval_request[1], request_seq)
        if expired is not None:
            fence = await core.writer.mint(uid, len(events))
            denial = expired.event(execution_id, tool_call_id, request_seq)
            (rec,) = await core.writer.append(uid, [denial], len(events), fence)
            raise FailedPreconditionError(
                f"approval request {request_seq} {expired.reason}: the host denied it at seq {rec.seq}"
            )
        ts = timestamp_pb2.Timestamp()
        ts.GetCurrentTime()
        event = common_pb2.Event(
            execution_id=execution_id,
            kind=K.EVENT_APPROVAL_RESULT,
            ts=ts,
            approval_result=common_pb2.ApprovalResult(
                tool_call_id=tool_call_id, approved=d.approved, reason=d.reason, request_seq=request_seq
            ),
            actor=actor,
        )
        (rec,) = await core.writer.append(uid, [event], len(events), 0, mint_fence=True)
        return await sessions.look(core, call, uid), rec
