"""The counter harness: per-session state in memory, declared as needing memory snapshots."""

from __future__ import annotations

from agentsessions.harnesses.counter import CounterHarness
from agentsessions.sdk.harness import text_message
from agentsessions.sdk.testing import HarnessEnvironment
from agentsessions.v1 import common_pb2, harness_pb2


async def test_declares_it_needs_memory_snapshots() -> None:
    descriptor = await CounterHarness().describe()
    assert (descriptor.id, descriptor.version) == ("counter", "1")
    assert descriptor.capabilities.resumability == harness_pb2.RESUMABILITY_REQUIRES_MEMORY_SNAPSHOT


async def test_counts_across_runs_per_session() -> None:
    harness = CounterHarness()
    first = HarnessEnvironment(harness, session="sess-a")
    outputs = [(await first.run("tick")).outputs for _ in range(3)]
    other = HarnessEnvironment(harness, session="sess-b")
    outputs.append((await other.run("tick")).outputs)
    assert outputs == [["1"], ["2"], ["3"], ["1"]]
    assert (harness.count("sess-a"), harness.count("sess-b"), harness.count("sess-c")) == (3, 1, 0)


async def test_never_rebuilds_state_from_history() -> None:
    # A history full of earlier counts (as a replay would hand it) must not move the count (I4).
    history = [
        common_pb2.Event(kind=common_pb2.EVENT_OUTPUT, message=text_message("assistant", str(n)))
        for n in range(1, 6)
    ]
    env = HarnessEnvironment(CounterHarness(), journal=history)
    assert (await env.run("tick")).outputs == ["1"]


async def test_a_new_process_starts_from_zero() -> None:
    # The honest degradation without memory snapshots: state lives and dies with the process.
    first = HarnessEnvironment(CounterHarness())
    await first.run("tick")
    await first.run("tick")
    restarted = HarnessEnvironment(CounterHarness(), journal=first.events)
    assert (await restarted.run("tick")).outputs == ["1"]


async def test_a_count_the_host_did_not_journal_is_not_kept() -> None:
    harness = CounterHarness()
    env = HarnessEnvironment(harness)
    crashed = await env.run("tick", crash_after=0)  # the host went away before journaling
    assert crashed.state == "CRASHED" and crashed.outputs == []
    assert harness.count(env.session) == 0
    assert (await env.run("tick")).outputs == ["1"]
