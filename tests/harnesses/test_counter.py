"""The counter harness: per-session state in memory, declared as needing memory snapshots."""

from __future__ import annotations

import pytest

from agentsessions.harnesses.counter import CounterHarness
from agentsessions.sdk.harness import Start, text_message
from agentsessions.v1 import common_pb2, harness_pb2


class OutputSink:
    """Records outputs; every other effect is a failure (the counter makes none)."""

    def __init__(self, *, fail_output: bool = False) -> None:
        self.outputs: list[str] = []
        self._fail_output = fail_output

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        raise AssertionError("the counter calls no model")

    async def output(self, text: str) -> None:
        if self._fail_output:
            raise ConnectionError("host went away before journaling")
        self.outputs.append(text)

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        raise AssertionError("the counter calls no tools")

    async def report(self, result: common_pb2.ToolResult) -> None:
        raise AssertionError("the counter reports nothing")

    async def usage(self, usage: common_pb2.Usage) -> None:
        raise AssertionError("the counter reports no usage")


def start(
    session: str = "sess-a", execution: str = "e1", history: list[common_pb2.Event] | None = None
) -> Start:
    return Start(
        session=session, execution_id=execution, inputs=[text_message("user", "tick")], history=history or []
    )


async def test_declares_it_needs_memory_snapshots() -> None:
    descriptor = await CounterHarness().describe()
    assert (descriptor.id, descriptor.version) == ("counter", "1")
    assert descriptor.capabilities.resumability == harness_pb2.RESUMABILITY_REQUIRES_MEMORY_SNAPSHOT


async def test_counts_across_runs_per_session() -> None:
    harness = CounterHarness()
    sink = OutputSink()
    for execution in ("e1", "e2", "e3"):
        await harness.run(start(execution=execution), sink)
    await harness.run(start(session="sess-b"), sink)
    assert sink.outputs == ["1", "2", "3", "1"]
    assert (harness.count("sess-a"), harness.count("sess-b"), harness.count("sess-c")) == (3, 1, 0)


async def test_never_rebuilds_state_from_history() -> None:
    # A history full of earlier counts (as a replay would hand it) must not move the count (I4).
    history = [
        common_pb2.Event(kind=common_pb2.EVENT_OUTPUT, message=text_message("assistant", str(n)))
        for n in range(1, 6)
    ]
    fresh = CounterHarness()
    sink = OutputSink()
    await fresh.run(start(history=history), sink)
    assert sink.outputs == ["1"]


async def test_a_new_process_starts_from_zero() -> None:
    # The honest degradation without memory snapshots: state lives and dies with the process.
    first = CounterHarness()
    await first.run(start(execution="e1"), OutputSink())
    await first.run(start(execution="e2"), OutputSink())
    restarted = CounterHarness()
    sink = OutputSink()
    await restarted.run(start(execution="e3"), sink)
    assert sink.outputs == ["1"]


async def test_a_count_the_host_did_not_journal_is_not_kept() -> None:
    harness = CounterHarness()
    with pytest.raises(ConnectionError):
        await harness.run(start(), OutputSink(fail_output=True))
    assert harness.count("sess-a") == 0
    sink = OutputSink()
    await harness.run(start(execution="e2"), sink)
    assert sink.outputs == ["1"]
