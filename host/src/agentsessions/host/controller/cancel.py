"""Cancel: stop this host's running turn of a session (the turn journals END{CANCELED} and the
CANCEL marker as it ends), or close a turn parked on an approval (journaled here); a no-op on an
idle or finished session."""

from __future__ import annotations

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import sessions
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.state import open_gate
from agentsessions.v1 import common_pb2

DEFAULT_REASON = "cancelled by request"


async def cancel(core: Core, call: CallContext, uid: str, execution_id: str, reason: str) -> None:
    """Stop the running turn (``execution_id``: only that one; empty: whichever runs), waiting the
    cancel grace for it to journal its end; or close a parked one."""
    await sessions.row(core, call, uid)
    running = core.driver.running.get(uid)
    if running is None:
        await _close_parked(core, call, uid, execution_id, reason or DEFAULT_REASON)
    elif not execution_id or execution_id == running.execution_id:
        await running.stop(reason or DEFAULT_REASON, core.cancel_grace_s)


async def _close_parked(core: Core, call: CallContext, uid: str, execution_id: str, reason: str) -> None:
    """Journal END{CANCELED} and the CANCEL marker for a parked execution: its request can no
    longer be decided, and the session takes new inputs."""
    events, executions = await sessions.read(core, await sessions.row(core, call, uid))
    if open_gate(events, executions) is None:
        return
    async with core.guards.hold(uid):
        events, executions = await sessions.read(core, await sessions.row(core, call, uid))
        gate = open_gate(events, executions)
        if gate is None or (execution_id and execution_id != gate.execution.id):
            return
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
