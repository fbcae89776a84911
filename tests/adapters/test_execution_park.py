"""The SDK rule the adapters rely on when a framework runs a completion's tool calls at once and one
of them parks: no later call of the execution runs anything (its side effect would be missing from
the journal, and the recovery would repeat it). Shown without a framework, with ``asyncio.gather``,
which (unlike a task group) never cancels the other calls."""

from __future__ import annotations

import asyncio
from typing import Any

from agentsessions.sdk import (
    Execution,
    HarnessDescriptor,
    Mediation,
    Message,
    NativeHarness,
    ToolCall,
    ToolResult,
    ToolSpec,
    find_park,
)
from agentsessions.sdk.testing import HarnessEnvironment


class GatheringAgent(NativeHarness):
    descriptor = HarnessDescriptor(
        id="gather", version="1", tools=[ToolSpec("deploy", mediation=Mediation.REQUIRES_APPROVAL)]
    )

    def __init__(self) -> None:
        super().__init__()
        self.effects: list[str] = []

    def note(self, args: dict[str, Any]) -> str:
        self.effects.append(args["text"])
        return "noted"

    async def execute(self, ex: Execution) -> None:
        result = await ex.model([Message.user(ex.input_text())], tools=[])
        if not result.tool_calls:
            return
        deploy, note = result.tool_calls
        answers = await asyncio.gather(
            ex.call_tool(deploy), ex.call_tool(note, self.note), return_exceptions=True
        )
        parks = [find_park(a) if isinstance(a, BaseException) else None for a in answers]
        if parks[0] is not None:
            raise parks[0]
        results = [a for a in answers if isinstance(a, ToolResult)]
        await ex.model([Message.user(ex.input_text()), result.message, Message.tool(*results)])


async def test_a_call_after_a_park_raises_the_park_instead_of_running() -> None:
    agent = GatheringAgent()
    calls = Message("assistant", [ToolCall("c1", "deploy", {}), ToolCall("c2", "note", {"text": "x"})])
    env = HarnessEnvironment(agent, model=[calls, "deployed"], tools={"deploy": lambda args: "ok"})
    parked = await env.run("deploy and note")
    assert parked.state == "PARKED", parked.error
    assert agent.effects == [], "the in-harness call ran after the completion's earlier call parked"
    env.approve()
    done = await env.resume()
    assert done.state == "COMPLETED", done.error
    assert agent.effects == ["x"]
    assert (await env.replay()).recorded_results_served == 1
    assert agent.effects == ["x"]
