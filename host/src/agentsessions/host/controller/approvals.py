"""Approval gates: a person's decision (Approve), the host's own decisions at an open gate (the
approval policy's rules, session grants and expiry, journaled when a session is looked at or
recovered), and what recovery does with a gate before it re-drives the parked execution."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller.access import SessionAccess
from agentsessions.host.controller.approval_policy import ApprovalPolicy
from agentsessions.host.controller.errors import FailedPreconditionError
from agentsessions.host.controller.executions import Execution, latest_execution, recorded_effects
from agentsessions.host.controller.guard import SessionGuards
from agentsessions.host.controller.sessions import Sessions
from agentsessions.host.controller.state import Gate, SessionView, open_gate
from agentsessions.host.controller.writer import JournalWriter, OnRecord
from agentsessions.host.journal.store import JournalStore, SessionRow
from agentsessions.v1 import common_pb2

K = common_pb2


class Approvals:
    """Decisions at approval gates, by people and by the host."""

    def __init__(
        self,
        store: JournalStore,
        sessions: Sessions,
        guards: SessionGuards,
        writer: JournalWriter,
        policy: ApprovalPolicy,
        access: SessionAccess,
    ) -> None:
        self._store = store
        self._sessions = sessions
        self._guards = guards
        self._writer = writer
        self._policy = policy
        self._access = access

    async def settle_if_free(self, row: SessionRow) -> bool:
        """Looking at an awaiting session applies the host's own decisions (an expiry above all);
        True when a decision was journaled."""
        if self._guards.busy(row.uid):
            return False  # whoever holds the session (maybe this call's caller) acts on it
        async with self._guards.hold(row.uid):
            return await self.settle(row)

    async def settle(
        self, row: SessionRow, fence: int | None = None, on_record: OnRecord | None = None
    ) -> bool:
        """Journal the approval policy's decision (rule, session grant, expiry) on the latest
        execution's undecided request, if it has one; True when a decision was journaled."""
        events, executions = await self._sessions.read(row)
        gate = open_gate(events, executions)
        if gate is None or gate.decided or gate.request_seq == 0:
            return False
        decision = self._policy.settle(
            row.project, row.uid, row.fork_seq, events, gate.execution.id, gate.tool_call_id, gate.request_seq
        )
        if decision is None:
            return False
        if fence is None:
            fence = await self._writer.mint(row.uid, len(events))
        (rec,) = await self._writer.append(row.uid, [decision], len(events), fence)
        if on_record is not None:
            await on_record(rec)
        return True

    async def unblock(
        self, row: SessionRow, gate: Gate, *, fence: int | None = None, on_record: OnRecord | None = None
    ) -> Execution | None:
        """Before recovery re-drives the execution parked at ``gate``: repair a request the crash
        cut off, let the host decide what it may; the execution to re-drive, or None when the
        request stays undecided (the session stays paused, nothing runs)."""
        if gate.decided:
            return gate.execution
        if gate.request_seq == 0:
            await self._repair(row.uid, gate, fence)
        if not await self.settle(row, fence, on_record):
            return None
        return latest_execution((await self._sessions.read(row))[1]) or gate.execution

    async def _repair(self, uid: str, gate: Gate, fence: int | None) -> None:
        """Journal the APPROVAL_REQUEST a crash cut off between the TOOL_CALL and its request."""
        head = (await self._store.head(uid)).seq
        if fence is None:
            fence = await self._writer.mint(uid, head)
        request = common_pb2.Event(
            execution_id=gate.execution.id,
            kind=K.EVENT_APPROVAL_REQUEST,
            approval=common_pb2.ApprovalRequest(tool_call_id=gate.tool_call_id),
        )
        await self._writer.append(uid, [request], head, fence)

    async def approve(
        self,
        call: CallContext,
        uid: str,
        execution_id: str,
        tool_call_id: str,
        request_seq: int,
        approved: bool,
        reason: str,
        identity: common_pb2.IdentityRef | None,
    ) -> tuple[SessionView, common_pb2.LogRecord]:
        """Journal a decision on an owned request (exact retries return the original record)."""
        # With authentication the decision's actor is the authenticated caller (access.py).
        actor = self._access.actor(call, identity) or common_pb2.IdentityRef()
        async with self._guards.hold(uid):
            row = await self._sessions.row(call, uid)
            events, executions = await self._sessions.read(row)
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
                d = decision.approval_result
                if d.approved == approved and d.reason == reason and decision.actor == actor:
                    (rec,) = await self._store.read(uid, seq, seq)
                    return await self._sessions.look(call, uid), rec
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
            expired = self._policy.expired(row.project, uid, effect.approval_request[1], request_seq)
            if expired is not None:
                fence = await self._writer.mint(uid, len(events))
                denial = expired.event(execution_id, tool_call_id, request_seq)
                (rec,) = await self._writer.append(uid, [denial], len(events), fence)
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
                    tool_call_id=tool_call_id, approved=approved, reason=reason, request_seq=request_seq
                ),
                actor=actor,
            )
            (rec,) = await self._writer.append(uid, [event], len(events), 0, mint_fence=True)
            return await self._sessions.look(call, uid), rec
