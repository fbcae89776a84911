"""A built-in harness is imported and built at its first use (controller.harnesses.BuiltinHarness),
and is then the same harness as the class itself: one object, every call and hook forwarded."""

from __future__ import annotations

import asyncio
import copy

import pytest

from agentsessions.host.controller.harnesses import BuiltinHarness
from agentsessions.sdk.harness import EventSink, Start
from agentsessions.v1 import harness_pb2

BUILT: list[Recorder] = []


class Recorder:
    """A harness that counts how often it is built and what it is asked."""

    def __init__(self) -> None:
        BUILT.append(self)
        self.calls: list[str] = []

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        self.calls.append("describe")
        return harness_pb2.HarnessDescriptor(id="recorder", version="1")

    async def run(self, start: Start, sink: EventSink) -> None:
        self.calls.append("run")

    def cancel(self, execution_id: str) -> None:
        self.calls.append(f"cancel {execution_id}")


class NoHooks:
    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(id="plain", version="1")

    async def run(self, start: Start, sink: EventSink) -> None:
        return None


def test_the_harness_is_built_once_at_its_first_use_and_answers_as_itself() -> None:
    BUILT.clear()
    harness = BuiltinHarness(f"{__name__}:Recorder")
    assert BUILT == []
    assert asyncio.run(harness.describe()).id == "recorder"
    asyncio.run(harness.run(None, None))  # type: ignore[arg-type]
    harness.cancel("e1")
    assert len(BUILT) == 1
    assert BUILT[0].calls == ["describe", "run", "cancel e1"]
    assert harness.loaded() is BUILT[0]


def test_a_hook_the_harness_lacks_stays_missing() -> None:
    # The controller looks hooks up with getattr(harness, "cancel", None).
    harness = BuiltinHarness(f"{__name__}:NoHooks")
    assert getattr(harness, "cancel", None) is None
    with pytest.raises(AttributeError):
        harness.snapshot  # noqa: B018


def test_the_host_s_built_in_harnesses_load_by_name() -> None:
    for target, expected in [
        ("agentsessions.harnesses.echo:EchoHarness", "echo"),
        ("agentsessions.harnesses.chat:ChatHarness", "chat"),
    ]:
        descriptor = asyncio.run(BuiltinHarness(target).describe())
        assert expected in descriptor.id


def test_a_copy_without_its_state_does_not_recurse() -> None:
    harness = copy.copy(BuiltinHarness(f"{__name__}:NoHooks"))
    assert asyncio.run(harness.describe()).id == "plain"
    bare = BuiltinHarness.__new__(BuiltinHarness)
    with pytest.raises(AttributeError):
        bare.loaded()
