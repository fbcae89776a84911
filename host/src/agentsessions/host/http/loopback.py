"""The HTTP API's way into the host: its own gRPC services, over a private unix socket.

The HTTP listener starts a second gRPC server carrying exactly the services and interceptors of
the Sessions listener (access log, telemetry, authentication), bound to a socket in a directory
only this process's user can enter, and dials it. Every HTTP request becomes one or more calls on
that channel, with the request's ``Authorization`` headers forwarded as ``authorization``
metadata, so authentication, roles, project checks, validation and status codes are the gRPC
ones by construction: there is no second implementation of any of them to keep in step.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import grpc
from aiohttp import web
from grpc import aio
from grpc_health.v1 import health_pb2_grpc

from agentsessions.ext.v1 import live_pb2_grpc
from agentsessions.host import requestid
from agentsessions.host.http.status import HttpError
from agentsessions.sdk.limits import MESSAGE_SIZE_OPTIONS
from agentsessions.sdk.structs import struct
from agentsessions.v1 import session_pb2_grpc

SOCKET_NAME = "grpc.sock"
# Where the request-id middleware leaves the id it chose for a request.
REQUEST_ID_KEY = web.RequestKey("agentsessions.request_id", str)


@struct(frozen=True)
class Caller:
    """What an HTTP request carries into each gRPC call: its credentials and its request id."""

    metadata: tuple[tuple[str, str], ...]
    request_id: str

    @classmethod
    def of(cls, request: web.Request) -> Caller:
        """Every ``Authorization`` header, verbatim and in order (the auth interceptor decides what
        a missing, repeated or malformed one means), and the request id the middleware chose."""
        pairs: list[tuple[str, str]] = []
        for value in request.headers.getall("Authorization", ()):
            # gRPC metadata is printable ASCII: anything else cannot be a Bearer token either.
            if not (value.isascii() and value.isprintable()):
                raise HttpError(
                    grpc.StatusCode.UNAUTHENTICATED, "the Authorization header must be 'Bearer <token>'"
                )
            pairs.append(("authorization", value))
        rid: str = request.get(REQUEST_ID_KEY, "") or requestid.mint()
        pairs.append((requestid.HEADER, rid))
        return cls(tuple(pairs), rid)


class Loopback:
    """A private unix socket for the host's gRPC services and the channel the handlers call on."""

    def __init__(self) -> None:
        self._directory = ""
        self._channel: aio.Channel | None = None
        self.sessions: session_pb2_grpc.SessionsStub
        self.live: live_pb2_grpc.LiveSessionsStub
        self.health: health_pb2_grpc.HealthStub

    def make_directory(self) -> str:
        """Create the socket's directory (mode 0700) and return the gRPC listen address in it."""
        self._directory = tempfile.mkdtemp(prefix="agentsessions-http-")
        os.chmod(self._directory, 0o700)
        return f"unix:{os.path.join(self._directory, SOCKET_NAME)}"

    def dial(self, address: str) -> None:
        self._channel = aio.insecure_channel(address, options=MESSAGE_SIZE_OPTIONS)
        self.sessions = session_pb2_grpc.SessionsStub(self._channel)
        self.live = live_pb2_grpc.LiveSessionsStub(self._channel)
        self.health = health_pb2_grpc.HealthStub(self._channel)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def remove_directory(self) -> None:
        if self._directory:
            shutil.rmtree(self._directory, ignore_errors=True)
            self._directory = ""
