"""The HTTP listener drains with the gRPC listeners: once the host stops, it stops answering new
requests, gives a turn streaming over HTTP the drain grace, then cancels it, and the host exits 0."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from agentsessions.host import server
from agentsessions.host.config import HostConfig
from agentsessions.sdk.server import HarnessServer
from tests.approvals.harnesses import BlockingHarness
from tests.http.conftest import user_input

LIMIT_S = 30.0
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_stopping_drains_http_with_the_rest(blocker: tuple[BlockingHarness, HarnessServer]) -> None:
    harness, served = blocker
    config = HostConfig(
        listen="127.0.0.1:0",
        journal="memory:",
        http_listen="127.0.0.1:0",
        harnesses=[("blocker", served.address)],
        drain_grace_seconds=0.5,
    )
    stop = asyncio.Event()
    ready: asyncio.Future[Sequence[str]] = asyncio.get_running_loop().create_future()
    host = asyncio.create_task(server.serve(config, stop=stop, on_serving=ready.set_result))
    async with asyncio.timeout(LIMIT_S):
        addresses = await ready
    lines: list[dict[str, Any]] = []
    ended = ""
    async with (
        httpx.AsyncClient(base_url=f"http://{addresses[-1]}", timeout=LIMIT_S) as client,
        aio.insecure_channel(addresses[0]) as channel,
    ):
        created = await client.post("/api/v1/sessions", json={"session": {"harness": "blocker"}})
        uid = created.json()["metadata"]["uid"]

        async def stream_turn() -> str:
            path = f"/api/v1/sessions/{uid}/exec"
            try:
                async with client.stream("POST", path, json={"inputs": [user_input("go")]}) as response:
                    async for line in response.aiter_lines():
                        if line:
                            lines.append(json.loads(line))
            except httpx.RemoteProtocolError:
                return "cut"  # the host closed the connection when the grace ran out
            return "ended"

        turn = asyncio.create_task(stream_turn())
        async with asyncio.timeout(LIMIT_S):
            await harness.entered.wait()
        health = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        await health.read()

        stop.set()
        async with asyncio.timeout(LIMIT_S):
            while (await health.read()).status != NOT_SERVING:
                pass
        # The drain has begun: a new request is not served (refused, or 503 while it stops accepting).
        async with httpx.AsyncClient(base_url=f"http://{addresses[-1]}", timeout=LIMIT_S) as fresh:
            try:
                answer = await fresh.get("/healthz")
            except httpx.ConnectError:
                pass
            else:
                assert answer.status_code == 503, answer.text

        async with asyncio.timeout(LIMIT_S):
            assert await host == 0
            ended = await turn
    # The turn streamed until the host gave up on it at the end of the grace.
    assert ended in ("cut", "ended")
    assert any(line.get("record", {}).get("event", {}).get("kind") == "EVENT_OUTPUT" for line in lines), lines
