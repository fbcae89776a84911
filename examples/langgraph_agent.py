"""A shop-support agent written with LangGraph, served as an agentsessions harness.

    cd examples && agentsessions-harness serve langgraph_agent:harness --listen 127.0.0.1:50061
    PYTHONPATH=examples agentsessions serve --tools-config examples/tools.toml \
        --model MODEL --model-base-url URL --harness shop=127.0.0.1:50061

The graph is an ordinary LangGraph agent loop (a model node, a tool node); the part that makes it a
harness is at the end: the host's chat model and tool node go into the same graph. Its tools:
``lookup_order`` is run by the host (examples/tools.toml), ``add_note`` runs here and appends to a
notes file (once: a replay or a Resume serves the recorded result), and ``refund`` is gated like a
LangGraph human-in-the-loop interrupt: the host parks the turn for a person, then runs it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

NOTES = Path(os.environ.get("SHOP_NOTES", "shop-notes.txt"))
INSTRUCTIONS = SystemMessage(
    "You help customers of a small shop. Look orders up before answering; "
    "note what you told the customer; refunds need a person's approval."
)


@tool
def lookup_order(order_id: str) -> dict[str, object]:
    """Look up an order by its id: status, item and amount paid."""
    raise NotImplementedError("run by the host (examples/tools.toml)")


@tool
def add_note(order_id: str, text: str) -> str:
    """Append a note to the order's support log."""
    with NOTES.open("a", encoding="utf-8") as notes:
        notes.write(f"{order_id}: {text}\n")
    return f"noted on {order_id}"


@tool
def refund(order_id: str, amount_cents: int) -> dict[str, object]:
    """Refund part or all of an order (a person approves each refund first)."""
    raise NotImplementedError("run by the host (examples/tools.toml) once approved")


TOOLS = [lookup_order, add_note, refund]


def build_graph(model: BaseChatModel, tools: ToolNode) -> Any:
    """The agent loop: the model answers or calls tools; tool results go back to the model."""
    bound = model.bind_tools(TOOLS)

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await bound.ainvoke([INSTRUCTIONS, *state["messages"]])]}

    def next_step(state: MessagesState) -> str:
        return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tools)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", next_step, ["tools", END])
    graph.add_edge("tools", "agent")
    return graph.compile()


# == agentsessions: the wrapping part ==
from agentsessions.sdk.adapters.langgraph import HostChatModel, HostToolNode, wrap  # noqa: E402

tool_node = HostToolNode(
    TOOLS,
    host_tools=["lookup_order"],
    approval=["refund"],
    reasons={
        "refund": lambda call: f"refund {call.args.get('amount_cents')} cents of {call.args.get('order_id')}"
    },
)
harness = wrap(build_graph(HostChatModel(), tool_node), id="shop-langgraph", version="1")
