"""The access-log interceptor, in front of a probe Sessions servicer on a real aio server, through
pytest-grpc's fixtures (grpc_add_to_server / grpc_servicer / grpc_stub_cls, aio overrides in conftest).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import grpc
import pytest
from grpc import aio

from agentsessions.host import logs
from agentsessions.host.accesslog import AccessLogInterceptor
from agentsessions.v1 import session_pb2
from tests.support.probe import ProbeServicer, probe_fixtures, replay_cancelled, replay_past_deadline

RPC_LOGGER = "agentsessions.host.rpc"


grpc_add_to_server, grpc_servicer, grpc_stub_cls = probe_fixtures()


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
    await replay_cancelled(grpc_stub, grpc_servicer)
    assert (await logged_after_unwinding(grpc_servicer, caplog))["code"] == "CANCELLED"


async def test_a_call_past_its_deadline_is_logged_as_deadline_exceeded(
    grpc_stub: Any, grpc_servicer: ProbeServicer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await replay_past_deadline(grpc_stub, grpc_servicer)
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
