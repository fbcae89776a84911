"""Harnesses used by tests, servable in their own process:
``agentsessions-harness serve tests.support.harnesses:ProbeHarness --listen ...``."""

from __future__ import annotations

import asyncio
import json

from agentsessions.sdk import EventSink, Start, text_message
from agentsessions.v1 import common_pb2, harness_pb2


def descriptor(harness_id: str) -> harness_pb2.HarnessDescriptor:
    """A test harness's descriptor: version 1, the echo model, stateless replay."""
    return harness_pb2.HarnessDescriptor(
        id=harness_id,
        version="1",
        models=["echo"],
        capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
    )


class ProbeHarness:
    """Reports the Start it received as one OUTPUT (JSON), then asks the model to echo."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor("probe")

    async def run(self, start: Start, sink: EventSink) -> None:
        seen = {
            "config": start.config.hex(),
            "resume_from_seq": start.resume_from_seq,
            "history": len(start.history),
            "inputs": [p.text.text for m in start.inputs for p in m.parts],
            "session": start.session,
        }
        await sink.output(json.dumps(seen, sort_keys=True))
        await sink.model(
            common_pb2.ModelCall(model="echo", messages=[text_message("user", start.last_input_text())])
        )


class GateHarness:
    """Blocks its turn until the event is set (or 30 s pass), then echoes: for overlap tests."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor("gate")

    async def run(self, start: Start, sink: EventSink) -> None:
        self.entered.set()
        async with asyncio.timeout(30):
            await self.release.wait()
        await sink.output("released")


class SlowEchoHarness:
    """Waits ``{"delay_s": N}`` (from the turn's config; default 0) after the turn's first
    records are durable, then echoes: keeps a turn in flight long enough to race another host."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor("slow-echo")

    async def run(self, start: Start, sink: EventSink) -> None:
        delay = float(json.loads(start.config or b"{}").get("delay_s", 0))
        await asyncio.sleep(min(delay, 30.0))
        await sink.model(
            common_pb2.ModelCall(model="echo", messages=[text_message("user", start.last_input_text())])
        )
