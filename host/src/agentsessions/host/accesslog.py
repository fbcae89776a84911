"""The access-log interceptor: one log line per RPC, and the RPC's request id.

For each call it binds the request id (``x-request-id`` from the caller, or a fresh one), returns it
in trailing metadata, runs the handler, and logs method, status code, duration and request id. It
never logs requests, responses or status details, which may carry user content. Calls to methods
no service serves are answered UNIMPLEMENTED here, so they get a request id and a log line too.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from agentsessions.host import eventloop, logs, requestid
from agentsessions.host.interception import Wrapped, around_handler

log = logging.getLogger("agentsessions.host.rpc")

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


class AccessLogInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self) -> None:
        # Each method's handler wrapped once: the request id is read in the call's own task.
        self._logged = Wrapped(_logged)

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        # The call is accepted: from here its work queues with everyone's (eventloop.py).
        eventloop.ACCEPTING.set(False)
        method: str = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None:
            # Made for this call alone: not kept.
            return _logged(grpc.stream_stream_rpc_method_handler(_unimplemented(method)), method)
        return self._logged.get(handler, method)


def _logged(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    return around_handler(handler, functools.partial(_Logged, method))


class _Logged:
    """Bind the request id, run the call, and log its line however it ends. (A class rather than a
    generator-based context manager: it wraps every call.)"""

    __slots__ = ("_call", "_context", "_method")

    def __init__(self, method: str, context: aio.ServicerContext) -> None:
        self._method = method
        self._context = context
        self._call: _Call | None = None

    async def __aenter__(self) -> None:
        context = self._context
        self._call = _Call(self._method, requestid.from_metadata(context.invocation_metadata()), context)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        call = self._call
        assert call is not None
        if exc is not None:
            call.failed(exc)
        call.log()


def _unimplemented(method: str) -> Callable[[Any, aio.ServicerContext], Awaitable[None]]:
    async def serve(requests: Any, context: aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method.lstrip('/')} is not served by this host")

    return serve


class _Call:
    """One RPC's bookkeeping: binds the request id and measures until ``log``."""

    def __init__(self, method: str, request_id: str, context: aio.ServicerContext) -> None:
        self.method = method
        self.request_id = request_id
        self.context = context
        self.error = ""
        self.code: grpc.StatusCode | None = None
        self.started = time.perf_counter()
        # Read while the call is certainly alive: a stream generator can be finalized after the
        # server has released the call, and touching the context then crashes grpc's C core. Only
        # a logged line needs it (a server fault, logged at error, reads it in ``failed``).
        self.peer = context.peer() if log.isEnabledFor(logging.INFO) else ""
        self.deadline = noted_deadline(context)
        # Each RPC runs in its own task, so the binding ends with the RPC and is never reset here.
        requestid.bind(request_id)
        context.set_trailing_metadata(((requestid.HEADER, request_id),))

    def failed(self, exc: BaseException) -> None:
        cancelled = cancelled_code(exc, self.context, self.deadline)
        if cancelled is not None:
            self.code = cancelled
        elif not isinstance(exc, aio.AbortError):
            # grpc answers UNKNOWN for an exception a handler lets escape; only its type is logged.
            self.code = grpc.StatusCode.UNKNOWN
            self.error = type(exc).__name__
            if not self.peer:
                self.peer = self.context.peer()

    def log(self) -> None:
        code = self.code or self.context.code() or grpc.StatusCode.OK
        level = logging.ERROR if code in _SERVER_FAULTS else logging.INFO
        if not log.isEnabledFor(level):
            return  # the line is built only when it is written
        values: dict[str, Any] = {
            "method": self.method,
            "code": code.name,
            "duration_ms": round((time.perf_counter() - self.started) * 1000, 3),
            "request_id": self.request_id,
            "peer": self.peer,
        }
        if self.error:
            values["error"] = self.error
        logs.log_fields(log, level, "rpc", values)


def noted_deadline(context: aio.ServicerContext) -> float | None:
    """The call's deadline on the monotonic clock (None: it has none), read at its start, while the
    call is certainly alive, for ``cancelled_code``."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def cancelled_code(
    exc: BaseException, context: aio.ServicerContext, deadline: float | None
) -> grpc.StatusCode | None:
    """The status of a call that ``exc`` cancelled (``cancel_code``), None for any other ending.

    A cancelled handler's call is live, so it is asked how much time it had left. A stream closed
    from outside (GeneratorExit: client gone, deadline passed, server stopped) may already be
    released by the server, and touching its context then crashes grpc's C core: the ``deadline``
    noted at the start (``noted_deadline``) tells which it was."""
    if isinstance(exc, asyncio.CancelledError):
        return cancel_code(context.time_remaining())
    if isinstance(exc, GeneratorExit):
        return cancel_code(None if deadline is None else deadline - time.monotonic())
    return None


def cancel_code(remaining: float | None) -> grpc.StatusCode:
    """DEADLINE_EXCEEDED for a cancel that came at (or just before) the call's deadline, else CANCELLED.

    The caller's deadline runs from when it sent the call, the host's from when the call arrived, so
    the caller gives up first by the call's transit time and the host sees a plain cancel a little
    before its own deadline; a cancel within that slack of the deadline is the deadline. (The RPC
    span's status code, agentsessions.host.telemetry.rpc, is told the same way: ``cancelled_code``.)
    """
    expired = remaining is not None and remaining <= _DEADLINE_SLACK_S
    return grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED


_DEADLINE_SLACK_S = 0.25
_SERVER_FAULTS = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.DATA_LOSS})
