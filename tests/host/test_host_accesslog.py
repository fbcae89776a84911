"""The access-log interceptor, in front of a probe Sessions servicer on a real aio server, through
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
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc

RPC_LOGGER = "agentsessions.host.rpc"
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


@pytest.fixture
def grpc_add_to_server() -> Any:
    return add_probe


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


class _Written(logging.Handler):
    """Sets an event when the access log writes a line (from whichever thread writes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.loop.call_soon_threadsafe(self.event.set)


async def the_line(caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """The call's one access-log line. The caller has its status as soon as the handler answers;
    the line is written when the handler unwinds, so it is awaited (bounded), never assumed."""
    logger = logging.getLogger(RPC_LOGGER)
    written = _Written()
    logger.addHandler(written)
    try:
        while not rpc_lines(caplog):
            written.event.clear()
            if rpc_lines(caplog):
                break
            await asyncio.wait_for(written.event.wait(), timeout=30)
    finally:
        logger.removeHandler(written)
    [line] = rpc_lines(caplog)
    return line


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
    line = await the_line(caplog)
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
    line = await the_line(caplog)
    assert line["level"] == "error"
    assert line["code"] == "UNKNOWN"
    assert line["error"] == "RuntimeError"
    assert "payload-xyz" not in json.dumps(line)


async def test_an_abort_is_logged_with_its_code(grpc_stub: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with pytest.raises(aio.AioRpcError) as raised:
        await grpc_stub.Cancel(
            session_pb2.CancelRequest(session="payload-abc"), metadata=[("x-request-id", "r1")]
        )
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert ("x-request-id", "r1") in tuple(raised.value.trailing_metadata())
    line = await the_line(caplog)
    assert (line["method"], line["code"], line["request_id"]) == (
        "/agentsessions.v1.Sessions/Cancel",
        "FAILED_PRECONDITION",
        "r1",
    )
    assert line["level"] == "info"
    assert "payload-abc" not in json.dumps(line)


async def logged_after_unwinding(servicer: ProbeServicer, caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    """The host ends the handler on its own schedule: wait (bounded) for it, then for its log line."""
    await asyncio.wait_for(servicer.cancelled.wait(), timeout=30)
    return await the_line(caplog)


async def test_a_call_the_client_cancels_is_logged_as_cancelled(
    grpc_stub: Any, grpc_servicer: ProbeServicer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    call = grpc_stub.Replay(session_pb2.ReplayRequest(), timeout=60)
    reading = asyncio.ensure_future(call.read())
    await asyncio.wait_for(grpc_servicer.started.wait(), timeout=30)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    assert (await logged_after_unwinding(grpc_servicer, caplog))["code"] == "CANCELLED"


async def test_a_call_past_its_deadline_is_logged_as_deadline_exceeded(
    grpc_stub: Any, grpc_servicer: ProbeServicer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    call = grpc_stub.Replay(session_pb2.ReplayRequest(), timeout=2)
    with pytest.raises(aio.AioRpcError) as raised:
        async for _ in call:
            pass
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    if not grpc_servicer.started.is_set():
        pytest.skip("the deadline passed before the handler started (machine too loaded)")
    assert (await logged_after_unwinding(grpc_servicer, caplog))["code"] == "DEADLINE_EXCEEDED"


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
    line = await the_line(caplog)
    assert (line["method"], line["code"]) == ("/agentsessions.v1.Nothing/Here", "UNIMPLEMENTED")


async def test_an_rpc_the_servicer_does_not_serve_is_unimplemented_naming_it(grpc_stub: Any) -> None:
    with pytest.raises(aio.AioRpcError) as raised:
        async for _ in grpc_stub.Exec(session_pb2.ExecRequest()):
            pass
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert raised.value.details() == "agentsessions.v1.Sessions/Exec is not served by this host"
