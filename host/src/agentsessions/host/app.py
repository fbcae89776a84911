"""What the host serves: the servicers built from a ``HostConfig``, and how to release them.

``server.serve`` asks ``build_app`` for an ``App`` and registers, reflects and health-reports
``App.services`` on the Sessions listener and ``App.admin_services`` on the ``--registry-addr``
listener (not served when that flag is unset). ``App.close`` runs once the server has drained.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from grpc import aio

from agentsessions.host.config import HostConfig
from agentsessions.host.service import sessions
from agentsessions.v1 import session_pb2_grpc


@dataclass(frozen=True)
class Service:
    """One gRPC service: its full name (for reflection and health) and how to add it to a server."""

    name: str
    add_to_server: Callable[[aio.Server], None]


@dataclass
class App:
    services: list[Service]
    admin_services: list[Service] = field(default_factory=list)
    # Run inside the access log, in order (authentication goes here).
    interceptors: list[aio.ServerInterceptor] = field(default_factory=list)
    _closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Register a release step; ``close`` runs them last-registered first."""
        self._closers.append(closer)

    async def close(self) -> None:
        """Run every release step even when one fails; then raise what failed."""
        errors: list[Exception] = []
        while self._closers:
            try:
                await self._closers.pop()()
            except Exception as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise ExceptionGroup("closing the app", errors)


async def build_app(config: HostConfig) -> App:
    servicer = sessions.SessionsServicer()
    return App(
        services=[
            Service(
                sessions.SERVICE_NAME,
                functools.partial(session_pb2_grpc.add_SessionsServicer_to_server, servicer),
            )
        ]
    )
