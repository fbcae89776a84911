"""A probe Sessions servicer for interceptor tests (the access log's, telemetry's) on a real aio
server through pytest-grpc's fixtures: four RPCs, each doing one thing the tests observe."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc import aio

from agentsessions.host import requestid
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc

SESSIONS = "agentsessions.v1.Sessions"


class ProbeServicer:
    """Four Sessions RPCs, each doing one thing these tests observe; the others are not served."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        logging.getLogger("agentsessions.host.test").info("inside the handler")
        return session_pb2.Session(harness=requestid.current())

    async def Cancel(
        self, request: session_pb2.CancelRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"cannot cancel {request.session}")
        raise AssertionError("context.abort returned")

    async def Fork(
        self, request: session_pb2.ForkRequest, context: aio.ServicerContext
    ) -> session_pb2.ForkResponse:
        raise RuntimeError(f"secret detail {request.session}")

    async def Replay(
        self, request: session_pb2.ReplayRequest, context: aio.ServicerContext
    ) -> AsyncIterator[common_pb2.LogRecord]:
        self.started.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.cancelled.set()
        yield common_pb2.LogRecord()  # never reached; the yield makes this a streaming handler


def add_probe(servicer: ProbeServicer, server: aio.Server) -> None:
    def unary(handler: Any, request: Any, response: Any) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=request.FromString, response_serializer=response.SerializeToString
        )

    handlers = {
        "GetSession": unary(servicer.GetSession, session_pb2.GetSessionRequest, session_pb2.Session),
        "Cancel": unary(servicer.Cancel, session_pb2.CancelRequest, session_pb2.Session),
        "Fork": unary(servicer.Fork, session_pb2.ForkRequest, session_pb2.ForkResponse),
        "Replay": grpc.unary_stream_rpc_method_handler(
            servicer.Replay,
            request_deserializer=session_pb2.ReplayRequest.FromString,
            response_serializer=common_pb2.LogRecord.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SESSIONS, handlers),))


def probe_fixtures() -> tuple[Callable[[], Any], Callable[[], ProbeServicer], Callable[[], Any]]:
    """pytest-grpc's ``grpc_add_to_server``, ``grpc_servicer`` and ``grpc_stub_cls`` for the probe,
    for a test module to bind under those names."""

    @pytest.fixture
    def grpc_add_to_server() -> Any:
        return add_probe

    @pytest.fixture
    def grpc_servicer() -> ProbeServicer:
        return ProbeServicer()

    @pytest.fixture
    def grpc_stub_cls() -> Any:
        return session_pb2_grpc.SessionsStub

    return grpc_add_to_server, grpc_servicer, grpc_stub_cls


async def replay_cancelled(stub: Any, servicer: ProbeServicer) -> None:
    """A Replay the client cancels once its handler has started (the handler then unwinds on the
    host's own schedule: ``servicer.cancelled``)."""
    call = stub.Replay(session_pb2.ReplayRequest(), timeout=60)
    reading = asyncio.ensure_future(call.read())
    await asyncio.wait_for(servicer.started.wait(), timeout=30)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading


async def replay_past_deadline(stub: Any, servicer: ProbeServicer) -> None:
    """A Replay whose 2 s deadline passes while its handler waits; skips the test when the
    deadline passed before the handler even started (a loaded machine)."""
    call = stub.Replay(session_pb2.ReplayRequest(), timeout=2)
    with pytest.raises(aio.AioRpcError) as raised:
        async for _ in call:
            pass
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    if not servicer.started.is_set():
        pytest.skip("the deadline passed before the handler started (machine too loaded)")
