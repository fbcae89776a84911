"""Request bytes that do not decode answer INVALID_ARGUMENT naming the field, not UNKNOWN.

gRPC decodes a request before any handler runs; when the protobuf runtime refuses the bytes
(invalid UTF-8 in a string field, a truncated or corrupt message, nesting past the parser's depth
limit) it logs a traceback and answers UNKNOWN. :class:`DecodingInterceptor` swaps each method's
request decoder for one that never raises: bytes that do not decode become an
:class:`Undecodable`, which the call answers with INVALID_ARGUMENT naming the first field that
breaks a wire rule (``agentsessions.host.protowire``) before the handler sees anything. It sits
innermost, so authentication still answers first and the servicers only ever see messages.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import message
from grpc import aio

from agentsessions.host import protowire
from agentsessions.host.controller.errors import InvalidArgumentError
from agentsessions.host.interception import Wrapped, responses_of
from agentsessions.host.service.status import status_of
from agentsessions.sdk.structs import struct

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]]
Decoder = Callable[[bytes], Any]


@struct(frozen=True)
class Undecodable:
    """Request bytes the protobuf runtime refused, with the refusal named by field."""

    error: InvalidArgumentError


def refusal(message_type: type[message.Message], data: bytes, parser_error: str) -> InvalidArgumentError:
    """The INVALID_ARGUMENT for ``data`` that does not decode as ``message_type``."""
    found = protowire.explain(message_type.DESCRIPTOR, data, parser_error)  # type: ignore[arg-type]
    return InvalidArgumentError(found.path or "request", found.rule)


def tolerant(decoder: Decoder | None) -> Decoder | None:
    """A request decoder that returns :class:`Undecodable` instead of raising."""
    message_type = getattr(decoder, "__self__", None)
    if decoder is None or not (isinstance(message_type, type) and issubclass(message_type, message.Message)):
        return decoder
    parse = decoder
    kind: type[message.Message] = message_type

    def decode(data: bytes) -> Any:
        try:
            return parse(data)
        except message.DecodeError as exc:
            return Undecodable(refusal(kind, data, str(exc)))

    return decode


class DecodingInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self) -> None:
        self._checked = Wrapped(lambda handler, _: _checked(handler))  # once per method's handler

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        return self._checked.get(handler)


def _checked(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    decoder = tolerant(handler.request_deserializer)
    if decoder is handler.request_deserializer:
        return handler
    codec = {"request_deserializer": decoder, "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_checked_unary(handler.unary_unary), **codec)
    return grpc.unary_stream_rpc_method_handler(_checked_stream(handler.unary_stream), **codec)


async def _refuse(context: aio.ServicerContext, undecodable: Undecodable) -> None:
    code, text = status_of(undecodable.error)
    await context.abort(code, text)


def _checked_unary(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, aio.ServicerContext], Any]:
    async def serve(request: Any, context: aio.ServicerContext) -> Any:
        if isinstance(request, Undecodable):
            await _refuse(context, request)
        result = behavior(request, context)
        return await result if inspect.isawaitable(result) else result

    return serve


def _checked_stream(behavior: Callable[[Any, Any], Any]) -> Callable[[Any, aio.ServicerContext], Any]:
    async def serve(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        if isinstance(request, Undecodable):
            await _refuse(context, request)
        async for response in await responses_of(behavior, request, context):
            yield response

    return serve
