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
from agentsessions.host.controller import compute
from agentsessions.host.controller.approvals import Approvals
from agentsessions.host.controller.drive import Driver
from agentsessions.host.controller.errors import InheritedToolIntentError, InvalidExecutionLogError
from agentsessions.host.controller.executions import Execution, latest_execution
from agentsessions.host.controller.guard import SessionGuards
from agentsessions.host.controller.harnesses import HarnessCatalog
from agentsessions.host.controller.reconstruct import reconstruct
from agentsessions.host.controller.sessions import Sessions
from agentsessions.host.controller.sink import DeltaSink
from agentsessions.host.controller.sinks import Recorded, SinkFactory
from agentsessions.host.controller.state import SessionView, open_gate
from agentsessions.host.controller.writer import JournalWriter, OnRecord
from agentsessions.host.journal.store import SessionRow
from agentsessions.v1 import common_pb2

LK = common_pb2.Lifecycle

# How a re-drive asks the runtime for the session's compute: attached anew (Exec) or restored
# from its last snapshot (Resume).
Attach = Literal["create", "restore"]


class Recovery:
    """Suspend, Resume, and re-drives of interrupted executions."""

    def __init__(
        self,
        sessions: Sessions,
        catalog: HarnessCatalog,
        guards: SessionGuards,
        writer: JournalWriter,
        sinks: SinkFactory,
        driver: Driver,
        approvals: Approvals,
    ) -> None:
        self._sessions = sessions
        self._catalog = catalog
        self._guards = guards
        self._writer = writer
        self._sinks = sinks
        self._driver = driver
        self._approvals = approvals

    async def suspend(self, call: CallContext, uid: str) -> SessionView:
        async with self._guards.hold(uid):
            row = await self._sessions.row(call, uid)
            resolved = await self._catalog.resolve(row.harness)
            marker = await compute.snapshot(resolved, uid)
            fence = await self._writer.mint_at_head(uid)
            await self._writer.marker(uid, fence, marker)
            return await self._sessions.look(call, uid)

    async def resume(self, call: CallContext, uid: str) -> SessionView:
        async with self._guards.hold(uid):
            row = await self._sessions.row(call, uid)
            events, executions = await self._sessions.read(row)
            latest = latest_execution(executions)
            fence = await self._writer.mint(uid, len(events))
            if latest is not None and not latest.completed:
                gate = open_gate(events, executions)
                if gate is not None:
                    unblocked = await self._approvals.unblock(row, gate, fence=fence)
                    if unblocked is None:
                        return await self._sessions.look(call, uid)  # undecided: paused, nothing ran
                    latest = unblocked
                parked = await self.redrive(row, latest, "restore", fence=fence)
                if parked is not None:
                    return await self._sessions.look(call, uid)
            else:
                resolved = await self._catalog.resolve(row.harness)
                await compute.restore(resolved, uid, events)
            await self._writer.marker(uid, fence, common_pb2.Lifecycle(kind=LK.LIFECYCLE_RESUME))
            return await self._sessions.look(call, uid)

    async def redrive(
        self,
        row: SessionRow,
        ex: Execution,
        attach: Attach,
        *,
        fence: int | None = None,
        on_record: OnRecord | None = None,
        on_delta: DeltaSink | None = None,
    ) -> common_pb2.LogRecord | None:
        """Re-drive an interrupted execution from the journal; the SUSPEND marker when it parks."""
        events = await self._sessions.events(row.uid)
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
        start, resolved = await reconstruct(self._catalog, row, ex, events)
        if attach == "restore":
            await compute.restore(resolved, row.uid, events)
        else:
            await compute.attach(resolved, row.uid)
        if fence is None:
            fence = await self._writer.mint(row.uid, len(events))
        writer = self._writer.for_execution(
            row.uid, fence, len(events), on_record, strip_execution_id=ex.legacy
        )
        sink = self._sinks.live(row, start.execution_id, writer, on_delta, recorded)
        return await self._driver.drive(row.uid, resolved, start, sink, writer)
