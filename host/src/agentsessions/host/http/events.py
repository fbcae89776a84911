"""``GET /api/v1/sessions/{uid}/events``: a session's journal as Server-Sent Events.

Each durable record is one event whose ``id`` is the record's ``seq``, so a client that reconnects
with ``Last-Event-ID: N`` (a browser's ``EventSource`` does that by itself) gets exactly the
records after ``N``, then the live ones: nothing twice, nothing missed. The stream is
``LiveSessions.Watch`` (proto/agentsessions/ext/v1/live.proto) called on the loopback channel with
the caller's credentials:

    retry: 2000                              reconnect after 2 s if the stream ends

    event: session                           the session first, again when its state changes
    data: {"metadata": {...}, "execState": "EXEC_RUNNING", ...}

    id: 4                                    one per record, in seq order
    event: record
    data: {"seq": "4", "prevHash": "...", "contentHash": "...", "event": {...}}

    event: delta                             live model output of a running turn (?deltas=true)
    data: {"executionId": "...", "chunk": "echo:"}

    : keepalive                              a comment every 15 s while nothing happens

    event: error                             the stream failed after it started
    data: {"error": {"code": "UNAVAILABLE", "message": "..."}}

Errors before the first event (unknown session, wrong token, foreign project) are the ordinary
HTTP status and JSON error body. Draining ends every stream (``event: end``) so clients resume on
another host with their ``Last-Event-ID``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator

from aiohttp import web
from grpc import aio

from agentsessions.ext.v1 import live_pb2
from agentsessions.host.http import protojson
from agentsessions.host.http.loopback import Caller, Loopback
from agentsessions.host.http.status import error_body

# How long a browser waits before it reconnects a stream that ended (the SSE "retry" field).
RECONNECT_MS = 2000
# A comment line this often keeps proxies from closing an idle stream and notices a gone client.
KEEPALIVE_S = 15.0
# A follower being closed has this long to let go of its Watch call.
_RELEASE_S = 5.0


def frame(event: str, data: str, event_id: str | None = None) -> bytes:
    """One SSE event. ``data`` is compact JSON, which never holds a raw newline."""
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {data}\n\n".encode()


def after_seq(request: web.Request) -> int:
    """Where the stream starts: ``Last-Event-ID`` (a reconnect) wins over ``?after_seq``."""
    header = request.headers.get("Last-Event-ID")
    if header is not None:
        return protojson.integer(header.strip(), "Last-Event-ID")
    return protojson.integer(request.query.get("after_seq", "0"), "after_seq")


async def watch(
    loopback: Loopback, request: live_pb2.WatchRequest, caller: Caller
) -> AsyncGenerator[live_pb2.WatchUpdate, None]:
    """``LiveSessions.Watch`` as the proto documents it: the session first, then every record
    with seq > ``after_seq`` in order, then (with ``follow``) new records as they become durable."""
    call = loopback.live.Watch(request, metadata=caller.metadata)
    try:
        update = await call.read()
        while update is not aio.EOF:
            yield update
            update = await call.read()
    finally:
        call.cancel()


def _event_of(update: live_pb2.WatchUpdate, names: protojson.Names) -> bytes:
    kind = update.WhichOneof("update")
    if kind == "record":
        return frame("record", protojson.dumps(update.record, names), str(update.record.seq))
    if kind == "delta":
        return frame("delta", protojson.dumps(update.delta, names))
    return frame("session", protojson.dumps(update.session, names))


class EventStream:
    """The events endpoint over the loopback channel; ``draining`` ends every open stream."""

    def __init__(self, loopback: Loopback, draining: asyncio.Event) -> None:
        self.loopback = loopback
        self.draining = draining

    async def handle(self, request: web.Request) -> web.StreamResponse:
        names = protojson.names_of(request)
        watch_request = live_pb2.WatchRequest(
            session=request.match_info["uid"],
            after_seq=after_seq(request),
            follow=protojson.flag(request, "follow", True),
            include_deltas=protojson.flag(request, "deltas", False),
        )
        caller = Caller.of(request)
        updates = watch(self.loopback, watch_request, caller)
        try:
            # Before the first event the answer can still be an HTTP status (404, 403, 401, ...).
            first = await _next(updates)
        except BaseException:
            await updates.aclose()
            raise
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-store",
                # Proxies that buffer (nginx) would hold events back.
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await response.prepare(request)
            await response.write(f"retry: {RECONNECT_MS}\n\n".encode())
            if first is not None:
                await response.write(_event_of(first, names))
                reason = await self._follow(response, updates, names)
            else:
                reason = "ended"
            await response.write(frame("end", json.dumps({"reason": reason})))
            await response.write_eof()
        finally:
            await updates.aclose()
        return response

    async def _follow(
        self,
        response: web.StreamResponse,
        updates: AsyncIterator[live_pb2.WatchUpdate],
        names: protojson.Names,
    ) -> str:
        """Write updates as they come, a keepalive while none does; returns why the stream ends."""
        draining = asyncio.ensure_future(self.draining.wait())
        following: asyncio.Task[live_pb2.WatchUpdate | None] | None = None
        try:
            while True:
                if following is None:
                    following = asyncio.create_task(_next(updates))
                done, _ = await asyncio.wait(
                    {following, draining}, timeout=KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED
                )
                if draining in done:
                    return "draining"
                if following not in done:
                    await response.write(b": keepalive\n\n")
                    continue
                arrived, following = following, None
                try:
                    update = arrived.result()
                except aio.AioRpcError as exc:
                    failure = error_body(exc.code(), exc.details() or "")
                    await response.write(frame("error", json.dumps(failure)))
                    return "error"
                if update is None:
                    return "ended"
                await response.write(_event_of(update, names))
        finally:
            draining.cancel()
            if following is not None:
                following.cancel()
                # The generator must be idle again before the caller closes it. (asyncio.wait raises
                # nothing of the task's; a cancel of this handler itself goes on up.)
                await asyncio.wait({following}, timeout=_RELEASE_S)
                if following.done() and not following.cancelled():
                    following.exception()  # seen: it ended as the stream did


async def _next(updates: AsyncIterator[live_pb2.WatchUpdate]) -> live_pb2.WatchUpdate | None:
    """The next update, or None at the end (a task may not raise StopAsyncIteration)."""
    try:
        return await anext(updates)
    except StopAsyncIteration:
        return None
