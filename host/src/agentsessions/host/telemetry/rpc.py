"""A SERVER span and a duration measurement per RPC, joined to the caller's trace.

The span is named for the method (``agentsessions.v1.Sessions/Exec``), carries the method, the
status code name and the request id, and is the current span while the handler runs, so the turn
and journal spans of the call nest under it. A caller's W3C ``traceparent`` makes it a child of the
caller's span. Health checks are not traced (probes would drown the traces) but are measured.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import grpc
from grpc import aio
from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace

from agentsessions.host import requestid
from agentsessions.host.accesslog import cancel_code, cancelled_code, noted_deadline
from agentsessions.host.interception import Wrapped, around_handler
from agentsessions.host.telemetry import names, switch

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]

_UNTRACED_SERVICES = frozenset({"grpc.health.v1.Health"})

# Server spans are errors for these codes only: the rest are the caller's mistakes (semconv).
_SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)

_tracer = trace.get_tracer(names.INSTRUMENTATION)
_meter = metrics.get_meter(names.INSTRUMENTATION)
_duration = _meter.create_histogram(
    names.RPC_SERVER_CALL_DURATION, unit="s", description="Duration of RPCs served by the host."
)


class TelemetryInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self) -> None:
        # Each method's handler wrapped once, not once per call: the caller's trace context is read
        # in the call's own task. (A handler made per call here also made every call miss the
        # access log's wrapper cache, one interceptor out.)
        self._observed = Wrapped(_observed)

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or not switch.enabled():
            return handler
        return self._observed.get(handler, handler_call_details.method.lstrip("/"))


def _observed(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    traced = method.rpartition("/")[0] not in _UNTRACED_SERVICES
    return around_handler(handler, functools.partial(_Observed, method, traced))


class _Observed:
    """One call's span and duration. (A class rather than a generator-based context manager: it
    wraps every call while telemetry is on.)"""

    __slots__ = ("_context", "_deadline", "_method", "_span", "_started", "_traced")

    def __init__(self, method: str, traced: bool, context: aio.ServicerContext) -> None:
        self._method = method
        self._traced = traced
        self._context = context
        self._span: trace.Span = trace.INVALID_SPAN
        self._started = 0.0
        self._deadline: float | None = None

    async def __aenter__(self) -> None:
        context = self._context
        self._started = time.perf_counter()
        self._deadline = noted_deadline(context)
        if self._traced:
            parent = propagate.extract(_carrier(context.invocation_metadata()))
            span = self._span = _tracer.start_span(
                self._method,
                context=parent,
                kind=trace.SpanKind.SERVER,
                attributes={names.RPC_SYSTEM_NAME: "grpc", names.RPC_METHOD: self._method},
            )
            # Each RPC runs in its own task, so the attachment ends with the RPC and is never detached.
            otel_context.attach(trace.set_span_in_context(span, parent))

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        context, span = self._context, self._span
        if exc is None:
            code = context.code() or grpc.StatusCode.OK
        elif isinstance(exc, aio.AbortError):
            code = context.code() or grpc.StatusCode.UNKNOWN
        else:
            code = self._code_of(exc)
            span.set_attribute(names.ERROR_TYPE, type(exc).__name__)
        status_code = code.name if isinstance(code, grpc.StatusCode) else str(code)
        _duration.record(
            time.perf_counter() - self._started,
            {
                names.RPC_SYSTEM_NAME: "grpc",
                names.RPC_METHOD: self._method,
                names.RPC_RESPONSE_STATUS_CODE: status_code,
            },
        )
        if self._traced:
            span.set_attribute(names.RPC_RESPONSE_STATUS_CODE, status_code)
            if requestid.current():
                span.set_attribute(names.REQUEST_ID, requestid.current())
            if code in _SERVER_ERRORS:
                # The status code names what went wrong; details may carry user content, so they stay out.
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            span.end()

    def _code_of(self, exc: BaseException) -> grpc.StatusCode:
        if isinstance(exc, BaseExceptionGroup | Exception):
            return grpc.StatusCode.UNKNOWN
        cancelled = cancelled_code(exc, self._context, self._deadline)
        return cancelled if cancelled is not None else cancel_code(self._context.time_remaining())


def _carrier(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    return {key: value for key, value in metadata or () if isinstance(value, str)}
