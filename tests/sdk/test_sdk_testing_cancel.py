"""``agentsessions.sdk.testing.HarnessEnvironment`` under a cancel: the test's own timeout is the
test's (it was turned into ReplayDiverged), and a harness's run does not outlive a caller that left."""

from __future__ import annotations

import asyncio

import pytest

from agentsessions.sdk import EventSink, Start
from agentsessions.sdk.testing import HarnessEnvironment
from agentsessions.v1 import harness_pb2


class HangsOnReplay:
    """Answers its first turn; when that turn is replayed, waits for ever (a bug under test)."""

    def __init__(self) -> None:
        self.replaying = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.turns = 0

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(id="hangs", version="1")

    async def run(self, start: Start, sink: EventSink) -> None:
        self.turns += 1
        if self.turns > 1:
            self.replaying.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        await sink.output("done")


async def test_a_timeout_of_the_test_during_replay_stays_the_tests() -> None:
    harness = HangsOnReplay()
    env = HarnessEnvironment(harness)
    await env.run("hi")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.2):
            await env.replay()
    assert harness.cancelled.is_set()


async def test_a_run_does_not_outlive_the_caller_that_left() -> None:
    harness = HangsOnReplay()
    harness.turns = 1  # every run now hangs
    env = HarnessEnvironment(harness)
    running = asyncio.create_task(env.run("hi"))
    async with asyncio.timeout(10):
        await harness.replaying.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    async with asyncio.timeout(10):
        await harness.cancelled.wait()
