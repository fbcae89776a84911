"""``server.serve`` in process: listeners, the admin listener, port 0, and failed starts."""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agentsessions.host import server
from agentsessions.host.app import App, Service, StartupError
from agentsessions.host.config import HostConfig
from agentsessions.v1 import harness_registry_pb2, harness_registry_pb2_grpc
from tests.support.processes import free_port

SESSIONS = "agentsessions.v1.Sessions"
REGISTRY = harness_registry_pb2.DESCRIPTOR.services_by_name["HarnessRegistry"].full_name


class RegistryServicer(harness_registry_pb2_grpc.HarnessRegistryServicer):
    async def ListHarnesses(self, request: Any, context: aio.ServicerContext) -> Any:
        return harness_registry_pb2.ListHarnessesResponse()

    async def RegisterHarness(self, request: Any, context: aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "test registry")

    async def GetHarness(self, request: Any, context: aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "test registry")

    async def RetireHarness(self, request: Any, context: aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "test registry")


def add_sessions_placeholder(server: aio.Server) -> None:
    """Sessions by name only: these tests look at listeners, reflection and health, not at RPCs."""
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SESSIONS, {}),))


class Recorded:
    def __init__(self) -> None:
        self.closed = False

    def app(self) -> App:
        app = App(
            services=[Service(SESSIONS, add_sessions_placeholder)],
            admin_services=[
                Service(
                    REGISTRY,
                    functools.partial(
                        harness_registry_pb2_grpc.add_HarnessRegistryServicer_to_server, RegistryServicer()
                    ),
                )
            ],
        )

        async def close() -> None:
            self.closed = True

        app.on_close(close)
        return app


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    """``build_app`` replaced by one serving Sessions, plus a HarnessRegistry as an admin service."""
    recorder = Recorded()

    async def build_app(config: HostConfig) -> App:
        return recorder.app()

    monkeypatch.setattr(server, "build_app", build_app)
    return recorder


class Running:
    def __init__(self, config: HostConfig) -> None:
        self.stop = asyncio.Event()
        self.addresses: asyncio.Future[Sequence[str]] = asyncio.get_running_loop().create_future()
        self.task = asyncio.create_task(
            server.serve(config, stop=self.stop, on_serving=self.addresses.set_result)
        )

    async def bound(self) -> Sequence[str]:
        racing: set[asyncio.Future[Any]] = {self.addresses, self.task}
        done, _ = await asyncio.wait(racing, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        assert self.addresses in done, f"serve ended before serving: {self.task}"
        return self.addresses.result()

    async def finish(self) -> int:
        self.stop.set()
        return await asyncio.wait_for(self.task, timeout=60)


@pytest.fixture
async def running(recorded: Recorded) -> AsyncIterator[Any]:
    started: list[Running] = []

    def start(config: HostConfig) -> Running:
        started.append(Running(config))
        return started[-1]

    yield start
    for host in started:
        if not host.task.done():
            host.task.cancel()
            await asyncio.gather(host.task, return_exceptions=True)


async def listed_services(address: str) -> set[str]:
    async with aio.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=30
        )
        names: set[str] = set()
        async for reply in call:
            names |= {service.name for service in reply.list_services_response.service}
        return names


async def health(address: str, service: str) -> Any:
    async with aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=30
        )
        return reply.status


async def test_admin_services_get_their_own_listener(running: Any, recorded: Recorded) -> None:
    registry = f"127.0.0.1:{free_port()}"
    host = running(HostConfig(listen="127.0.0.1:0", journal="memory:", registry_addr=registry))
    sessions_address, registry_address = await host.bound()
    assert registry_address == registry
    assert not sessions_address.endswith(":0")

    assert await listed_services(sessions_address) == {
        "agentsessions.v1.Sessions",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    assert await listed_services(registry_address) == {
        REGISTRY,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }
    assert await health(registry_address, REGISTRY) == health_pb2.HealthCheckResponse.SERVING
    async with aio.insecure_channel(sessions_address) as channel:
        with pytest.raises(aio.AioRpcError) as raised:
            await harness_registry_pb2_grpc.HarnessRegistryStub(channel).ListHarnesses(
                harness_registry_pb2.ListHarnessesRequest(), timeout=30
            )
        assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED

    assert await host.finish() == 0
    assert recorded.closed


async def test_admin_services_are_not_served_without_a_registry_address(running: Any) -> None:
    host = running(HostConfig(listen="127.0.0.1:0", journal="memory:"))
    addresses = await host.bound()
    assert len(addresses) == 1
    assert REGISTRY not in await listed_services(addresses[0])
    assert await host.finish() == 0


async def test_a_failed_start_releases_the_listener_that_started_and_closes_the_app(
    recorded: Recorded,
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = f"127.0.0.1:{squatter.getsockname()[1]}"
        with pytest.raises(StartupError, match=f"cannot listen on {taken}"):
            await asyncio.wait_for(
                server.serve(HostConfig(listen=listen, journal="memory:", registry_addr=taken)), 60
            )
    assert recorded.closed
    # The Sessions listener that did start was stopped: its port can be bound again.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as again:
        again.bind(("127.0.0.1", int(listen.rsplit(":", 1)[1])))
