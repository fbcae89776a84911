"""Agents SDK specifics: an agent handed off to has its tools routed too, and uses the host's model."""

from __future__ import annotations

from agents import Agent, function_tool

from agentsessions.sdk import Message, ToolCall
from agentsessions.sdk.adapters.openai_agents import wrap
from agentsessions.sdk.testing import HarnessEnvironment
from agentsessions.v1 import common_pb2


async def test_a_handoff_target_runs_on_the_host_model_with_routed_tools() -> None:
    notes: list[str] = []

    @function_tool
    def add_note(text: str) -> str:
        """Write a note."""
        notes.append(text)
        return "noted"

    billing = Agent(name="billing", instructions="You handle billing.", tools=[add_note], model="gpt-unused")
    triage = Agent(name="triage", instructions="Route the customer.", handoffs=[billing], model="gpt-unused")
    env = HarnessEnvironment(
        wrap(triage, id="handoff", version="1"),
        model=[
            Message("assistant", [ToolCall("h1", "transfer_to_billing", {})]),
            Message("assistant", [ToolCall("n1", "add_note", {"text": "billing asked"})]),
            "billing here",
        ],
    )
    outcome = await env.run("I was charged twice")
    assert outcome.state == "COMPLETED", outcome.error
    assert notes == ["billing asked"]
    assert [e.result.id for e in env.events if e.kind == common_pb2.EVENT_TOOL_RESULT] == ["n1"]
    assert env.requests[1].messages[0].text() == "You handle billing."
    assert (await env.replay()).recorded_results_served == 1
    assert notes == ["billing asked"]
