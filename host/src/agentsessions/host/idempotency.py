"""The ``idempotency-key`` request metadata: read once per call, checked, bound to its CallContext.

:class:`IdempotencyInterceptor` runs inside the authentication interceptor, so the context it binds
keeps the authenticated principal (keys belong to the caller that sent them). A key is 1 to
``MAX_KEY_LENGTH`` printable ASCII characters; anything else answers INVALID_ARGUMENT before the
handler runs. Only the methods that admit work read it (``KEYED_METHODS``); the controller decides
what a key means (``controller/idempotency.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Final

import grpc
from grpc import aio

from agentsessions.host import callcontext
from agentsessions.host.interception import around_handler

METADATA_KEY: Final = "idempotency-key"
MAX_KEY_LENGTH: Final = 256
KEYED_METHODS: Final = frozenset(
    {
        "/agentsessions.v1.Sessions/Exec",
        "/agentsessions.v1.Sessions/Fork",
        "/agentsessions.v1.Sessions/CreateSession",
        "/agentsessions.v1.Sessions/Approve",
        "/agentsessions.v1.Sessions/Cancel",
        "/agentsessions.ext.v1.LiveSessions/Submit",
    }
)

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]


def key_of(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The request's key (None without one); ValueError naming the rule when it breaks it."""
    for name, value in metadata or ():
        if name != METADATA_KEY:
            continue
        if not isinstance(value, str) or not 0 < len(value) <= MAX_KEY_LENGTH:
            raise ValueError(f"must be 1 to {MAX_KEY_LENGTH} characters")
        if any(not 0x20 <= ord(c) < 0x7F for c in value):
            raise ValueError("must be printable ASCII")
        return value
    return None


class IdempotencyInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method not in KEYED_METHODS:
            return handler
        try:
            key = key_of(handler_call_details.invocation_metadata)
        except ValueError as exc:
            return around_handler(handler, functools.partial(_refuse, f"{METADATA_KEY} metadata: {exc}"))
        if key is None:
            return handler
        return around_handler(handler, functools.partial(_bind, method, key))


@contextlib.asynccontextmanager
async def _bind(method: str, key: str, context: aio.ServicerContext) -> AsyncIterator[None]:
    current = callcontext.current()
    callcontext.bind(dataclasses.replace(current, method=current.method or method, idempotency_key=key))
    yield


@contextlib.asynccontextmanager
async def _refuse(message: str, context: aio.ServicerContext) -> AsyncIterator[None]:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
    yield  # never reached: abort raises
