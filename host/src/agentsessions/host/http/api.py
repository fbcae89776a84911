"""The JSON routes of the HTTP API: each one is a gRPC call on the loopback channel.

A POST body is the RPC's request message in proto3 JSON; the session a path names fills the
request's ``uid``/``session`` field (a body naming another session is INVALID_ARGUMENT). GET
query parameters are the request's fields. Streaming RPCs (Exec, Replay) answer newline-delimited
JSON, one message per line. The route table is docs/http.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.message import Message
from grpc import aio
from grpc_health.v1 import health_pb2

from agentsessions.ext.v1 import live_pb2
from agentsessions.host.http import protojson
from agentsessions.host.http.loopback import Caller, Loopback
from agentsessions.host.http.status import HttpError, error_body
from agentsessions.host.usercli.commands import ChainCheck
from agentsessions.v1 import session_pb2

PREFIX = "/api/v1"
# Each unary call is bounded; streams last as long as their client stays.
UNARY_TIMEOUT_S = 60.0
# ?state= walks at most this many pages of ListSessions per request.
MAX_STATE_PAGES = 20

_INVALID = grpc.StatusCode.INVALID_ARGUMENT
_STATES = {
    name.removeprefix("EXEC_"): value
    for name, value in session_pb2.ExecState.items()
    if value != session_pb2.EXEC_STATE_UNSPECIFIED
}


def _named_session(message: Message, field: str, uid: str) -> None:
    """Put the path's session uid in ``field`` (dotted for a nested field)."""
    *parents, name = field.split(".")
    target: Any = message
    for parent in parents:
        target = getattr(target, parent)
    given = getattr(target, name)
    if given and given != uid:
        raise HttpError(_INVALID, f"{field}: the body names {given!r} but the path names {uid!r}")
    setattr(target, name, uid)


def exec_state(value: str | None) -> int | None:
    """``?state=AWAITING`` (or ``EXEC_AWAITING``, any case) as an ExecState; None: every state."""
    if value is None or value == "":
        return None
    state = _STATES.get(value.upper().removeprefix("EXEC_"))
    if state is None:
        raise HttpError(_INVALID, f"state: must be one of {', '.join(_STATES)}, got {value[:40]!r}")
    return state


