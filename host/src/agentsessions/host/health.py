"""``grpc.health.v1.Health``: the overall status ("") and one status per served service.

Unlike a plain status table, draining ends every Watch stream right after it has delivered
NOT_SERVING, so open watches tell their clients about the drain and never hold the shutdown up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SERVICE_NAME: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self, services: Iterable[str]) -> None:
        # Nothing is served until the server has started and ``serving()`` is called.
        self._status: dict[str, Any] = {name: NOT_SERVING for name in ("", *services)}
        self._changed = asyncio.Condition()
        self._draining = False

    @property
    def draining(self) -> bool:
        return self._draining

    def status(self, service: str) -> Any:
        return self._status.get(service, SERVICE_UNKNOWN)

    async def serving(self) -> None:
        """Mark every known service SERVING (ignored once draining)."""
        if not self._draining:
            await self._set_all(SERVING)

    async def set_services(self, status: Any, services: Iterable[str]) -> None:
        """Set the status of some known services (the overall "" is left alone; ignored once draining)."""
        async with self._changed:
            if self._draining:
                return
            for name in services:
                if name and name in self._status:
                    self._status[name] = status
            self._changed.notify_all()

    def services(self) -> list[str]:
        """The services this servicer reports on (without the overall "")."""
        return [name for name in self._status if name]

    async def drain(self) -> None:
        """Mark every service NOT_SERVING for good and end open Watch streams."""
        self._draining = True
        await self._set_all(NOT_SERVING)

    async def _set_all(self, status: Any) -> None:
        async with self._changed:
            for name in self._status:
                self._status[name] = status
            self._changed.notify_all()

    async def Check(self, request: Any, context: Any) -> Any:
        if request.service not in self._status:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=self._status[request.service])

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        sent = None
        while True:
            status = self.status(request.service)
            if status != sent:
                yield health_pb2.HealthCheckResponse(status=status)
                sent = status
                # Look again: a drain may have begun while the yield was suspended.
                continue
            if self._draining:
                return
            async with self._changed:
                # Unbounded by design: a watch lasts until a change, the client leaves, or the drain.
                while self.status(request.service) == sent and not self._draining:
                    await self._changed.wait()
