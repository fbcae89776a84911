"""grpc.health.v1 as the host serves it, over a real aio server (pytest-grpc fixtures, aio overrides)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsessions.host.health import HealthServicer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SESSIONS = "agentsessions.v1.Sessions"


@pytest.fixture
def grpc_add_to_server() -> Any:
    return health_pb2_grpc.add_HealthServicer_to_server


@pytest.fixture
def grpc_servicer() -> HealthServicer:
    return HealthServicer([SESSIONS])


@pytest.fixture
def grpc_stub_cls() -> Any:
    return health_pb2_grpc.HealthStub


async def check(stub: Any, service: str = "") -> Any:
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=30)
    return reply.status


async def test_nothing_serves_before_the_server_says_so(
    grpc_stub: Any, grpc_servicer: HealthServicer
) -> None:
    assert await check(grpc_stub) == NOT_SERVING
    await grpc_servicer.serving()
    assert await check(grpc_stub) == SERVING
    assert await check(grpc_stub, SESSIONS) == SERVING


async def test_an_unknown_service_is_not_found(grpc_stub: Any) -> None:
    with pytest.raises(aio.AioRpcError) as raised:
        await check(grpc_stub, "no.such.Service")
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_drain_turns_everything_not_serving_for_good(
    grpc_stub: Any, grpc_servicer: HealthServicer
) -> None:
    await grpc_servicer.serving()
    await grpc_servicer.drain()
    await grpc_servicer.serving()
    assert await check(grpc_stub) == NOT_SERVING
    assert await check(grpc_stub, SESSIONS) == NOT_SERVING


async def test_watch_reports_changes_and_ends_with_the_drain(
    grpc_stub: Any, grpc_servicer: HealthServicer
) -> None:
    watch = grpc_stub.Watch(health_pb2.HealthCheckRequest(service=SESSIONS), timeout=30)
    first = await asyncio.wait_for(watch.read(), timeout=30)
    assert first.status == NOT_SERVING
    await grpc_servicer.serving()
    assert (await asyncio.wait_for(watch.read(), timeout=30)).status == SERVING
    await grpc_servicer.drain()
    assert (await asyncio.wait_for(watch.read(), timeout=30)).status == NOT_SERVING
    assert await asyncio.wait_for(watch.read(), timeout=30) is aio.EOF
    assert await watch.code() == grpc.StatusCode.OK


async def test_watch_of_an_unknown_service_says_service_unknown(grpc_stub: Any) -> None:
    watch = grpc_stub.Watch(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=30)
    first = await asyncio.wait_for(watch.read(), timeout=30)
    assert first.status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
    watch.cancel()


async def test_a_drain_during_a_watch_write_is_still_reported() -> None:
    # Driven directly so the drain lands exactly while the stream is suspended after a write.
    servicer = HealthServicer([SESSIONS])
    await servicer.serving()
    watch = servicer.Watch(health_pb2.HealthCheckRequest(service=SESSIONS), context=None)
    assert (await anext(watch)).status == SERVING
    await servicer.drain()
    assert (await anext(watch)).status == NOT_SERVING
    with pytest.raises(StopAsyncIteration):
        await anext(watch)
