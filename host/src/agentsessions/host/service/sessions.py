"""``agentsessions.v1.Sessions`` over the controller: validation in, status codes out.

The servicer only translates between the wire and the controller (which knows nothing about
gRPC): requests become controller parameters, views become ``Session`` messages
(``service.convert``), domain errors become statuses (``service.status``). Each call's
:class:`~agentsessions.host.callcontext.CallContext`, bound by the server interceptors, is read
once and handed to the controller explicitly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from typing import Any, NoReturn, Protocol, TypeVar

import grpc
from google.protobuf.message import Message
from grpc import aio

from agentsessions.host import callcontext, protowire
from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller.approvals import Decision
from agentsessions.host.controller.controller import Controller
from agentsessions.host.controller.errors import InvalidArgumentError
from agentsessions.host.controller.fork import ForkParams
from agentsessions.host.controller.state import SessionView
from agentsessions.host.controller.turns import ExecParams
from agentsessions.host.journal.store import SessionRow
from agentsessions.host.limits import MAX_READABLE_BYTES, Limits
from agentsessions.host.service import result_schema
from agentsessions.host.service import validation as v
from agentsessions.host.service.convert import SessionWire, session_proto
from agentsessions.host.service.status import status_of
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc

SERVICE_NAME: str = session_pb2.DESCRIPTOR.services_by_name["Sessions"].full_name
# ExecUpdate.record's wire tag (field number << 3 | length-delimited): see _record_frame.
_RECORD_TAG = bytes([session_pb2.ExecUpdate.DESCRIPTOR.fields_by_name["record"].number << 3 | 2])
_TOKEN_TAG = bytes(
    [session_pb2.ListSessionsResponse.DESCRIPTOR.fields_by_name["next_page_token"].number << 3 | 2]
)


async def _abort(context: aio.ServicerContext, exc: BaseException) -> NoReturn:
    code, message = status_of(exc)
    await context.abort(code, message)
    raise AssertionError("context.abort returned")


class _Statuses:
    """Domain errors (validation included) raised inside become their gRPC status; anything else
    is INTERNAL; an abort already made passes through. (A class rather than a generator-based
    context manager: it wraps every call, and its enter and exit are then two plain calls.)"""

    __slots__ = ("_context",)

    def __init__(self, context: aio.ServicerContext) -> None:
        self._context = context

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if isinstance(exc, Exception) and not isinstance(exc, aio.AbortError):
            await _abort(self._context, exc)


Req = TypeVar("Req")
Resp = TypeVar("Resp")
Servicer = TypeVar("Servicer")


def _unary(
    method: Callable[[Servicer, Req, CallContext], Awaitable[Resp]],
) -> Callable[[Servicer, Req, aio.ServicerContext], Awaitable[Resp]]:
    """A unary handler whose domain errors (validation included) become their gRPC status."""

    @functools.wraps(method)
    async def handler(self: Servicer, request: Req, context: aio.ServicerContext) -> Resp:
        async with _Statuses(context):
            return await method(self, request, callcontext.current())
        raise AssertionError("unreachable: _Statuses raises what it does not return")

    return handler


def _streaming(
    method: Callable[[Servicer, Req, CallContext], AsyncGenerator[Resp, None]],
) -> Callable[[Servicer, Req, aio.ServicerContext], Awaitable[None]]:
    """A server-streaming handler: errors raised before the first frame answer with no frame.

    It writes each message itself (``context.write``) rather than yielding it: every wrapper an
    interceptor puts around a handler that yields re-yields each message, one more generator
    frame resumed for every message of every stream (three for an Exec: the access log, request
    decoding, this one); around a handler that writes, each wrapper runs once a call."""

    @functools.wraps(method)
    async def handler(self: Servicer, request: Req, context: aio.ServicerContext) -> None:
        await _write_each(method(self, request, callcontext.current()), context)

    return handler


Reading = Callable[[Coroutine[Any, Any, None]], Awaitable[None]]


class _Reads(Protocol):
    reading: Reading


Reader = TypeVar("Reader", bound=_Reads)


def _reading(
    method: Callable[[Reader, Req, CallContext], AsyncGenerator[Resp, None]],
) -> Callable[[Reader, Req, aio.ServicerContext], Awaitable[None]]:
    """A server-streaming read (Replay, Watch) that writes its messages itself, inside the
    servicer's ``reading`` (the readers' budget of the event loop: controller/pacing.py), so that
    gRPC's work for each message is charged to the call; errors as ``_streaming``'s."""

    @functools.wraps(method)
    async def handler(self: Reader, request: Req, context: aio.ServicerContext) -> None:
        await self.reading(_write_each(method(self, request, callcontext.current()), context))

    return handler


async def _write_each(items: AsyncGenerator[Resp, None], context: aio.ServicerContext) -> None:
    # aclosing: a client that goes away closes the stream now (an Exec's turn is cancelled and its
    # guard released), not whenever the garbage collector finalizes it.
    async with _Statuses(context), contextlib.aclosing(items):
        async for item in items:
            await context.write(item)


class SessionsServicer(session_pb2_grpc.SessionsServicer):
    """The client-facing Sessions API.

    Served by :func:`add_to_server`, Exec sends each record as the ExecUpdate's bytes, encoded
    from the record as the journal returned it (no copy into an ExecUpdate message first);
    registered the generated way (``add_SessionsServicer_to_server``) it sends messages.
    """

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.reading: Reading = controller.reading
        self.pre_encoded = False
        # Listed sessions' encodings, kept for the next page (ListSessions).
        self.wires = SessionWire(controller.limits.max_kept_listed_sessions)

    @_unary
    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, call: CallContext
    ) -> session_pb2.Session:
        requested = _requested_row(request.session, self.controller.limits)
        return session_proto(await self.controller.create_session(requested, call=call))

    @_unary
    async def GetSession(
        self, request: session_pb2.GetSessionRequest, call: CallContext
    ) -> session_pb2.Session:
        return session_proto(await self.controller.view(v.session_uid("uid", request.uid), call=call))

    # The page goes out as bytes when served by add_to_server (it is encoded here to check its size).
    @_unary
    async def ListSessions(  # type: ignore[override]
        self, request: session_pb2.ListSessionsRequest, call: CallContext
    ) -> session_pb2.ListSessionsResponse | bytes:
        project = v.bounded("project", request.project)
        views, token = await self.controller.list_sessions(
            project, request.page_size, request.page_token, call=call
        )
        encoded = self.encode_page(views, token)
        return encoded if self.pre_encoded else session_pb2.ListSessionsResponse.FromString(encoded)

    def encode_page(self, views: list[SessionView], token: str) -> bytes:
        """The ``ListSessionsResponse`` of ``views`` and the next page's ``token``, encoded; cut to
        its longest prefix (at least one session) a client on gRPC's default 4 MiB limit reads,
        with the token of the page after it, when the whole page would not fit."""
        parts = self.wires.framed(views)
        if sum(map(len, parts)) > MAX_READABLE_BYTES:
            size = 0
            for i, part in enumerate(parts):
                size += len(part)
                if i > 0 and size > MAX_READABLE_BYTES:
                    del parts[i:]
                    token = self.controller.page_token_after(views[i - 1])
                    break
        if token:
            text = token.encode("utf-8")
            parts.append(_TOKEN_TAG + protowire.varint(len(text)) + text)
        return b"".join(parts)

    @_unary
    async def DeleteSession(
        self, request: session_pb2.DeleteSessionRequest, call: CallContext
    ) -> session_pb2.Session:
        uid = v.session_uid("uid", request.uid)
        return session_proto(await self.controller.delete_session(uid, call=call))

    # Records go out as bytes when served by add_to_server; the generated stub types messages only.
    @_streaming
    async def Exec(  # type: ignore[override]
        self, request: session_pb2.ExecRequest, call: CallContext
    ) -> AsyncGenerator[session_pb2.ExecUpdate | bytes, None]:
        encoded = self.pre_encoded
        params = _exec_params(request, self.controller.limits)
        schema = result_schema.requested()  # the agentsessions-result-schema metadata, checked
        if schema is not None:
            params = dataclasses.replace(params, result_schema=schema)
        async with self.controller.admit_exec(params, call=call) as turn:
            yield session_pb2.ExecUpdate(session=session_proto(turn.view))
            async for update in turn.run():
                if isinstance(update, common_pb2.LogRecord):
                    yield _record_frame(update) if encoded else session_pb2.ExecUpdate(record=update)
                elif isinstance(update, session_pb2.Delta):
                    yield session_pb2.ExecUpdate(delta=update)
                else:
                    yield session_pb2.ExecUpdate(session=session_proto(update))

    @_reading
    async def Replay(  # type: ignore[override]
        self, request: session_pb2.ReplayRequest, call: CallContext
    ) -> AsyncGenerator[common_pb2.LogRecord, None]:
        uid = v.session_uid("session", request.session)
        v.non_negative("to_seq", request.to_seq)
        async for record in self.controller.records(uid, request.from_seq, request.to_seq, call=call):
            yield record

    @_unary
    async def Approve(
        self, request: session_pb2.ApproveRequest, call: CallContext
    ) -> session_pb2.ApproveResponse:
        uid = v.session_uid("session", request.session)
        v.require("execution_id", request.execution_id)
        v.require("tool_call_id", request.tool_call_id)
        if request.request_seq <= 0:
            raise InvalidArgumentError("request_seq", f"must be positive, got {request.request_seq}")
        if not request.HasField("approved"):
            raise InvalidArgumentError("approved", "must be set (true to approve, false to deny)")
        v.bounded("reason", request.reason, v.MAX_VALUE)
        if request.HasField("identity"):
            v.identity("identity", request.identity, self.controller.limits.max_identity_bytes)
        decision = Decision(
            request.execution_id,
            request.tool_call_id,
            request.request_seq,
            request.approved,
            request.reason,
            request.identity if request.HasField("identity") else None,
        )
        view, record = await self.controller.approve(uid, decision, call=call)
        return session_pb2.ApproveResponse(session=session_proto(view), decision=record)

    @_unary
    async def Cancel(self, request: session_pb2.CancelRequest, call: CallContext) -> session_pb2.Session:
        uid = v.session_uid("session", request.session)
        v.bounded("reason", request.reason, v.MAX_VALUE)
        return session_proto(
            await self.controller.cancel(uid, request.execution_id, request.reason, call=call)
        )

    @_unary
    async def Suspend(self, request: session_pb2.SuspendRequest, call: CallContext) -> session_pb2.Session:
        uid = v.session_uid("session", request.session)
        return session_proto(await self.controller.suspend(uid, call=call))

    @_unary
    async def Resume(self, request: session_pb2.ResumeRequest, call: CallContext) -> session_pb2.Session:
        uid = v.session_uid("session", request.session)
        return session_proto(await self.controller.resume(uid, call=call))

    @_unary
    async def Fork(self, request: session_pb2.ForkRequest, call: CallContext) -> session_pb2.ForkResponse:
        uid = v.session_uid("session", request.session)
        if request.HasField("identity"):
            raise InvalidArgumentError("identity", "must be unset: per-child principals are not supported")
        labels = v.string_map("labels", request.labels)
        for i, name in enumerate(request.child_names):
            v.bounded(f"child_names[{i}]", name)
        params = ForkParams(request.at_seq, request.count, list(request.child_names), labels)
        children = await self.controller.fork(uid, params, call=call)
        return session_pb2.ForkResponse(children=[session_proto(c) for c in children])


def add_to_server(servicer: SessionsServicer, server: aio.Server) -> None:
    """Serve ``servicer`` as ``agentsessions.v1.Sessions``, its Exec records pre-encoded (what
    ``add_SessionsServicer_to_server`` does otherwise, every frame a message, works too)."""
    service = session_pb2.DESCRIPTOR.services_by_name["Sessions"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        request = getattr(session_pb2, method.input_type.name)
        response = getattr(session_pb2, method.output_type.name, None) or getattr(
            common_pb2, method.output_type.name
        )
        serialize = _as_bytes if method.name in _PRE_ENCODED else response.SerializeToString
        if method.client_streaming:
            raise TypeError(f"Sessions.{method.name}: client streaming is not served here")
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=request.FromString,
            response_serializer=serialize,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))
    # Registered, each method has a request of its own open in the core: a ListSessions is accepted
    # beside a queue of Exec calls instead of behind it (grpc.aio takes one call a pass for each
    # open request). Served generically alone, a listing under 200 sessions' turns waited ~200 ms.
    server.add_registered_method_handlers(service.full_name, handlers)
    servicer.pre_encoded = True


def _record_frame(record: common_pb2.LogRecord) -> bytes:
    """``ExecUpdate{record}`` on the wire: the record's encoding behind the field's tag and length."""
    body = record.SerializeToString()
    return b"".join((_RECORD_TAG, protowire.varint(len(body)), body))


# Methods whose handlers may answer with their response already encoded (``pre_encoded``).
_PRE_ENCODED = frozenset({"Exec", "ListSessions"})


def _as_bytes(message: Message | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _requested_row(s: session_pb2.Session, limits: Limits) -> SessionRow:
    """What the caller may set on a new session, as a row without uid (the host assigns it)."""
    if s.metadata.uid:
        raise InvalidArgumentError("session.metadata.uid", "is assigned by the host; leave it empty")
    for name in ("last_seq", "parent_uid", "fork_seq"):
        if getattr(s, name):
            raise InvalidArgumentError(f"session.{name}", "is derived by the host; leave it unset")
    if s.HasField("compute") or s.HasField("pending_approval"):
        raise InvalidArgumentError("session.compute", "is derived by the host; leave it unset")
    return SessionRow(
        uid="",
        project=v.bounded("session.metadata.project", s.metadata.project),
        name=v.bounded("session.metadata.name", s.metadata.name),
        harness=v.harness_name("session.harness", s.harness),
        model=v.bounded("session.model", s.model),
        labels=v.string_map("session.labels", s.labels),
        annotations=v.string_map("session.annotations", s.annotations),
        origin=_origin(s),
        identity=v.identity("session.identity", s.identity, limits.max_identity_bytes)
        if s.HasField("identity")
        else None,
    )


def _origin(s: session_pb2.Session) -> common_pb2.Origin | None:
    if not s.HasField("origin"):
        return None
    v.bounded("session.origin.source", s.origin.source)
    v.bounded("session.origin.subject", s.origin.subject)
    v.bounded("session.origin.uri", s.origin.uri, v.MAX_VALUE)
    v.string_map("session.origin.attributes", s.origin.attributes)
    return s.origin


def _exec_params(r: session_pb2.ExecRequest, limits: Limits) -> ExecParams:
    if r.session:
        v.session_uid("session", r.session)
    v.harness_name("harness", r.harness)
    v.inputs("inputs", list(r.inputs), limits.max_input_bytes)
    v.non_negative("resume_from_seq", r.resume_from_seq)
    v.non_negative("deadline_unix", r.deadline_unix)
    if len(r.config) > v.MAX_CONFIG_BYTES:
        raise InvalidArgumentError(
            "config", f"must be at most {v.MAX_CONFIG_BYTES} bytes, got {len(r.config)}"
        )
    expected: int | None = None
    if r.HasField("expected_last_seq"):
        expected = v.non_negative("expected_last_seq", r.expected_last_seq)
    return ExecParams(
        session=r.session,
        inputs=list(r.inputs),
        harness=r.harness,
        config=r.config,
        resume_from_seq=r.resume_from_seq,
        expected_last_seq=expected,
        deadline_unix=r.deadline_unix,
    )


# The handler wrappers and Exec's request translation, shared with the LiveSessions servicer.
unary_handler = _unary
reading_handler = _reading
exec_params = _exec_params
