"""One small agent per framework, with the same tools, for the adapter tests.

Each shop has ``lookup_order`` (run by the host), ``slow_note`` and ``fast_note`` (run in the
harness: they append to ``Shop.effects``, ``slow_note`` after yielding to the event loop many
times, so a framework that runs a completion's calls concurrently would finish ``fast_note``
first), and ``refund`` (the framework's approval primitive; run by the host once approved).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

from agentsessions.sdk import Harness
from agentsessions.sdk.types import ToolCall

FRAMEWORKS = ("langgraph", "openai-agents", "pydantic-ai")
# Event-loop turns slow_note yields before its effect: far more than a framework needs to start
# every other call of the completion.
SLOW_YIELDS = 200


@dataclass
class Shop:
    """A harness and what its in-harness tools did."""

    harness: Harness = field(init=False)
    effects: list[str] = field(default_factory=list)
    holding: asyncio.Event = field(default_factory=asyncio.Event)  # set while ``hold`` runs


async def _hold(shop: Shop) -> str:
    """An in-harness tool that never finishes (until the run is cancelled)."""
    shop.holding.set()
    await asyncio.Event().wait()
    return "never"


def refund_reason(call: ToolCall) -> str:
    return f"refund {call.args.get('amount_cents')} of {call.args.get('order_id')}"


def host_tools() -> dict[str, Callable[[dict[str, Any]], Any]]:
    """The host side of the shops' host-run tools (for HarnessEnvironment)."""
    return {
        "lookup_order": lambda args: {"order_id": args["order_id"], "status": "delivered"},
        "refund": lambda args: {"refunded_cents": args["amount_cents"]},
    }


def build(framework: str, *, stream: bool = False, temperature: float | None = None) -> Shop:
    builders = {"pydantic-ai": _pydantic_ai, "openai-agents": _openai_agents, "langgraph": _langgraph}
    return builders[framework](stream, temperature)


async def _slow(effects: list[str], text: str) -> str:
    for _ in range(SLOW_YIELDS):
        await asyncio.sleep(0)
    effects.append(text)
    return f"slow noted {text}"


@dataclass(frozen=True)
class _Tools:
    """The shop's tools as plain functions, for each framework to register with its own decorator
    (name, docstring and annotations make the tool's definition)."""

    lookup_order: Callable[[str], dict[str, Any]]
    slow_note: Callable[[str], Awaitable[str]]
    fast_note: Callable[[str], Awaitable[str]]
    hold: Callable[[], Awaitable[str]]
    refund: Callable[[str, int], dict[str, Any]]


def _tools(shop: Shop) -> _Tools:
    effects = shop.effects

    def lookup_order(order_id: str) -> dict[str, Any]:
        """Look an order up."""
        raise AssertionError("the host runs lookup_order")

    async def slow_note(text: str) -> str:
        """Write a note, slowly."""
        return await _slow(effects, text)

    async def fast_note(text: str) -> str:
        """Write a note."""
        effects.append(text)
        return f"noted {text}"

    async def hold() -> str:
        """Wait."""
        return await _hold(shop)

    def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund an order."""
        raise AssertionError("the host runs refund once approved")

    return _Tools(lookup_order, slow_note, fast_note, hold, refund)


def _pydantic_ai(stream: bool, temperature: float | None) -> Shop:
    from pydantic_ai import Agent
    from pydantic_ai.settings import ModelSettings

    from agentsessions.sdk.adapters.pydantic_ai import wrap

    shop = Shop()
    t = _tools(shop)
    settings = ModelSettings(temperature=temperature, max_tokens=64) if temperature is not None else None
    agent = Agent(instructions="Help the customer.", model_settings=settings)
    agent.tool_plain(t.hold)
    agent.tool_plain(t.lookup_order)
    agent.tool_plain(t.slow_note)
    agent.tool_plain(t.fast_note)
    agent.tool_plain(requires_approval=True)(t.refund)
    shop.harness = wrap(
        agent,
        id="t-pydantic-ai",
        version="1",
        host_tools=["lookup_order"],
        reason=refund_reason,
        stream=stream,
    )
    return shop


def _openai_agents(stream: bool, temperature: float | None) -> Shop:
    from agents import Agent, ModelSettings, function_tool

    from agentsessions.sdk.adapters.openai_agents import wrap

    shop = Shop()
    t = _tools(shop)
    settings = (
        ModelSettings(temperature=temperature, max_tokens=64) if temperature is not None else ModelSettings()
    )
    agent = Agent(
        name="shop",
        instructions="Help the customer.",
        tools=[
            function_tool(t.lookup_order),
            function_tool(t.slow_note),
            function_tool(t.fast_note),
            function_tool(t.hold),
            function_tool(needs_approval=True)(t.refund),
        ],
        model_settings=settings,
    )
    shop.harness = wrap(
        agent,
        id="t-openai-agents",
        version="1",
        host_tools=["lookup_order"],
        reason=refund_reason,
        stream=stream,
    )
    return shop


def _langgraph(stream: bool, temperature: float | None) -> Shop:
    from agentsessions.sdk.adapters.langgraph import HostChatModel, HostToolNode, wrap

    shop = Shop()
    t = _tools(shop)
    tools = [tool(t.lookup_order), tool(t.slow_note), tool(t.fast_note), tool(t.hold), tool(t.refund)]
    chat_model = (
        HostChatModel(temperature=temperature, max_tokens=64) if temperature is not None else HostChatModel()
    )
    model = chat_model.bind_tools(tools)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke([SystemMessage("Help the customer."), *state["messages"]])]}

    def next_step(state: MessagesState) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node(
        "tools", HostToolNode(tools, host_tools=["lookup_order"], approval=["refund"], reason=refund_reason)
    )
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", next_step, ["tools", END])
    graph.add_edge("tools", "agent")
    shop.harness = wrap(graph.compile(), id="t-langgraph", version="1", stream=stream)
    return shop
