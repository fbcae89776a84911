"""``agentsessions.v1.Sessions``: the initial servicer, answering every RPC UNIMPLEMENTED.

It lets the host serve, reflect and report health before the controller is wired in; the
controller-backed servicer replaces it method by method.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import NoReturn

import grpc
from grpc import aio

from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc

SERVICE_NAME: str = session_pb2.DESCRIPTOR.services_by_name["Sessions"].full_name


async def _unimplemented(context: aio.ServicerContext, rpc: str) -> NoReturn:
    await context.abort(
        grpc.StatusCode.UNIMPLEMENTED, f"{SERVICE_NAME}/{rpc} is not implemented by this host"
    )
    raise AssertionError("context.abort returned")


class SessionsServicer(session_pb2_grpc.SessionsServicer):
    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        await _unimplemented(context, "CreateSession")

    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        await _unimplemented(context, "GetSession")

    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, context: aio.ServicerContext
    ) -> session_pb2.ListSessionsResponse:
        await _unimplemented(context, "ListSessions")

    async def DeleteSession(
        self, request: session_pb2.DeleteSessionRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        await _unimplemented(context, "DeleteSession")

    async def Exec(
        self, request: session_pb2.ExecRequest, context: aio.ServicerContext
    ) -> AsyncIterator[session_pb2.ExecUpdate]:
        await _unimplemented(context, "Exec")
        yield session_pb2.ExecUpdate()  # never reached; the yield makes this a streaming handler

    async def Replay(
        self, request: session_pb2.ReplayRequest, context: aio.ServicerContext
    ) -> AsyncIterator[common_pb2.LogRecord]:
        await _unimplemented(context, "Replay")
        yield common_pb2.LogRecord()  # never reached; the yield makes this a streaming handler

    async def Approve(
        self, request: session_pb2.ApproveRequest, context: aio.ServicerContext
    ) -> session_pb2.ApproveResponse:
        await _unimplemented(context, "Approve")

    async def Cancel(
        self, request: session_pb2.CancelRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        await _unimplemented(context, "Cancel")

    async def Suspend(
        self, request: session_pb2.SuspendRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        await _unimplemented(context, "Suspend")

    async def Resume(
        self, request: session_pb2.ResumeRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        await _unimplemented(context, "Resume")

    async def Fork(
        self, request: session_pb2.ForkRequest, context: aio.ServicerContext
    ) -> session_pb2.ForkResponse:
        await _unimplemented(context, "Fork")
