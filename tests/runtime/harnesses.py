"""Harnesses for the runtime tests, loaded by ``agentsessions-harness serve tests.runtime.harnesses:...``
in harness processes the host starts (the tests run them with the repository root as cwd)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from agentsessions.sdk import EventSink, Start
from agentsessions.v1 import harness_pb2

# A harness process refuses to start while the file this variable names exists.
REFUSE_FLAG_VARIABLE = "AGENTSESSIONS_TEST_REFUSE_START"


def _descriptor(harness_id: str, **capabilities: object) -> harness_pb2.HarnessDescriptor:
    caps = harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY)
    for name, value in capabilities.items():
        setattr(caps, name, value)
    return harness_pb2.HarnessDescriptor(id=harness_id, version="1", capabilities=caps)


class PidHarness:
    """Outputs ``pid N``: the process that ran the turn."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return _descriptor("pid")

    async def run(self, start: Start, sink: EventSink) -> None:
        await sink.output(f"pid {os.getpid()}")


class HangOnceHarness:
    """Outputs ``before``. While the file named by config ``{"flag": PATH}`` exists, the run removes
    it and hangs until its process is killed; otherwise it outputs ``after from pid N`` and ends."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return _descriptor("hang-once")

    async def run(self, start: Start, sink: EventSink) -> None:
        flag = Path(json.loads(start.config or b"{}").get("flag", "/nonexistent"))
        # Decided before the output: the test kills this process as soon as it sees "before".
        hang = await asyncio.to_thread(_take, flag)
        await sink.output("before")
        if hang:
            await asyncio.Event().wait()
        await sink.output(f"after from pid {os.getpid()}")


def _take(flag: Path) -> bool:
    """Remove the flag file; whether it was there."""
    try:
        flag.unlink()
    except FileNotFoundError:
        return False
    return True


class GpuHarness:
    """Declares requires_gpu; outputs ``gpu``."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return _descriptor("gpu", requires_gpu=True)

    async def run(self, start: Start, sink: EventSink) -> None:
        await sink.output("gpu")


def refusing_start() -> PidHarness:
    """A PidHarness factory that fails while the flag file named in the environment exists."""
    flag = os.environ.get(REFUSE_FLAG_VARIABLE, "")
    if flag and Path(flag).exists():
        raise RuntimeError("refusing to start: flag file present")
    return PidHarness()
