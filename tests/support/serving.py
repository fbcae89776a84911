"""``agentsessions serve`` run in the test's own event loop (``server.serve``), for tests that
need the whole host (listeners, interceptors, HTTP) without a process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agentsessions.host import server
from agentsessions.host.config import HostConfig

START_LIMIT_S = 60.0


@contextlib.asynccontextmanager
async def serving(config: HostConfig) -> AsyncIterator[Sequence[str]]:
    """Run ``server.serve(config)`` until the block ends; yields the bound addresses (Sessions
    first, HTTP last)."""
    stop = asyncio.Event()
    ready: asyncio.Future[Sequence[str]] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(server.serve(config, stop=stop, on_serving=ready.set_result))
    racing: set[asyncio.Future[Any]] = {ready, task}
    await asyncio.wait(racing, timeout=START_LIMIT_S, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        if task.done():
            task.result()  # raise why serving ended
        task.cancel()
        raise AssertionError(f"the host did not start serving within {START_LIMIT_S:g} s")
    try:
        yield ready.result()
    finally:
        stop.set()
        assert await asyncio.wait_for(task, timeout=START_LIMIT_S) == 0
