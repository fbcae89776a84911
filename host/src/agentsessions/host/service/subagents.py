"""``agentsessions.ext.v1.Subagents`` over the controller's task tool: the links between a session and
the children its task calls started (docs/subagents.md). Sessions' translation rules: validation in,
errors through ``service.status``."""

from __future__ import annotations

from agentsessions.ext.v1 import subagents_pb2, subagents_pb2_grpc
from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller.controller import Controller
from agentsessions.host.controller.subagents import Link, Subagents
from agentsessions.host.service import validation as v
from agentsessions.host.service.sessions import unary_handler

SERVICE_NAME: str = subagents_pb2.DESCRIPTOR.services_by_name["Subagents"].full_name


def link_proto(link: Link, child_state: int) -> subagents_pb2.SubagentLink:
    return subagents_pb2.SubagentLink(
        parent=link.parent,
        execution_id=link.execution_id,
        tool_call_id=link.tool_call_id,
        child=link.child,
        depth=link.depth,
        fork=link.fork,
        child_state=child_state,  # type: ignore[arg-type]
    )


class SubagentsServicer(subagents_pb2_grpc.SubagentsServicer):
    """A session's subagent links."""

    def __init__(self, controller: Controller) -> None:
        if controller.live is None:
            raise ValueError("Subagents needs a controller built with live settings and live tables")
        self.subagents: Subagents = controller.live.subagents

    @unary_handler
    async def GetSubagents(
        self, request: subagents_pb2.GetSubagentsRequest, call: CallContext
    ) -> subagents_pb2.GetSubagentsResponse:
        uid = v.session_uid("session", request.session)
        parent, children = await self.subagents.links(uid, call)
        response = subagents_pb2.GetSubagentsResponse(children=[link_proto(*c) for c in children])
        if parent is not None:
            response.parent.CopyFrom(link_proto(*parent))
        return response
