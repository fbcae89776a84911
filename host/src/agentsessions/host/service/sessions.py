"""``agentsessions.v1.Sessions`` over the controller: validation in, status codes out.

The servicer only translates between the wire and the controller (which knows nothing about
gRPC); domain errors become statuses through ``service.status``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import NoReturn, TypeVar

from grpc import aio

from agentsessions.host.controller.controller import (
    Controller,
    CreateParams,
    ExecParams,
    session_view_proto,
)
from agentsessions.host.controller.errors import ControllerError, InvalidArgumentError
from agentsessions.host.journal.store import StoreError
from agentsessions.host.service import validation as v
from agentsessions.host.service.status import status_of
from agentsessions.v1 import common_pb2, session_pb2, session_pb2_grpc

SERVICE_NAME: str = session_pb2.DESCRIPTOR.services_by_name["Sessions"].full_name
REPLAY_PAGE = 1000
T = TypeVar("T")


async def _abort(context: aio.ServicerContext, exc: BaseException) -> NoReturn:
    code, message = status_of(exc)
    await context.abort(code, message)
    raise AssertionError("context.abort returned")


async def _call(context: aio.ServicerContext, work: Awaitable[T]) -> T:
    try:
        return await work
    except (ControllerError, StoreError) as exc:
        await _abort(context, exc)


class SessionsServicer(session_pb2_grpc.SessionsServicer):
    """The client-facing Sessions API."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        try:
            params = _create_params(request.session)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        view = await _call(context, self.controller.create_session(params))
        return session_view_proto(view)

    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        try:
            uid = v.session_uid("uid", request.uid)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        return session_view_proto(await _call(context, self.controller.view(uid)))

    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, context: aio.ServicerContext
    ) -> session_pb2.ListSessionsResponse:
        try:
            project = v.bounded("project", request.project)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        views, token = await _call(
            context, self.controller.list_sessions(project, request.page_size, request.page_token)
        )
        return session_pb2.ListSessionsResponse(
            sessions=[session_view_proto(x) for x in views], next_page_token=token
        )

    async def DeleteSession(
        self, request: session_pb2.DeleteSessionRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        try:
            uid = v.session_uid("uid", request.uid)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        return session_view_proto(await _call(context, self.controller.delete_session(uid)))

    async def Exec(
        self, request: session_pb2.ExecRequest, context: aio.ServicerContext
    ) -> AsyncIterator[session_pb2.ExecUpdate]:
        try:
            params = _exec_params(request)
            async with self.controller.admit_exec(params) as turn:
                yield session_pb2.ExecUpdate(session=session_view_proto(turn.view))
                async for update in turn.run():
                    if isinstance(update, common_pb2.LogRecord):
                        yield session_pb2.ExecUpdate(record=update)
                    elif isinstance(update, session_pb2.Delta):
                        yield session_pb2.ExecUpdate(delta=update)
                    else:
                        yield session_pb2.ExecUpdate(session=update)
        except (ControllerError, StoreError) as exc:
            await _abort(context, exc)

    async def Replay(
        self, request: session_pb2.ReplayRequest, context: aio.ServicerContext
    ) -> AsyncIterator[common_pb2.LogRecord]:
        try:
            uid = v.session_uid("session", request.session)
            v.non_negative("to_seq", request.to_seq)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        if not await _call(context, self.controller.may_read_journal(uid)):
            return
        seq = max(request.from_seq, 1)
        last = request.to_seq
        store = self.controller.store
        while last == 0 or seq <= last:
            upper = seq + REPLAY_PAGE - 1 if last == 0 else min(seq + REPLAY_PAGE - 1, last)
            try:
                page = await store.read(uid, seq, upper)
            except StoreError as exc:
                await _abort(context, exc)
            for rec in page:
                yield rec
            if len(page) < upper - seq + 1:
                return
            seq = upper + 1

    async def Approve(
        self, request: session_pb2.ApproveRequest, context: aio.ServicerContext
    ) -> session_pb2.ApproveResponse:
        try:
            uid = v.session_uid("session", request.session)
            v.require("execution_id", request.execution_id)
            v.require("tool_call_id", request.tool_call_id)
            if request.request_seq <= 0:
                raise InvalidArgumentError("request_seq", f"must be positive, got {request.request_seq}")
            if not request.HasField("approved"):
                raise InvalidArgumentError("approved", "must be set (true to approve, false to deny)")
            v.bounded("reason", request.reason, v.MAX_VALUE)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        identity = request.identity if request.HasField("identity") else None
        view, record = await _call(
            context,
            self.controller.approve(
                uid,
                request.execution_id,
                request.tool_call_id,
                request.request_seq,
                request.approved,
                request.reason,
                identity,
            ),
        )
        return session_pb2.ApproveResponse(session=session_view_proto(view), decision=record)

    async def Cancel(
        self, request: session_pb2.CancelRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        try:
            uid = v.session_uid("session", request.session)
            v.bounded("reason", request.reason, v.MAX_VALUE)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        view = await _call(context, self.controller.cancel(uid, request.execution_id, request.reason))
        return session_view_proto(view)

    async def Suspend(
        self, request: session_pb2.SuspendRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        try:
            uid = v.session_uid("session", request.session)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        return session_view_proto(await _call(context, self.controller.suspend(uid)))

    async def Resume(
        self, request: session_pb2.ResumeRequest, context: aio.ServicerContext
    ) -> session_pb2.Session:
        try:
            uid = v.session_uid("session", request.session)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        return session_view_proto(await _call(context, self.controller.resume(uid)))

    async def Fork(
        self, request: session_pb2.ForkRequest, context: aio.ServicerContext
    ) -> session_pb2.ForkResponse:
        try:
            uid = v.session_uid("session", request.session)
            if request.HasField("identity"):
                raise InvalidArgumentError(
                    "identity", "must be unset: per-child principals are not supported"
                )
            labels = v.string_map("labels", request.labels)
            for i, name in enumerate(request.child_names):
                v.bounded(f"child_names[{i}]", name)
        except InvalidArgumentError as exc:
            await _abort(context, exc)
        children = await _call(
            context,
            self.controller.fork(uid, request.at_seq, request.count, list(request.child_names), labels),
        )
        return session_pb2.ForkResponse(children=[session_view_proto(c) for c in children])


def _create_params(s: session_pb2.Session) -> CreateParams:
    if s.metadata.uid:
        raise InvalidArgumentError("session.metadata.uid", "is assigned by the host; leave it empty")
    for name in ("last_seq", "parent_uid", "fork_seq"):
        if getattr(s, name):
            raise InvalidArgumentError(f"session.{name}", "is derived by the host; leave it unset")
    if s.HasField("compute") or s.HasField("pending_approval"):
        raise InvalidArgumentError("session.compute", "is derived by the host; leave it unset")
    return CreateParams(
        project=v.bounded("session.metadata.project", s.metadata.project),
        name=v.bounded("session.metadata.name", s.metadata.name),
        harness=v.harness_name("session.harness", s.harness),
        model=v.bounded("session.model", s.model),
        labels=v.string_map("session.labels", s.labels),
        annotations=v.string_map("session.annotations", s.annotations),
        origin=_origin(s),
        identity=s.identity if s.HasField("identity") else None,
    )


def _origin(s: session_pb2.Session) -> common_pb2.Origin | None:
    if not s.HasField("origin"):
        return None
    v.bounded("session.origin.source", s.origin.source)
    v.bounded("session.origin.subject", s.origin.subject)
    v.bounded("session.origin.uri", s.origin.uri, v.MAX_VALUE)
    v.string_map("session.origin.attributes", s.origin.attributes)
    return s.origin


def _exec_params(r: session_pb2.ExecRequest) -> ExecParams:
    if r.session:
        v.session_uid("session", r.session)
    v.harness_name("harness", r.harness)
    v.inputs("inputs", list(r.inputs))
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
