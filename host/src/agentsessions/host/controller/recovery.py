"""Suspend, Resume and the re-drive of an interrupted execution (spec 4.4).

Suspend checkpoints the session's compute through its runtime and journals the SUSPEND marker.
Resume mints a new fence, lets the host decide an open approval gate if it may, restores the
session's compute, re-drives the latest execution when it is incomplete, and journals RESUME.
A re-drive rebuilds the execution's Start from the journal and runs the harness against the
recorded effects: recorded ones are served, the first unrecorded one goes live.
"""

from __future__ import annotations

from typing import Literal

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import approvals, compute, sessions
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.errors import InheritedToolIntentError, InvalidExecutionLogError
from agentsessions.host.controller.executions import Execution, latest_execution
from agentsessions.host.controller.reconstruct import reconstruct
from agentsessions.host.controller.sink import DeltaSink
from agentsessions.host.controller.sinks import Recorded
from agentsessions.host.controller.state import SessionView, open_gate
from agentsessions.host.controller.writer import ExecutionWriter, OnRecord
from agentsessions.host.journal.store import SessionRow
from agentsessions.v1 import common_pb2

LK = common_pb2.Lifecycle

# How long a Resume waits for the host's own recovery of the session to let it go.
FOLLOW_RECOVERY_S = 60.0

# How a re-drive asks the runtime for the session's compute: attached anew (Exec) or restored
# from its last snapshot (Resume).
Attach = Literal["create", "restore"]


async def suspend(core: Core, call: CallContext, uid: str) -> SessionView:
    async with core.guards.hold(uid):
        row = await sessions.row(core, call, uid)
        resolved = await core.catalog.resolve(row.harness)
        marker = await compute.snapshot(resolved, uid)
        fence = await core.writer.mint_at_head(uid)
        await core.writer.marker(uid, fence, marker)
        return await sessions.look(core, call, uid)


async def resume(core: Core, call: CallContext, uid: str) -> SessionView:
    row = await sessions.row(core, call, uid)
    with core.slots.hold(row.project):  # a re-drive is an execution like any other
        return await _resume(core, call, uid)


async def _resume(core: Core, call: CallContext, uid: str) -> SessionView:
    guards = core.guards
    # The host's own recovery is finishing this session's turn (a decided approval it continues,
    # a crash it recovers): Resume waits for it, then finds the turn done, instead of ABORTED.
    held = guards.hold_when_free(uid, FOLLOW_RECOVERY_S) if guards.recovering(uid) else guards.hold(uid)
    async with held:
        row = await sessions.row(core, call, uid)
        events, executions = await sessions.read(core, row)
        latest = latest_execution(executions)
        fence = await core.writer.mint(uid, len(events))
        if latest is not None and not latest.completed:
            gate = open_gate(events, executions)
            if gate is not None:
                unblocked = await approvals.unblock(core, row, gate, fence=fence)
                if unblocked is None:
                    return await sessions.look(core, call, uid)  # undecided: paused, nothing ran
                latest = unblocked
            if await redrive(core, row, latest, "restore", fence=fence) is not None:
                return await sessions.look(core, call, uid)  # parked again: no RESUME marker
        else:
            await compute.restore(await core.catalog.resolve(row.harness), uid, events)
        await core.writer.marker(uid, fence, common_pb2.Lifecycle(kind=LK.LIFECYCLE_RESUME))
        return await sessions.look(core, call, uid)


async def redrive(
    core: Core,
    row: SessionRow,
    ex: Execution,
    attach: Attach,
    *,
    fence: int | None = None,
    on_record: OnRecord | None = None,
    on_delta: DeltaSink | None = None,
) -> common_pb2.LogRecord | None:
    """Re-drive an interrupted execution from the journal; the SUSPEND marker when it parks."""
    events = await core.cache.events(row.uid)
    recorded = Recorded.of(events, ex)
    effects = recorded.effects
    if ex.legacy and effects and effects[-1].kind == "model" and effects[-1].reply is None:
        # The v0.1.2 writer lost this completion and a legacy turn is never re-driven past its
        # MODEL_CALL (spec 4.9): a log-shape refusal, before the harness runs or anything is written.
        raise InvalidExecutionLogError(
            f"legacy turn at seq {ex.first_index + 1}: recorded completion missing "
            "(MODEL_CALL without OUTPUT)"
        )
    if ex.inherited and any(e.kind == "tool" and e.reply is None for e in effects):
        # Re-driving a fork-copied intent under this session's uid could repeat the parent's
        # effect: refuse from the journal's shape, before the harness runs or anything is written.
        call = next(e.call.tool for e in effects if e.kind == "tool" and e.reply is None)
        raise InheritedToolIntentError(
            f"tool call {call.id!r} was copied from the parent by a fork and has no result; "
            "fork at or after the TOOL_RESULT, or Exec a new turn"
        )
    start, resolved, desc = await reconstruct(core.catalog, row, ex, events)
    if attach == "restore":
        await compute.restore(resolved, row.uid, events)
    else:
        await compute.attach(resolved, row.uid)
    if fence is None:
        fence = await core.writer.mint(row.uid, len(events))
    writer = ExecutionWriter(
        core.writer, row.uid, fence, len(events), on_record, strip_execution_id=ex.legacy
    )
    sink = core.sinks.live(row, start.execution_id, writer, on_delta, recorded, descriptor=desc)
    return await core.driver.drive(row.uid, resolved, start, sink, writer)
