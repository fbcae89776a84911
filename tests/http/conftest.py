"""Fixtures of the HTTP API tests: ``agentsessions serve`` in process with ``--http-listen`` on
a free loopback port, an httpx client for it, and a gRPC stub on the same host's Sessions port."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from grpc import aio

from agentsessions.host.config import HostConfig
from agentsessions.host.tools.executor import ToolContext
from agentsessions.sdk.server import HarnessServer, start_server
from agentsessions.v1 import session_pb2_grpc
from tests.approvals.harnesses import BlockingHarness, ToolHarness
from tests.support.serving import serving

CALL_LIMIT_S = 30.0

ALICE = "alice-token-0123456789"  # writer, reader and approver in default
BOB = "bob-token-0123456789ab"  # reader in default
CAROL = "carol-token-0123456789"  # writer in payments
PRINCIPALS: dict[str, Any] = {
    "tokens": {
        ALICE: {
            "principal": "user:alice",
            "issuer": "example-idp",
            "projects": ["default"],
            "roles": ["writer", "approver"],
        },
        BOB: {"principal": "user:bob", "projects": ["default"], "roles": ["reader"]},
        CAROL: {"principal": "user:carol", "projects": ["payments"], "roles": ["writer"]},
    }
}


# The host-run tool the tooler harness asks for (REQUIRES_APPROVAL: run once a person approves).
STAMP = f"python:{__name__}:stamp"


def stamp(args: dict[str, Any], context: ToolContext) -> dict[str, Any]:
    return {"stamped": args.get("text", "")}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Served:
    """A running host: its gRPC address and stub, and its HTTP base URL and client."""

    grpc_address: str
    base_url: str
    channel: aio.Channel
    sessions: session_pb2_grpc.SessionsStub
    http: httpx.AsyncClient
    harnesses: dict[str, Any] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def http_host(**options: Any) -> AsyncIterator[Served]:
    config = HostConfig(listen="127.0.0.1:0", journal="memory:", http_listen="127.0.0.1:0", **options)
    async with serving(config) as addresses:
        base = f"http://{addresses[-1]}"
        async with (
            aio.insecure_channel(addresses[0]) as channel,
            httpx.AsyncClient(base_url=base, timeout=CALL_LIMIT_S) as client,
        ):
            yield Served(addresses[0], base, channel, session_pb2_grpc.SessionsStub(channel), client)


@pytest.fixture
async def tooler() -> AsyncIterator[HarnessServer]:
    """A harness whose turn parks on a REQUIRES_APPROVAL tool call (tests/approvals)."""
    running = await start_server(ToolHarness(), "127.0.0.1:0")
    yield running
    await running.stop(None)


@pytest.fixture
async def blocker() -> AsyncIterator[tuple[BlockingHarness, HarnessServer]]:
    """A harness that says "working" and then waits until its turn is cancelled."""
    harness = BlockingHarness()
    running = await start_server(harness, "127.0.0.1:0")
    yield harness, running
    await running.stop(None)


@pytest.fixture
def tokens_file(tmp_path: Path) -> str:
    path = tmp_path / "principals.json"
    path.write_text(json.dumps(PRINCIPALS))
    return str(path)


def refusal(answer: httpx.Response) -> tuple[int, str, str]:
    """An HTTP API error answer: (HTTP status, gRPC code name, message)."""
    body = answer.json()["error"]
    return answer.status_code, body["code"], body["message"]


def user_input(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": {"text": text}}]}


async def exec_lines(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """POST an Exec and read its newline-delimited JSON to the end: the status and the lines."""
    async with client.stream("POST", path, json=body, headers=headers or {}) as response:
        lines = [json.loads(line) async for line in response.aiter_lines() if line.strip()]
        return response.status_code, lines


async def turn(client: httpx.AsyncClient, uid: str, text: str, headers: dict[str, str] | None = None) -> None:
    status, lines = await exec_lines(
        client, f"/api/v1/sessions/{uid}/exec", {"inputs": [user_input(text)]}, headers
    )
    assert status == 200 and "error" not in lines[-1], lines


async def create(client: httpx.AsyncClient, headers: dict[str, str] | None = None, **session: Any) -> str:
    answer = await client.post("/api/v1/sessions", json={"session": session}, headers=headers or {})
    assert answer.status_code == 200, answer.text
    uid: str = answer.json()["metadata"]["uid"]
    return uid
