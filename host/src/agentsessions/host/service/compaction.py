"""``agentsessions.ext.v1.SessionCompaction`` over the controller: Compact.

Served beside ``agentsessions.v1.Sessions`` on the same port, with Sessions' translation rules
(validation in, views out through ``service.convert``, errors through ``service.status``).
"""

from __future__ import annotations

from agentsessions.ext.v1 import compaction_pb2, compaction_pb2_grpc
from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller.controller import Controller
from agentsessions.host.service import validation as v
from agentsessions.host.service.convert import session_proto
from agentsessions.host.service.sessions import unary_handler

SERVICE_NAME: str = compaction_pb2.DESCRIPTOR.services_by_name["SessionCompaction"].full_name


class SessionCompactionServicer(compaction_pb2_grpc.SessionCompactionServicer):
    """Compact a session at its head (docs/compaction.md)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    @unary_handler
    async def Compact(
        self, request: compaction_pb2.CompactRequest, call: CallContext
    ) -> compaction_pb2.CompactResponse:
        uid = v.session_uid("session", request.session)
        expected = request.expected_last_seq if request.HasField("expected_last_seq") else None
        if expected is not None:
            v.non_negative("expected_last_seq", expected)
        done = await self.controller.compact(uid, expected, call=call)
        return compaction_pb2.CompactResponse(
            session=session_proto(done.view), baseline=done.baseline, summarized_records=done.summarized
        )
