"""``--http-listen``: the HTTP API and the web console, served by aiohttp in the host's own loop.

``HttpListener`` is started and drained by ``server.serve`` beside the gRPC listeners. Starting
it starts the private gRPC server the handlers call (``loopback``), then the aiohttp site. On
SIGTERM its health turns NOT_SERVING with the others; stopping it stops accepting connections,
ends every event stream (clients resume elsewhere with Last-Event-ID), gives the requests in
flight (an Exec turn) the drain grace, cancels what is left, then stops the private server.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import grpc
from aiohttp import web
from grpc import aio

from agentsessions.host import logs, requestid
from agentsessions.host.addresses import is_loopback, split_host_port
from agentsessions.host.app import StartupError
from agentsessions.host.config import HostConfig
from agentsessions.host.health import HealthServicer
from agentsessions.host.http import browser
from agentsessions.host.http.api import PREFIX, Api
from agentsessions.host.http.console import Console, load_assets
from agentsessions.host.http.events import EventStream
from agentsessions.host.http.loopback import REQUEST_ID_KEY, Loopback
from agentsessions.host.http.status import HttpError, error_response, of_http_exception
from agentsessions.sdk.tls import ServerTLS

log = logging.getLogger("agentsessions.host.http")

# Request bodies are request messages; gRPC's own default receive limit bounds them too.
MAX_BODY_BYTES = 4 * 1024 * 1024
# Requests cancelled at the end of the drain have this long to unwind.
_CANCEL_LIMIT_S = 5.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class GrpcListener(Protocol):
    """What the listener needs of the private gRPC server (``server._Listener`` is one)."""

    bound: str
    health: HealthServicer

    async def start(self) -> None: ...

    async def stop(self, grace: float | None) -> None: ...


class HttpListener:
    """The HTTP listener at ``config.http_listen``; ``grpc_listener(address)`` builds the private
    gRPC server carrying the host's services and interceptors at ``address``."""

    def __init__(self, config: HostConfig, grpc_listener: Callable[[str], GrpcListener]) -> None:
        assert config.http_listen is not None
        self.address = config.http_listen
        self.bound = self.address
        self._tls = config.server_tls
        self._loopback_only = is_loopback(self.address)
        self._loopback = Loopback()
        self._private = grpc_listener(self._loopback.make_directory())
        self._runner: web.AppRunner | None = None
        self._requests: set[asyncio.Task[object]] = set()
        self._draining = asyncio.Event()
        self._stopped: asyncio.Task[None] | None = None

    @property
    def health(self) -> HealthServicer:
        """The private server's health: what /healthz reports, drained with the other listeners."""
        return self._private.health

    async def start(self) -> None:
        await self._private.start()
        self._loopback.dial(self._private.bound)
        app = web.Application(middlewares=[self._outermost, self._guarded], client_max_size=MAX_BODY_BYTES)
        app.on_response_prepare.append(_headers)
        app.add_routes(Api(self._loopback).routes())
        app.add_routes(
            [web.get(PREFIX + "/sessions/{uid}/events", EventStream(self._loopback, self._draining).handle)]
        )
        app.add_routes(Console(await asyncio.to_thread(load_assets)).routes())
        # No signal handling of its own (serve owns SIGTERM) and no access log (ours is below); a
        # client that goes away cancels its handler, as a gRPC client cancels its call.
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        host, port = split_host_port(self.address)
        context = None if self._tls is None else await asyncio.to_thread(_ssl_context, self._tls)
        site = web.TCPSite(self._runner, host, int(port), ssl_context=context, reuse_port=False)
        try:
            await site.start()
        except OSError as exc:
            raise StartupError(f"cannot listen on {self.address} (--http-listen): {exc}") from None
        self.bound = f"[{host}]:{site.port}" if ":" in host else f"{host}:{site.port}"

    async def stop(self, grace: float | None) -> None:
        """Drain within ``grace`` seconds (None: cancel every request now). Called again while a
        drain runs (a second signal), it cuts that drain short."""
        if grace is None:
            self._cancel_requests()
        if self._stopped is None:
            self._stopped = asyncio.create_task(self._shutdown(grace or 0.0))
        await asyncio.shield(self._stopped)

    async def _shutdown(self, grace: float) -> None:
        self._draining.set()
        try:
            if self._runner is not None:
                for site in list(self._runner.sites):
                    await site.stop()
                if self._requests:
                    await asyncio.wait(set(self._requests), timeout=grace)
                self._cancel_requests()
                if self._requests:
                    await asyncio.wait(set(self._requests), timeout=_CANCEL_LIMIT_S)
                await self._runner.cleanup()
        finally:
            await self._loopback.close()
            await self._private.stop(None)
            self._loopback.remove_directory()

    def _cancel_requests(self) -> None:
        for task in self._requests:
            task.cancel()

    @web.middleware
    async def _outermost(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The request id, one log line per request, the security headers; tracked for the drain."""
        rid = requestid.from_metadata([(requestid.HEADER, request.headers.get("X-Request-Id", ""))])
        request[REQUEST_ID_KEY] = rid
        task = asyncio.current_task()
        if task is not None:
            self._requests.add(task)
        started = time.perf_counter()
        status = 0
        try:
            response = await handler(request)
            status = response.status
            return response
        except asyncio.CancelledError:
            status = 499
            raise
        finally:
            if task is not None:
                self._requests.discard(task)
            log.info(
                "http",
                extra=logs.fields(
                    method=request.method,
                    path=request.path,
                    status=status,
                    duration_ms=round((time.perf_counter() - started) * 1000, 3),
                    request_id=rid,
                ),
            )

    @web.middleware
    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """The browser rules, the drain, and every refusal as the JSON error body."""
        try:
            if self._draining.is_set():
                raise HttpError(grpc.StatusCode.UNAVAILABLE, "the host is draining; retry on another host")
            if self._loopback_only:
                browser.check_host(request)
            if request.path.startswith(PREFIX + "/") or request.path == PREFIX:
                browser.check_same_origin(request)
            return await handler(request)
        except Exception as exc:
            if request.get(_PREPARED_KEY) or isinstance(exc, ConnectionError):
                raise  # a stream under way, or a client gone: aiohttp closes the connection
            return _refusal(exc)


def _refusal(exc: Exception) -> web.StreamResponse:
    if isinstance(exc, HttpError):
        return error_response(exc.code, exc.message, status=exc.status)
    if isinstance(exc, aio.AioRpcError):
        return error_response(exc.code(), exc.details() or "")
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return of_http_exception(exc)
    log.error("http handler failed: %s", type(exc).__name__, exc_info=exc)
    return error_response(grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}")


_PREPARED_KEY = web.RequestKey("agentsessions.prepared", bool)


async def _headers(request: web.Request, response: web.StreamResponse) -> None:
    """On every answer, streams included, right before its headers go out."""
    request[_PREPARED_KEY] = True
    response.headers[requestid.HEADER] = request.get(REQUEST_ID_KEY, "")
    response.headers.update(browser.SECURITY_HEADERS)
    response.headers["Server"] = "agentsessions"
    if request.path.startswith(PREFIX) and "Cache-Control" not in response.headers:
        response.headers["Cache-Control"] = "no-store"


def _ssl_context(tls: ServerTLS) -> ssl.SSLContext:
    """The listener's TLS, from the files of ``--tls-cert``/``--tls-key`` (and ``--tls-client-ca``:
    the handshake then refuses clients without a certificate from that CA, as on gRPC)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file is not None:
            context.load_verify_locations(tls.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(f"cannot serve TLS on --http-listen: {exc}") from None
    return context
