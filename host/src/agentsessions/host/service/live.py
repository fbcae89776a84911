"""``agentsessions.ext.v1.LiveSessions`` over the controller's live parts: Watch and Submit.

Served beside ``agentsessions.v1.Sessions`` on the same port, behind the same interceptors (access
log, telemetry, authentication, idempotency keys); the translation rules are Sessions' own
(``service.sessions``): validation in, views out through ``service.convert``, errors through
``service.status``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from typing import Final

from agentsessions.ext.v1 import live_pb2, live_pb2_grpc
from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import results
from agentsessions.host.controller.controller import Controller
from agentsessions.host.controller.detached import OnBusy
from agentsessions.host.controller.errors import InvalidArgumentError
from agentsessions.host.controller.live import LiveSessions
from agentsessions.host.controller.state import SessionView
from agentsessions.host.controller.watch import QueueView
from agentsessions.host.service import validation as v
from agentsessions.host.service.convert import session_proto
from agentsessions.host.service.sessions import Reading, exec_params, reading_handler, unary_handler
from agentsessions.sdk import jsonvalues
from agentsessions.v1 import common_pb2, session_pb2

SERVICE_NAME: str = live_pb2.DESCRIPTOR.services_by_name["LiveSessions"].full_name

_ON_BUSY: Final[dict[int, OnBusy]] = {
    live_pb2.ON_BUSY_UNSPECIFIED: "reject",
    live_pb2.ON_BUSY_REJECT: "reject",
    live_pb2.ON_BUSY_ENQUEUE: "enqueue",
    live_pb2.ON_BUSY_INTERRUPT: "interrupt",
}


def queue_proto(view: QueueView) -> live_pb2.TurnQueue:
    queue = live_pb2.TurnQueue()
    for turn in view.turns:
        item = queue.turns.add(execution_id=turn.execution_id, position=turn.position)
        item.inputs.extend(turn.exec_request().inputs)
        if turn.created_at_ns:
            item.queued_at.FromNanoseconds(turn.created_at_ns)
    return queue


class LiveSessionsServicer(live_pb2_grpc.LiveSessionsServicer):
    """Watch a session from any offset; admit turns that run detached."""

    def __init__(self, controller: Controller) -> None:
        if controller.live is None:
            raise ValueError("LiveSessions needs a controller built with live settings and live tables")
        self.live: LiveSessions = controller.live
        self.limits = controller.limits
        self.reading: Reading = controller.reading

    @reading_handler
    async def Watch(  # type: ignore[override]
        self, request: live_pb2.WatchRequest, call: CallContext
    ) -> AsyncGenerator[live_pb2.WatchUpdate, None]:
        uid = v.session_uid("session", request.session)
        v.non_negative("after_seq", request.after_seq)
        items = self.live.watch(
            uid, request.after_seq, call, follow=request.follow, include_deltas=request.include_deltas
        )
        async for item in items:
            if isinstance(item, common_pb2.LogRecord):
                yield live_pb2.WatchUpdate(record=item)
            elif isinstance(item, session_pb2.Delta):
                yield live_pb2.WatchUpdate(delta=item)
            elif isinstance(item, SessionView):
                yield live_pb2.WatchUpdate(session=session_proto(item))
            else:
                yield live_pb2.WatchUpdate(queue=queue_proto(item))

    @unary_handler
    async def Submit(self, request: live_pb2.SubmitRequest, call: CallContext) -> live_pb2.SubmitResponse:
        if not request.HasField("exec"):
            raise InvalidArgumentError("exec", "is required (the turn, as Exec takes it)")
        on_busy = _ON_BUSY.get(request.on_busy)
        if on_busy is None:
            raise InvalidArgumentError("on_busy", f"{request.on_busy} is not an OnBusy value")
        try:
            params = exec_params(request.exec, self.limits)
        except InvalidArgumentError as exc:
            raise InvalidArgumentError(f"exec.{exc.field}", exc.rule) from None
        if request.HasField("result_schema"):
            if on_busy == "enqueue":
                raise InvalidArgumentError(
                    "result_schema",
                    "cannot be combined with on_busy ON_BUSY_ENQUEUE: a queued turn keeps its inputs only",
                )
            try:
                schema = results.check_schema(jsonvalues.dict_from_struct(request.result_schema))
            except results.ResultSchemaError as exc:
                raise InvalidArgumentError("result_schema", str(exc)) from None
            params = dataclasses.replace(params, result_schema=schema)
        submitted = await self.live.submit(params, on_busy, call)
        response = live_pb2.SubmitResponse(session=session_proto(submitted.view), queued=submitted.queued)
        if submitted.queued:
            response.queued_execution_id = submitted.execution_id
        else:
            response.execution_id = submitted.execution_id
            response.start_seq = submitted.start_seq
        return response
