"""pydantic-ai specifics: its retry and failure signals from an in-harness tool are journaled and
replayed as the same signals; ``ExternalToolset`` tools are run by the host."""

from __future__ import annotations

from pydantic_ai import Agent, ModelRetry
from pydantic_ai.tools import ToolDefinition as PaiToolDefinition
from pydantic_ai.toolsets import ExternalToolset

from agentsessions.sdk import Message, ToolCall
from agentsessions.sdk.adapters.pydantic_ai import HostModel, wrap
from agentsessions.sdk.testing import HarnessEnvironment
from agentsessions.v1 import common_pb2


async def test_a_model_retry_is_reported_once_and_replayed_as_a_retry() -> None:
    runs: list[int] = []
    agent = Agent(HostModel())

    @agent.tool_plain
    def pick(number: int) -> str:
        """Pick an even number."""
        runs.append(number)
        if number % 2:
            raise ModelRetry(f"{number} is odd, pick an even number")
        return f"picked {number}"

    harness = wrap(agent, id="retry", version="1")
    script: list[Message | str] = [
        Message("assistant", [ToolCall("c1", "pick", {"number": 3})]),
        Message("assistant", [ToolCall("c2", "pick", {"number": 4})]),
        "picked 4",
    ]
    env = HarnessEnvironment(harness, model=script)
    assert (await env.run("pick one")).state == "COMPLETED"
    assert runs == [3, 4]
    failed = [e.result for e in env.events if e.kind == common_pb2.EVENT_TOOL_RESULT and e.result.is_error]
    assert [r.error for r in failed] == ["3 is odd, pick an even number"]
    second = env.requests[1].messages[-1]
    assert second.role == "tool" and "3 is odd" in second.tool_results[0].text()
    report = await env.replay()
    assert report.model_calls == 0 and report.recorded_results_served == 2
    assert runs == [3, 4], "the tool ran again on replay"


async def test_an_external_toolset_tool_is_run_by_the_host() -> None:
    lookup = PaiToolDefinition(
        name="lookup", description="Look a thing up.", parameters_json_schema={"type": "object"}
    )
    agent = Agent(HostModel(), toolsets=[ExternalToolset([lookup])])
    env = HarnessEnvironment(
        wrap(agent, id="external", version="1"),
        model=[Message("assistant", [ToolCall("c1", "lookup", {"q": "x"})]), "found"],
        tools={"lookup": lambda args: {"found": args["q"]}},
    )
    assert (await env.run("look x up")).state == "COMPLETED"
    assert [c.name for c in env.tool_runs] == ["lookup"]
    (call,) = [e.tool for e in env.events if e.kind == common_pb2.EVENT_TOOL_CALL]
    assert call.mediation == common_pb2.MEDIATION_CONTROLLER_MEDIATED and call.idempotency_key


async def test_an_object_result_reads_the_same_whatever_key_order_the_journal_gives_back() -> None:
    agent = Agent(HostModel())

    @agent.tool_plain
    def lookup(order_id: str) -> dict[str, object]:
        """Look an order up (run by the host)."""
        raise AssertionError("the host runs lookup")

    # Whatever key order the host's object arrives in (a journal may give it back in another),
    # pydantic-ai writes it out for the model in one order.
    env = HarnessEnvironment(
        wrap(agent, id="order", version="1", host_tools=["lookup"]),
        model=[Message("assistant", [ToolCall("c1", "lookup", {"order_id": "A-1"})]), "delivered"],
        tools={"lookup": lambda args: {"status": "delivered", "order_id": "A-1", "eta": {"z": 1, "a": 2}}},
    )
    assert (await env.run("where is A-1?")).state == "COMPLETED"
    sent = env.requests[1].messages[-1].tool_results[0].text()
    assert sent == '{"eta":{"a":2,"z":1},"order_id":"A-1","status":"delivered"}'
