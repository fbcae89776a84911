"""An Exec running in the background, so a test can act on the session while the turn is live."""

from __future__ import annotations

import asyncio

import grpc

from agentsessions.v1 import common_pb2, session_pb2
from tests.support.host import HostUnderTest

WAIT_S = 30.0


class BackgroundExec:
    """Drains one Exec stream in a task; ``started`` waits for the turn's first OUTPUT record."""

    def __init__(self, host: HostUnderTest, request: session_pb2.ExecRequest) -> None:
        self.updates: list[session_pb2.ExecUpdate] = []
        self._output = asyncio.Event()
        self._host = host
        self._request = request
        self.task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        async for update in self._host.sessions.Exec(self._request):
            self.updates.append(update)
            if (
                update.WhichOneof("update") == "record"
                and update.record.event.kind == common_pb2.EVENT_OUTPUT
            ):
                self._output.set()

    async def started(self) -> str:
        """Wait until the harness emitted its first OUTPUT; returns the execution id."""
        waiter = asyncio.create_task(self._output.wait())
        try:
            done, _ = await asyncio.wait(
                {waiter, self.task}, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
        if not self._output.is_set():
            raise AssertionError(f"the turn never produced output: {self.task if done else 'timed out'}")
        return self.records()[0].event.execution_id

    async def outcome(self) -> tuple[grpc.StatusCode, str]:
        """How the stream ended: (status code, details)."""
        try:
            async with asyncio.timeout(WAIT_S):
                await self.task
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    def records(self) -> list[common_pb2.LogRecord]:
        return [u.record for u in self.updates if u.WhichOneof("update") == "record"]
