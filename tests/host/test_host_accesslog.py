"""The access-log interceptor and the initial Sessions servicer, served on a real aio server through
pytest-grpc's fixtures (grpc_add_to_server / grpc_servicer / grpc_stub_cls, aio overrides in conftest).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio

from agentsessions.host import logs, requestid
from agentsessions.host.accesslog import AccessLogInterceptor
from agentsessions.host.service.sessions import SessionsServicer
from agentsessions.v1 import session_pb2, session_pb2_grpc

RPC_LOGGER = "agentsessions.host.rpc"
SESSIONS = session_pb2.DESCRIPTOR.services_by_name["Sessions"]


class ProbeServicer(SessionsServicer):
    """The initial servicer, with a few RPCs doing what these tests need to observe."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()

    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        logging.getLogger("agentsessions.host.test").info("inside the handler")
        return session_pb2.Session(harness=requestid.current())

    async def Fork(
        self, request: session_pb2.ForkRequest, context: aio.ServicerContext
    ) -> session_pb2.ForkResponse:
        raise RuntimeError(f"secret detail {request.session}")

    async def Replay(self, request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            await asyncio.Event().wait()
        finally:
            self.cancelled.set()
        yield  # never reached; the yield makes this a streaming handler


@pytest.fixture
def grpc_add_to_server() -> Any:
    return session_pb2_grpc.add_SessionsServicer_to_server


@pytest.fixture
def grpc_servicer() -> ProbeServicer:
    return ProbeServicer()


@pytest.fixture
def grpc_stub_cls() -> Any:
    return session_pb2_grpc.SessionsStub


@pytest.fixture
def grpc_interceptors() -> list[aio.ServerInterceptor]:
    return [AccessLogInterceptor()]


def rpc_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The access log as an operator reads it in JSON format."""
    formatter = logs.JsonFormatter()
    return [json.loads(formatter.format(r)) for r in caplog.records if r.name == RPC_LOGGER]


UNIMPLEMENTED_RPCS = sorted(
    method.name for method in SESSIONS.methods if method.name not in {"GetSession", "Fork", "Replay"}
)


@pytest.mark.parametrize("rpc", UNIMPLEMENTED_RPCS)
async def test_initial_servicer_answers_unimplemented_naming_the_rpc(grpc_stub: Any, rpc: str) -> None:
    method = SESSIONS.methods_by_name[rpc]
    request = session_pb2.DESCRIPTOR.message_types_by_name[method.input_type.name]
    call = getattr(grpc_stub, rpc)(_message_class(request.name)())
    with pytest.raises(aio.AioRpcError) as raised:
        if method.server_streaming:
            async for _ in call:
                pass
        else:
            await call
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert raised.value.details() == f"agentsessions.v1.Sessions/{rpc} is not implemented by this host"


def _message_class(name: str) -> Any:
    return getattr(session_pb2, name)


async def test_the_callers_request_id_is_returned_logged_and_current_in_the_handler(
    grpc_stub: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    call = grpc_stub.GetSession(session_pb2.GetSessionRequest(uid="u"), metadata=[("x-request-id", "req-42")])
    session = await call
    assert session.harness == "req-42"
    assert ("x-request-id", "req-42") in tuple(await call.trailing_metadata())

    inside = [r for r in caplog.records if r.name == "agentsessions.host.test"]
    assert json.loads(logs.JsonFormatter().format(inside[0]))["request_id"] == "req-42"
    [line] = rpc_lines(caplog)
    assert line["method"] == "/agentsessions.v1.Sessions/GetSession"
    assert line["code"] == "OK"
    assert line["request_id"] == "req-42"
    assert line["duration_ms"] >= 0


@pytest.mark.parametrize("offered", [None, "", "has space", "x" * 129, "semi;colon"])
async def test_a_missing_or_unsafe_request_id_is_replaced(grpc_stub: Any, offered: str | None) -> None:
    metadata = [] if offered is None else [("x-request-id", offered)]
    call = grpc_stub.GetSession(session_pb2.GetSessionRequest(), metadata=metadata)
    session = await call
    assert re.fullmatch(r"[0-9a-f]{32}", session.harness)
    assert ("x-request-id", session.harness) in tuple(await call.trailing_metadata())


async def test_an_escaping_exception_is_logged_as_unknown_without_its_message(
    grpc_stub: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with pytest.raises(aio.AioRpcError) as raised:
        await grpc_stub.Fork(session_pb2.ForkRequest(session="payload-xyz"))
    assert raised.value.code() == grpc.StatusCode.UNKNOWN
    [line] = rpc_lines(caplog)
    assert line["level"] == "error"
    assert line["code"] == "UNKNOWN"
    assert line["error"] == "RuntimeError"
    assert "payload-xyz" not in json.dumps(line)


async def test_an_abort_is_logged_with_its_code(grpc_stub: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with pytest.raises(aio.AioRpcError):
        await grpc_stub.Cancel(
            session_pb2.CancelRequest(session="payload-abc"), metadata=[("x-request-id", "r1")]
        )
    [line] = rpc_lines(caplog)
    assert (line["method"], line["code"], line["request_id"]) == (
        "/agentsessions.v1.Sessions/Cancel",
        "UNIMPLEMENTED",
        "r1",
    )
    assert line["level"] == "info"
    assert "payload-abc" not in json.dumps(line)


async def test_a_call_past_its_deadline_is_logged_as_deadline_exceeded(
    grpc_stub: Any, grpc_servicer: ProbeServicer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with pytest.raises(aio.AioRpcError) as raised:
        async for _ in grpc_stub.Replay(session_pb2.ReplayRequest(), timeout=0.2):
            pass
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The host notices the deadline on its own schedule; wait (bounded) for the handler to unwind.
    await asyncio.wait_for(grpc_servicer.cancelled.wait(), timeout=30)
    for _ in range(300):
        if rpc_lines(caplog):
            break
        await asyncio.sleep(0.01)
    [line] = rpc_lines(caplog)
    assert line["code"] == "DEADLINE_EXCEEDED"


async def test_a_method_nobody_serves_is_unimplemented_and_logged(
    grpc_channel: aio.Channel, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    call = grpc_channel.unary_unary("/agentsessions.v1.Nothing/Here")(b"", metadata=[("x-request-id", "r2")])
    with pytest.raises(aio.AioRpcError) as raised:
        await call
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "agentsessions.v1.Nothing/Here" in (raised.value.details() or "")
    assert ("x-request-id", "r2") in tuple(raised.value.trailing_metadata())
    [line] = rpc_lines(caplog)
    assert (line["method"], line["code"]) == ("/agentsessions.v1.Nothing/Here", "UNIMPLEMENTED")
