"""The RPC interceptor's SERVER spans for calls that end without an answer (the client cancels, the
deadline passes), on a probe Sessions servicer behind the host's two interceptors (access log,
then telemetry) on a real aio server; and its handlers, wrapped once per method."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, cast

import grpc
import pytest
from grpc import aio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind, StatusCode

from agentsessions.host.accesslog import AccessLogInterceptor
from agentsessions.host.telemetry import names, switch
from agentsessions.host.telemetry.rpc import TelemetryInterceptor
from tests.support.probe import ProbeServicer, probe_fixtures, replay_cancelled, replay_past_deadline
from tests.telemetry.conftest import Telemetry

REPLAY = "agentsessions.v1.Sessions/Replay"


class _Ended(SpanProcessor):
    """Wakes the waiting test when a span ends (from whichever thread ends it)."""

    def __init__(self) -> None:
        self.waiting: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None

    def on_end(self, span: ReadableSpan) -> None:
        waiting = self.waiting
        if waiting is not None:
            loop, event = waiting
            loop.call_soon_threadsafe(event.set)


_ENDED = _Ended()


@pytest.fixture
def traced(telemetry: Telemetry) -> Iterator[Telemetry]:
    provider = trace.get_tracer_provider()
    assert isinstance(provider, TracerProvider)
    if _ENDED not in provider._active_span_processor._span_processors:  # added once
        provider.add_span_processor(_ENDED)
    assert switch.refresh(), "the telemetry fixture installs a tracer provider"
    yield telemetry


grpc_add_to_server, grpc_servicer, grpc_stub_cls = probe_fixtures()


@pytest.fixture
def grpc_interceptors(traced: Telemetry) -> list[aio.ServerInterceptor]:
    return [AccessLogInterceptor(), TelemetryInterceptor()]


async def the_span(telemetry: Telemetry, name: str) -> ReadableSpan:
    """The one span named ``name``, awaited (bounded) until it has ended."""
    event = asyncio.Event()
    _ENDED.waiting = (asyncio.get_running_loop(), event)
    try:
        while True:
            event.clear()
            found = [s for s in telemetry.finished() if s.name == name]
            if found:
                (span,) = found
                return span
            await asyncio.wait_for(event.wait(), timeout=30)
    finally:
        _ENDED.waiting = None


async def test_a_stream_the_client_cancels_is_a_cancelled_server_span(
    grpc_stub: Any, grpc_servicer: ProbeServicer, traced: Telemetry
) -> None:
    await replay_cancelled(grpc_stub, grpc_servicer)
    span = await the_span(traced, REPLAY)
    assert span.kind is SpanKind.SERVER
    attributes = dict(span.attributes or {})
    assert attributes[names.RPC_METHOD] == REPLAY
    assert attributes[names.RPC_RESPONSE_STATUS_CODE] == "CANCELLED"
    assert span.status.status_code is not StatusCode.ERROR  # the caller's doing, not the server's


async def test_a_stream_past_its_deadline_is_an_error_server_span(
    grpc_stub: Any, grpc_servicer: ProbeServicer, traced: Telemetry
) -> None:
    await replay_past_deadline(grpc_stub, grpc_servicer)
    span = await the_span(traced, REPLAY)
    assert dict(span.attributes or {})[names.RPC_RESPONSE_STATUS_CODE] == "DEADLINE_EXCEEDED"
    assert span.status.status_code is StatusCode.ERROR


async def test_each_method_is_wrapped_once_not_once_per_call(traced: Telemetry) -> None:
    handler = grpc.unary_unary_rpc_method_handler(lambda request, context: request)
    interceptor = TelemetryInterceptor()

    async def continuation(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return handler

    def details(method: str) -> grpc.HandlerCallDetails:
        return cast("grpc.HandlerCallDetails", SimpleNamespace(method=method, invocation_metadata=()))

    get = "/agentsessions.v1.Sessions/GetSession"
    first = await interceptor.intercept_service(continuation, details(get))
    again = await interceptor.intercept_service(continuation, details(get))
    other = await interceptor.intercept_service(continuation, details("/agentsessions.v1.Sessions/Fork"))
    assert first is again
    assert first is not handler
    assert other is not first
