"""The ``agentsessions-result-schema`` request metadata on ``Exec``: a JSON Schema as JSON text.

:class:`ResultSchemaInterceptor` reads the metadata once per Exec and binds its text to the call's
task; the servicer checks it (``controller.results.parse_metadata``: JSON, a JSON object, a valid
JSON Schema) before the turn is admitted, so a bad schema answers INVALID_ARGUMENT naming the
metadata and the rule, before anything is written. ``LiveSessions.Submit`` takes the same schema
as its ``result_schema`` field.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import grpc
from grpc import aio

from agentsessions.host.controller import results
from agentsessions.host.controller.errors import InvalidArgumentError
from agentsessions.host.interception import around_handler

EXEC_METHOD: Final = "/agentsessions.v1.Sessions/Exec"
FIELD: Final = f"{results.METADATA_KEY} metadata"

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]

_sent: contextvars.ContextVar[str | bytes | None] = contextvars.ContextVar(
    "agentsessions_result_schema", default=None
)


def requested() -> dict[str, Any] | None:
    """The schema the running Exec asked for (None: none); InvalidArgumentError when it is bad."""
    value = _sent.get()
    if value is None:
        return None
    try:
        return results.parse_metadata(value)
    except results.ResultSchemaError as exc:
        raise InvalidArgumentError(FIELD, str(exc)) from None


class ResultSchemaInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method != EXEC_METHOD:
            return handler
        for name, value in handler_call_details.invocation_metadata or ():
            if name == results.METADATA_KEY:
                return around_handler(handler, functools.partial(_bind, value))
        return handler


@contextlib.asynccontextmanager
async def _bind(value: str | bytes, context: aio.ServicerContext) -> AsyncIterator[None]:
    _sent.set(value)
    yield
