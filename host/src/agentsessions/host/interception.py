"""Running code around every call of a gRPC method handler, for the host's server interceptors.

``around_handler(handler, around)`` returns a handler of the same kind whose behavior enters
``around(context)`` (an async context manager) in the call's own task, runs the original behavior
inside it (for a streaming response, until the last message), and exits it. What ``around`` binds
to context variables is therefore seen by the handler and by the tasks it starts; aborting in
``__aenter__`` answers the call without running the handler.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc
from grpc import aio

Around = Callable[[aio.ServicerContext], AbstractAsyncContextManager[None]]
Behavior = Callable[[Any, Any], Any]


class Wrapped:
    """Method handlers as an interceptor wraps them, built once per handler (and key) rather than
    once per call: a served method's handler is one object for the server's life. Bounded: when
    ``limit`` wrappers are kept it starts over (handlers another interceptor makes per call only
    miss)."""

    __slots__ = ("_kept", "_limit", "_wrap")

    def __init__(
        self, wrap: Callable[[grpc.RpcMethodHandler, Any], grpc.RpcMethodHandler], limit: int = 256
    ) -> None:
        self._wrap = wrap
        self._limit = limit
        self._kept: dict[object, grpc.RpcMethodHandler] = {}

    def get(self, handler: grpc.RpcMethodHandler, key: Any = None) -> grpc.RpcMethodHandler:
        """``wrap(handler, key)``, made on the first call with them (``key``: what else the
        wrapper depends on)."""
        kept = self._kept
        found = kept.get((handler, key))
        if found is None:
            if len(kept) >= self._limit:
                kept.clear()
            found = kept[(handler, key)] = self._wrap(handler, key)
        return found


def around_handler(handler: grpc.RpcMethodHandler, around: Around) -> grpc.RpcMethodHandler:
    codec = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_unary(handler.unary_unary, around), **codec)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(_unary(handler.stream_unary, around), **codec)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(_stream(handler.unary_stream, around), **codec)
    return grpc.stream_stream_rpc_method_handler(_stream(handler.stream_stream, around), **codec)


def _unary(behavior: Behavior, around: Around) -> Behavior:
    async def serve(request: Any, context: aio.ServicerContext) -> Any:
        async with around(context):
            result = behavior(request, context)
            if inspect.isawaitable(result):
                result = await result
            return result

    return serve


def _stream(behavior: Behavior, around: Around) -> Behavior:
    async def serve(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        async with around(context):
            async for response in await responses_of(behavior, request, context):
                yield response

    return serve


async def responses_of(behavior: Behavior, request: Any, context: aio.ServicerContext) -> AsyncIterable[Any]:
    """A response-streaming behavior's responses, whichever form it gives them in: an async
    iterator (handed back as it is), an iterable, or none at all (it wrote them with
    ``context.write()``). The caller iterates them itself: a generator re-yielding an async
    iterator's items was one more frame resumed for every message of every stream."""
    responses = behavior(request, context)
    if type(responses) is types.AsyncGeneratorType:  # the usual form: no ABC checks for it
        return responses
    if inspect.isawaitable(responses):
        # A handler that writes with context.write() and returns nothing.
        responses = await responses
    if isinstance(responses, AsyncIterable):
        return responses
    return _each(() if responses is None else responses)


async def _each(items: Iterable[Any]) -> AsyncIterator[Any]:
    for item in items:
        yield item
