"""A SERVER span and a duration measurement per RPC, joined to the caller's trace.

The span is named for the method (``agentsessions.v1.Sessions/Exec``), carries the method, the
status code name and the request id, and is the current span while the handler runs, so the turn
and journal spans of the call nest under it. A caller's W3C ``traceparent`` makes it a child of the
caller's span. Health checks are not traced (probes would drown the traces) but are measured.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import grpc
from grpc import aio
from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace

from agentsessions.host import requestid
from agentsessions.host.interception import around_handler
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
    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or not switch.enabled():
            return handler
        method: str = handler_call_details.method.lstrip("/")
        metadata = handler_call_details.invocation_metadata
        traced = method.rpartition("/")[0] not in _UNTRACED_SERVICES
        return around_handler(handler, functools.partial(_observe, method, metadata, traced))


@contextlib.asynccontextmanager
async def _observe(
    method: str,
    metadata: Iterable[tuple[str, str | bytes]] | None,
    traced: bool,
    context: aio.ServicerContext,
) -> AsyncIterator[None]:
    started = time.perf_counter()
    span: trace.Span = trace.INVALID_SPAN
    if traced:
        parent = propagate.extract(_carrier(metadata))
        span = _tracer.start_span(
            method,
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={names.RPC_SYSTEM_NAME: "grpc", names.RPC_METHOD: method},
        )
        # Each RPC runs in its own task, so the attachment ends with the RPC and is never detached.
        otel_context.attach(trace.set_span_in_context(span, parent))
    code = grpc.StatusCode.OK
    try:
        yield
        code = context.code() or grpc.StatusCode.OK
    except aio.AbortError:
        code = context.code() or grpc.StatusCode.UNKNOWN
        raise
    except BaseException as exc:
        code = _code_of(exc, context)
        span.set_attribute(names.ERROR_TYPE, type(exc).__name__)
        raise
    finally:
        status_code = code.name if isinstance(code, grpc.StatusCode) else str(code)
        _duration.record(
            time.perf_counter() - started,
            {
                names.RPC_SYSTEM_NAME: "grpc",
                names.RPC_METHOD: method,
                names.RPC_RESPONSE_STATUS_CODE: status_code,
            },
        )
        if traced:
            span.set_attribute(names.RPC_RESPONSE_STATUS_CODE, status_code)
            if requestid.current():
                span.set_attribute(names.REQUEST_ID, requestid.current())
            if code in _SERVER_ERRORS:
                # The status code names what went wrong; details may carry user content, so they stay out.
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            span.end()


def _code_of(exc: BaseException, context: aio.ServicerContext) -> grpc.StatusCode:
    if isinstance(exc, BaseExceptionGroup | Exception):
        return grpc.StatusCode.UNKNOWN
    remaining = context.time_remaining()
    return (
        grpc.StatusCode.DEADLINE_EXCEEDED
        if remaining is not None and remaining <= 0
        else grpc.StatusCode.CANCELLED
    )


def _carrier(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    return {key: value for key, value in metadata or () if isinstance(value, str)}
