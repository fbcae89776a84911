"""A raw Harness server that speaks Connect by script, to test how the host treats bad peers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import grpc
from grpc import aio

from agentsessions.v1 import common_pb2, harness_pb2, harness_pb2_grpc

# Given the Start frame, the events the harness sends (then it returns OK).
Script = Callable[[harness_pb2.ControllerFrame], list[common_pb2.Event]]


class RawHarnessServicer(harness_pb2_grpc.HarnessServicer):
    """A raw harness's Describe: ``harness_id`` at version 1, stateless replay. Subclasses script
    Connect."""

    def __init__(self, harness_id: str = "raw") -> None:
        self.harness_id = harness_id

    async def Describe(
        self, request: harness_pb2.DescribeRequest, context: aio.ServicerContext
    ) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id=self.harness_id,
            version="1",
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )


@contextlib.asynccontextmanager
async def serve_harness(
    servicer: harness_pb2_grpc.HarnessServicer | None = None, handler: grpc.GenericRpcHandler | None = None
) -> AsyncIterator[str]:
    """Serve ``servicer`` (or a generic ``handler``) on a loopback port; yields its address."""
    server = aio.server()
    if servicer is not None:
        harness_pb2_grpc.add_HarnessServicer_to_server(servicer, server)
    if handler is not None:
        server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


class ScriptedHarnessServicer(RawHarnessServicer):
    def __init__(self, script: Script, harness_id: str = "raw") -> None:
        super().__init__(harness_id)
        self.script = script
        self.starts: list[harness_pb2.ControllerFrame] = []

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
    async with serve_harness(servicer) as address:
        yield address, servicer


# -- bytes on the wire -----------------------------------------------------------------------------

# Given the Start frame's bytes, the bytes of each frame the harness sends (then it returns OK).
FrameScript = Callable[[bytes], list[bytes]]

_DESCRIPTOR_OK = harness_pb2.HarnessDescriptor(
    id="wire",
    version="1",
    capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
).SerializeToString()


def _identity(data: bytes) -> bytes:
    return data


class WireHarness:
    """A Harness server that answers Describe and Connect with whatever bytes it is given, so a
    test can send frames no SDK would produce (undecodable, corrupt, fuzzed). ``describe`` and
    ``script`` may be replaced between executions."""

    def __init__(self, script: FrameScript, describe: bytes = _DESCRIPTOR_OK) -> None:
        self.script = script
        self.describe = describe
        self.starts: list[bytes] = []
        # Set each time a Connect stream's handler has returned (its frames all sent).
        self.returned = asyncio.Event()

    async def _describe(self, request: bytes, context: aio.ServicerContext) -> bytes:
        return self.describe

    async def _connect(
        self, requests: AsyncIterator[bytes], context: aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        start = await anext(aiter(requests))
        self.starts.append(start)
        try:
            for frame in self.script(start):
                yield frame
        finally:
            self.returned.set()

    def handler(self) -> grpc.GenericRpcHandler:
        service = harness_pb2.DESCRIPTOR.services_by_name["Harness"].full_name
        codec = {"request_deserializer": _identity, "response_serializer": _identity}
        return grpc.method_handlers_generic_handler(
            service,
            {
                "Describe": grpc.unary_unary_rpc_method_handler(self._describe, **codec),
                "Connect": grpc.stream_stream_rpc_method_handler(self._connect, **codec),
            },
        )


def start_ids(start: bytes) -> tuple[str, str]:
    """(session, execution id) of a Start frame's bytes."""
    frame = harness_pb2.ControllerFrame.FromString(start)
    return frame.session, frame.execution_id


@contextlib.asynccontextmanager
async def wire_harness(harness: WireHarness) -> AsyncIterator[str]:
    """Serve ``harness`` on a loopback port; yields its address."""
    async with serve_harness(handler=harness.handler()) as address:
        yield address
