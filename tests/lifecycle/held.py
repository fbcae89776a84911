"""An in-process harness whose Describe a test holds: how a test stands a host inside a turn's
admission (after the session's guard is taken, before anything of the turn is journaled)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agentsessions.sdk import EventSink, Start
from agentsessions.sdk.harness import Harness
from agentsessions.v1 import harness_pb2

HOLD_LIMIT_S = 30.0  # a test that never lets go still ends
POLL_S = 0.01


class HeldDescribe:
    """Wraps a harness; after :meth:`hold`, its next Describe waits (``entered`` set) for
    :meth:`release`. ``runs`` counts the turns it was driven through."""

    def __init__(self, inner: Harness) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self._holding = False
        self._released = asyncio.Event()
        self.runs = 0

    def hold(self) -> None:
        self._holding = True
        self._released.clear()
        self.entered.clear()

    def release(self) -> None:
        self._holding = False
        self._released.set()

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        if self._holding:
            self.entered.set()
            async with asyncio.timeout(HOLD_LIMIT_S):
                await self._released.wait()
        return await self.inner.describe()

    async def run(self, start: Start, sink: EventSink) -> None:
        self.runs += 1
        await self.inner.run(start, sink)


async def wait_for(what: str, event: asyncio.Event) -> None:
    try:
        async with asyncio.timeout(HOLD_LIMIT_S):
            await event.wait()
    except TimeoutError:
        raise AssertionError(f"gave up waiting for {what}") from None


async def until(what: str, ready: Callable[[], bool]) -> None:
    """Poll ``ready()`` (a condition of the host under test, in this process), bounded."""
    try:
        async with asyncio.timeout(HOLD_LIMIT_S):
            while not ready():  # noqa: ASYNC110
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise AssertionError(f"gave up waiting for {what}") from None