class Api:
    """The routes under /api/v1 and /healthz."""

    def __init__(self, loopback: Loopback) -> None:
        self.loopback = loopback

    def routes(self) -> list[web.RouteDef]:
        s = f"{PREFIX}/sessions/{{uid}}"
        return [
            web.get(f"{PREFIX}/sessions", self.list_sessions),
            web.post(f"{PREFIX}/sessions", self.create_session),
            web.get(s, self.get_session),
            web.delete(s, self.delete_session),
            web.post(f"{PREFIX}/exec", self.exec),
            web.post(f"{s}/exec", self.exec),
            web.post(f"{PREFIX}/submit", self.submit),
            web.post(f"{s}/submit", self.submit),
            web.post(f"{s}/approve", self._unary("Approve", session_pb2.ApproveRequest)),
            web.post(f"{s}/cancel", self._unary("Cancel", session_pb2.CancelRequest)),
            web.post(f"{s}/fork", self._unary("Fork", session_pb2.ForkRequest)),
            web.post(f"{s}/suspend", self._unary("Suspend", session_pb2.SuspendRequest)),
            web.post(f"{s}/resume", self._unary("Resume", session_pb2.ResumeRequest)),
            web.get(f"{s}/records", self.records),
            web.get(f"{s}/verify", self.verify),
            web.get("/healthz", self.health),
        ]

    def _unary(self, method: str, request_type: Callable[[], Message]) -> Callable[[web.Request], Any]:
        """A POST on a session whose body is ``request_type`` and whose answer is one message."""

        async def handle(request: web.Request) -> web.Response:
            names = protojson.names_of(request)
            message = await protojson.body_message(request, request_type())
            _named_session(message, "session", request.match_info["uid"])
            rpc = getattr(self.loopback.sessions, method)
            answer = await rpc(message, metadata=Caller.of(request).metadata, timeout=UNARY_TIMEOUT_S)
            return protojson.json_response(answer, names)

        return handle

    async def list_sessions(self, request: web.Request) -> web.Response:
        names = protojson.names_of(request)
        message = protojson.query_message(request, session_pb2.ListSessionsRequest(), reserved=("state",))
        state = exec_state(request.query.get("state"))
        caller = Caller.of(request)
        if state is None:
            answer = await self.loopback.sessions.ListSessions(
                message, metadata=caller.metadata, timeout=UNARY_TIMEOUT_S
            )
        else:
            answer = await self._list_in_state(message, state, caller)
        return protojson.json_response(answer, names)

    async def _list_in_state(
        self, message: session_pb2.ListSessionsRequest, state: int, caller: Caller
    ) -> session_pb2.ListSessionsResponse:
        """The sessions in ``state``, from whole pages of ListSessions until ``page_size`` of them
        (or the end, or MAX_STATE_PAGES pages); the token resumes after the last page read."""
        found = session_pb2.ListSessionsResponse()
        token = message.page_token
        wanted = message.page_size
        for _ in range(MAX_STATE_PAGES):
            page = await self.loopback.sessions.ListSessions(
                session_pb2.ListSessionsRequest(
                    project=message.project, page_size=message.page_size, page_token=token
                ),
                metadata=caller.metadata,
                timeout=UNARY_TIMEOUT_S,
            )
            found.sessions.extend(s for s in page.sessions if s.exec_state == state)
            wanted = wanted or len(page.sessions)
            token = page.next_page_token
            if not token or len(found.sessions) >= wanted:
                break
        found.next_page_token = token
        return found

    async def create_session(self, request: web.Request) -> web.Response:
        names = protojson.names_of(request)
        message = await protojson.body_message(request, session_pb2.CreateSessionRequest())
        answer = await self.loopback.sessions.CreateSession(
            message, metadata=Caller.of(request).metadata, timeout=UNARY_TIMEOUT_S
        )
        return protojson.json_response(answer, names)

    async def get_session(self, request: web.Request) -> web.Response:
        names = protojson.names_of(request)
        answer = await self.loopback.sessions.GetSession(
            session_pb2.GetSessionRequest(uid=request.match_info["uid"]),
            metadata=Caller.of(request).metadata,
            timeout=UNARY_TIMEOUT_S,
        )
        return protojson.json_response(answer, names)

    async def delete_session(self, request: web.Request) -> web.Response:
        names = protojson.names_of(request)
        answer = await self.loopback.sessions.DeleteSession(
            session_pb2.DeleteSessionRequest(uid=request.match_info["uid"]),
            metadata=Caller.of(request).metadata,
            timeout=UNARY_TIMEOUT_S,
        )
        return protojson.json_response(answer, names)

    async def exec(self, request: web.Request) -> web.StreamResponse:
        """Exec: the turn's ExecUpdate frames as they come, one JSON line each. The turn belongs to
        the request, as to a gRPC stream: a client that goes away cancels it (Submit does not)."""
        names = protojson.names_of(request)
        message = await protojson.body_message(request, session_pb2.ExecRequest())
        if "uid" in request.match_info:
            _named_session(message, "session", request.match_info["uid"])
        call = self.loopback.sessions.Exec(message, metadata=Caller.of(request).metadata)
        return await _lines(request, call, names)

    async def submit(self, request: web.Request) -> web.Response:
        """LiveSessions.Submit: admit the turn and answer once it is durably admitted."""
        names = protojson.names_of(request)
        message = await protojson.body_message(request, live_pb2.SubmitRequest())
        if "uid" in request.match_info:
            _named_session(message, "exec.session", request.match_info["uid"])
        answer = await self.loopback.live.Submit(
            message, metadata=Caller.of(request).metadata, timeout=UNARY_TIMEOUT_S
        )
        return protojson.json_response(answer, names)

    async def records(self, request: web.Request) -> web.StreamResponse:
        """Sessions.Replay: the stored records, one JSON line each (``?from_seq``, ``?to_seq``)."""
        names = protojson.names_of(request)
        message = protojson.query_message(request, session_pb2.ReplayRequest())
        _named_session(message, "session", request.match_info["uid"])
        call = self.loopback.sessions.Replay(message, metadata=Caller.of(request).metadata)
        return await _lines(request, call, names)

    async def verify(self, request: web.Request) -> web.Response:
        """Recompute the session's chain from genesis over the records the host returns, as
        ``agentsessions verify --json`` does (the console checks it again in the browser)."""
        uid = request.match_info["uid"]
        metadata = Caller.of(request).metadata
        session = await self.loopback.sessions.GetSession(
            session_pb2.GetSessionRequest(uid=uid), metadata=metadata, timeout=UNARY_TIMEOUT_S
        )
        check = ChainCheck(uid)
        call = self.loopback.sessions.Replay(session_pb2.ReplayRequest(session=uid), metadata=metadata)
        try:
            record = await call.read()
            while record is not aio.EOF and check.take(record):
                record = await call.read()
        finally:
            call.cancel()
        if not check.why and check.count < session.last_seq:
            check.failed_seq = check.count + 1
            check.why = f"the host returned {check.count} of {session.last_seq} records"
        body: dict[str, object] = {"session": uid, "verified": not check.why, "records": check.count}
        if check.why:
            body.update(failedSeq=check.failed_seq, why=check.why)
        else:
            body["headHash"] = check.head
        return web.json_response(body)

    async def health(self, request: web.Request) -> web.Response:
        """grpc.health.v1 of the host: 200 while it serves, 503 once it drains."""
        answer = await self.loopback.health.Check(health_pb2.HealthCheckRequest(), timeout=UNARY_TIMEOUT_S)
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)
        return web.json_response({"status": status}, status=200 if status == "SERVING" else 503)


async def _lines(request: web.Request, call: Any, names: protojson.Names) -> web.StreamResponse:
    """A server-streaming call as newline-delimited JSON. An error before the first message is
    the HTTP status; one after it is a last line ``{"error": {...}}`` (the status is sent by then)."""
    try:
        item = await call.read()
    except BaseException:
        call.cancel()
        raise
    response = web.StreamResponse(
        headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"}
    )
    try:
        await response.prepare(request)
        try:
            while item is not aio.EOF:
                await response.write((protojson.dumps(item, names) + "\n").encode())
                item = await call.read()
        except aio.AioRpcError as exc:
            await response.write((json.dumps(error_body(exc.code(), exc.details() or "")) + "\n").encode())
        await response.write_eof()
    finally:
        # A no-op once the stream ended; a client that left cancels the call (and so its turn).
        call.cancel()
    return response


__all__ = ["PREFIX", "Api", "exec_state"]
