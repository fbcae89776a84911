"""Shared fixtures.

pytest-grpc's ``grpc_server``/``grpc_channel``/``grpc_stub`` are synchronous; the overrides below keep
its convention (a test module provides ``grpc_add_to_server``, ``grpc_servicer`` and ``grpc_stub_cls``,
and may override ``grpc_interceptors``) but serve the servicer on a real ``grpc.aio`` server on a
loopback port and hand out an aio channel and stub.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from grpc import aio
from hypothesis import HealthCheck, settings

from agentsessions.host.journal import open_store
from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.host.journal.store import JournalStore
from tests.support.processes import HarnessProcess, harness_process, serve_argv
from tests.support.scripted_endpoint import ScriptedEndpoint, scripted_endpoint

ROOT = Path(__file__).resolve().parents[1]

# Property tests assert behaviour, never speed: no per-example deadline and no "too slow" health
# check (both trip on a loaded machine), and no example database, so a run depends on nothing a
# previous run left behind.
settings.register_profile(
    "agentsessions", deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
settings.load_profile("agentsessions")


@pytest.fixture
def grpc_addr() -> str:
    """A free loopback port: bind port 0, note the port, release it for the server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"127.0.0.1:{port}"


@pytest.fixture
async def grpc_server(
    grpc_addr: str,
    grpc_add_to_server: Callable[[Any, aio.Server], None],
    grpc_servicer: Any,
    grpc_interceptors: list[aio.ServerInterceptor] | None,
) -> AsyncIterator[aio.Server]:
    server = aio.server(interceptors=grpc_interceptors, options=(("grpc.so_reuseport", 0),))
    grpc_add_to_server(grpc_servicer, server)
    server.add_insecure_port(grpc_addr)
    await server.start()
    yield server
    await server.stop(None)


@pytest.fixture
async def grpc_channel(grpc_addr: str, grpc_server: aio.Server) -> AsyncIterator[aio.Channel]:
    async with aio.insecure_channel(grpc_addr) as channel:
        yield channel


@pytest.fixture
def grpc_stub(grpc_stub_cls: Callable[[aio.Channel], Any], grpc_channel: aio.Channel) -> Any:
    return grpc_stub_cls(grpc_channel)


@pytest.fixture
def journal_path(tmp_path: Path) -> str:
    """A SQLite journal file in the test's temporary directory (not yet created)."""
    return str(tmp_path / "journal.db")


@pytest.fixture
async def store(journal_path: str) -> AsyncIterator[JournalStore]:
    """A SQLite journal store, closed after the test (tests/journal overrides it per backend)."""
    s = await open_store(journal_path)
    yield s
    await s.close()


@pytest.fixture
async def sqlite_store(journal_path: str) -> AsyncIterator[SqliteStore]:
    """The same, typed as the SQLite store it is (tests of SQLite's own behaviour)."""
    s = await SqliteStore.open(journal_path)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    """A scripted chat-completions endpoint on loopback, its script empty (``endpoint.script``)."""
    with scripted_endpoint() as served:
        yield served


@pytest.fixture
async def tooler_process(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[HarnessProcess]:
    """ToolHarness (tests.approvals.harnesses) in its own process, the repo root on its PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    async with harness_process(serve_argv("tests.approvals.harnesses:ToolHarness")) as proc:
        yield proc
