"""Fixtures of the security tests: a throwaway PKI, and ``agentsessions serve`` run in process."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentsessions.host import server
from agentsessions.host.config import HostConfig
from tests.support.certs import Authority, Issued


@dataclass(frozen=True)
class PKI:
    ca: Authority
    rogue: Authority  # a second CA nobody here trusts
    server: Issued
    harness: Issued

    def client(self, common_name: str, *, uri: str | None = None) -> Issued:
        return self.ca.client(common_name, uri=uri)


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    ca = Authority(tmp_path, "ca")
    return PKI(ca, Authority(tmp_path, "rogue"), ca.server("host"), ca.server("harness"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@contextlib.asynccontextmanager
async def serving(config: HostConfig) -> AsyncIterator[Sequence[str]]:
    """Run ``server.serve(config)`` until the block ends; yields the bound addresses (Sessions first)."""
    stop = asyncio.Event()
    ready: asyncio.Future[Sequence[str]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(server.serve(config, stop=stop, on_serving=ready.set_result))
    racing: set[asyncio.Future[Any]] = {ready, task}
    await asyncio.wait(racing, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        if task.done():
            task.result()  # raise why serving ended
        task.cancel()
        raise AssertionError("the host did not start serving within 60 s")
    try:
        yield ready.result()
    finally:
        stop.set()
        assert await asyncio.wait_for(task, timeout=60) == 0
