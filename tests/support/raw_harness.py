"""A raw Harness server that speaks Connect by script, to test how the host treats bad peers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from grpc import aio

from agentsessions.v1 import common_pb2, harness_pb2, harness_pb2_grpc

# Given the Start frame, the events the harness sends (then it returns OK).
Script = Callable[[harness_pb2.ControllerFrame], list[common_pb2.Event]]


class ScriptedHarnessServicer(harness_pb2_grpc.HarnessServicer):
    def __init__(self, script: Script, harness_id: str = "raw") -> None:
        self.script = script
        self.harness_id = harness_id
        self.starts: list[harness_pb2.ControllerFrame] = []

    async def Describe(
        self, request: harness_pb2.DescribeRequest, context: aio.ServicerContext
    ) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id=self.harness_id,
            version="1",
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def Connect(
        self, request_iterator: AsyncIterator[harness_pb2.ControllerFrame], context: aio.ServicerContext
    ) -> AsyncIterator[common_pb2.Event]:
        start = await anext(aiter(request_iterator))
        self.starts.append(start)
        for event in self.script(start):
            yield event


@contextlib.asynccontextmanager
async def scripted_harness(script: Script) -> AsyncIterator[tuple[str, ScriptedHarnessServicer]]:
    """Serve a scripted harness on a loopback port; yields (address, servicer)."""
    servicer = ScriptedHarnessServicer(script)
    server = aio.server()
    harness_pb2_grpc.add_HarnessServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        await server.stop(None)
