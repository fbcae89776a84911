"""Cancel: stop this host's running turn of a session (the turn journals END{CANCELED} and the
CANCEL marker as it ends), or close a turn parked on an approval (journaled here); a no-op on an
idle or finished session.

A session held by an operation with no turn driven yet (an Exec or Submit still in its Describe or
admission, a recovery about to re-drive, an Approve) gets the cancel armed on its guard: the turn
that operation drives next ends CANCELED before its harness runs. Cancel then waits (the cancel
grace, bounded) for the operation to let go, and closes what it left parked.
"""

from __future__ import annotations

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import sessions
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.errors import SessionBusyError
from agentsessions.host.controller.state import open_gate
from agentsessions.v1 import common_pb2

DEFAULT_REASON = "cancelled by request"


async def cancel(core: Core, call: CallContext, uid: str, execution_id: str, reason: str) -> str:
    """Stop the running turn (``execution_id``: only that one; empty: whichever runs), waiting the
    cancel grace for it to journal its end; or cancel the turn being admitted; or close a parked
    one. The execution it cancelled ("": none, or not known yet)."""
    await sessions.row(core, call, uid)
    reason = reason or DEFAULT_REASON
    running = core.driver.running.get(uid)
    if running is not None:
        if execution_id and execution_id != running.execution_id:
            return ""
        await running.stop(reason, core.cancel_grace_s)
        return running.execution_id
    if core.guards.busy(uid):
        return await _cancel_admitting(core, call, uid, execution_id, reason)
    return await _close_parked(core, call, uid, execution_id, reason)


async def _cancel_admitting(core: Core, call: CallContext, uid: str, execution_id: str, reason: str) -> str:
    """Arm the cancel on the session's hold, then wait (bounded) for its holder to let go: its turn
    has then ended CANCELED, or it drove none and what it left parked is closed here."""
    guards = core.guards
    armed = guards.arm_cancel(uid, reason, execution_id)
    assert armed is not None  # held: the caller looked just now, with no wait since
    try:
        async with guards.hold_when_free(uid):
            if armed.taken:
                return armed.taken
            return await _close_parked_held(core, call, uid, execution_id, reason)
    except SessionBusyError:
        # Still being admitted after the grace: the cancel stays armed on that hold, so the turn
        # ends CANCELED as soon as it is driven (its harness never runs).
        return armed.taken


async def _close_parked(core: Core, call: CallContext, uid: str, execution_id: str, reason: str) -> str:
    """Journal END{CANCELED} and the CANCEL marker for a parked execution: its request can no
    longer be decided, and the session takes new inputs."""
    events, executions = await sessions.read(core, await sessions.row(core, call, uid))
    if open_gate(events, executions) is None:
        return ""
    async with core.guards.hold(uid):
        return await _close_parked_held(core, call, uid, execution_id, reason)


async def _close_parked_held(core: Core, call: CallContext, uid: str, execution_id: str, reason: str) -> str:
    """:func:`_close_parked`, the caller holding the guard."""
    events, executions = await sessions.read(core, await sessions.row(core, call, uid))
    gate = open_gate(events, executions)
    if gate is None or (execution_id and execution_id != gate.execution.id):
        return ""
    fence = await core.writer.mint(uid, len(events))
    end = common_pb2.Event(
        execution_id=gate.execution.id,
        kind=common_pb2.EVENT_END,
        end=common_pb2.HarnessEnd(state="CANCELED", error=common_pb2.Error(code=1, description=reason)),
    )
    await core.writer.append(uid, [end], len(events), fence)
    await core.writer.marker(
        uid, fence, common_pb2.Lifecycle(kind=common_pb2.Lifecycle.LIFECYCLE_CANCEL, detail=reason)
    )
    return gate.execution.id
