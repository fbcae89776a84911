"""A host for tests: the real controller and servicers on a grpc.aio server on a loopback port."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

from grpc import aio

from agentsessions.harnesses.chat import ChatHarness
from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.controller.controller import Controller
from agentsessions.host.controller.harnesses import HarnessCatalog, StaticHarness
from agentsessions.host.controller.tools import ToolInvoker
from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.echo import EchoModel
from agentsessions.host.models.provider import ModelProvider
from agentsessions.host.service.decoding import DecodingInterceptor
from agentsessions.host.service.registry import HarnessRegistryServicer
from agentsessions.host.service.sessions import SessionsServicer
from agentsessions.host.service.sessions import add_to_server as add_sessions_to_server
from agentsessions.sdk.harness import Harness
from agentsessions.v1 import (
    common_pb2,
    harness_registry_pb2_grpc,
    session_pb2,
    session_pb2_grpc,
)


@dataclass
class HostUnderTest:
    controller: Controller
    store: JournalStore
    address: str
    channel: aio.Channel
    sessions: session_pb2_grpc.SessionsStub
    registry: harness_registry_pb2_grpc.HarnessRegistryStub

    async def exec(self, request: session_pb2.ExecRequest) -> list[session_pb2.ExecUpdate]:
        """Run one Exec to completion and return every frame (raises the call's error)."""
        return [update async for update in self.sessions.Exec(request)]


def counting_ids() -> Callable[[], str]:
    """Reproducible 16-hex ids, so two runs of the same script write identical journals."""
    counter = itertools.count(1)
    return lambda: f"{next(counter):016x}"


def text_input(text: str) -> common_pb2.Message:
    return common_pb2.Message(role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))])


def text_output(text: str) -> common_pb2.Event:
    """An OUTPUT event: the assistant's ``text``."""
    part = common_pb2.Part(text=common_pb2.TextPart(text=text))
    return common_pb2.Event(
        kind=common_pb2.EVENT_OUTPUT, message=common_pb2.Message(role="assistant", parts=[part])
    )


@contextlib.asynccontextmanager
async def running_host(
    store: JournalStore,
    *,
    remote: Mapping[str, str] | None = None,
    local: Mapping[str, Harness] | None = None,
    model: ModelProvider | None = None,
    tools: ToolInvoker | None = None,
    **controller_options: object,
) -> AsyncIterator[HostUnderTest]:
    """Serve Sessions and HarnessRegistry over ``store`` with the built-in echo/chat harnesses
    plus ``local`` in-process harnesses and ``remote`` name->address harnesses dialled over
    Harness.Connect."""
    dialled: list[RemoteHarness] = []

    def dial(address: str) -> RemoteHarness:
        harness = RemoteHarness(address)
        dialled.append(harness)
        return harness

    static = {"echo": StaticHarness(EchoHarness()), "chat": StaticHarness(ChatHarness())}
    for name, harness in (local or {}).items():
        static[name] = StaticHarness(harness)
    for name, address in (remote or {}).items():
        static[name] = StaticHarness(dial(address), address)
    catalog = HarnessCatalog(static, store, dial)
    controller = Controller(store, catalog, model or EchoModel(), tools, **controller_options)  # type: ignore[arg-type]
    server = aio.server(interceptors=[DecodingInterceptor()])
    add_sessions_to_server(SessionsServicer(controller), server)
    harness_registry_pb2_grpc.add_HarnessRegistryServicer_to_server(HarnessRegistryServicer(catalog), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    channel = aio.insecure_channel(address)
    try:
        yield HostUnderTest(
            controller,
            store,
            address,
            channel,
            session_pb2_grpc.SessionsStub(channel),
            harness_registry_pb2_grpc.HarnessRegistryStub(channel),
        )
    finally:
        await channel.close()
        await server.stop(None)
        for harness in dialled:
            await harness.close()
