"""Authorization fails closed: with authentication on, a call that reaches the controller without
an authenticated principal is refused (UNAUTHENTICATED), whatever the code path that forgot to
carry one. The principal travels as an explicit call context, from the auth interceptor through
the servicer to every controller check."""

from __future__ import annotations

import grpc
import pytest

from agentsessions.host.auth import PrincipalAccess
from agentsessions.host.auth.principals import Principal
from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller.errors import PermissionDeniedError, UnauthenticatedError
from agentsessions.host.controller.fork import ForkParams
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.journal.store import SessionNotFoundError, SessionRow
from agentsessions.v1 import session_pb2
from tests.support.host import running_host, text_input

ALICE = CallContext(
    Principal("user:alice", projects=frozenset({"default"}), roles=frozenset({"writer"})), "/test/Call"
)
NEW = SessionRow(uid="", project="")
BOB = CallContext(Principal("user:bob", projects=frozenset({"other"}), roles=frozenset({"writer"})))


async def test_the_controller_refuses_a_call_without_a_principal_when_auth_is_on() -> None:
    async with running_host(MemoryStore(), access=PrincipalAccess()) as host:
        controller = host.controller
        with pytest.raises(UnauthenticatedError, match="no authenticated principal"):
            await controller.create_session(NEW)
        created = await controller.create_session(NEW, call=ALICE)
        assert created.row.identity is not None and created.row.identity.principal == "user:alice"
        uid = created.row.uid
        for anonymous in (
            controller.view(uid),
            controller.list_sessions("", 0, ""),
            controller.suspend(uid),
            controller.resume(uid),
            controller.replay(uid),
            controller.cancel(uid, "", ""),
            controller.fork(uid, ForkParams()),
            controller.delete_session(uid),
        ):
            with pytest.raises(UnauthenticatedError):
                await anonymous
        with pytest.raises(UnauthenticatedError):
            [r async for r in controller.records(uid)]
        # A session bob may not see is, to bob, an unknown one.
        with pytest.raises(SessionNotFoundError, match=f"session {uid!r} not found"):
            await controller.view(uid, call=BOB)
        with pytest.raises(PermissionDeniedError, match="may not use project 'default'"):
            await controller.list_sessions("", 0, "", call=BOB)
        assert (await controller.view(uid, call=ALICE)).row.uid == uid


async def test_a_servicer_without_the_auth_interceptor_answers_unauthenticated() -> None:
    """The access hook is on, but nothing authenticated the calls (no interceptor bound a
    principal): every call that reaches a session is refused, none is trusted by default."""
    async with running_host(MemoryStore(), access=PrincipalAccess()) as host:
        calls = {
            "CreateSession": host.sessions.CreateSession(session_pb2.CreateSessionRequest()),
            "ListSessions": host.sessions.ListSessions(session_pb2.ListSessionsRequest()),
            "GetSession": host.sessions.GetSession(session_pb2.GetSessionRequest(uid="sess-1")),
        }
        for name, call in calls.items():
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            [u async for u in host.sessions.Exec(session_pb2.ExecRequest(inputs=[text_input("hi")]))]
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert await host.store.list_sessions("default", 10, "") == ([], "")
