"""LangGraph specifics: a sync node's ``invoke`` reaches the host from its worker thread."""

from __future__ import annotations

from typing import Any

from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph

from agentsessions.sdk import Message, ToolCall
from agentsessions.sdk.adapters.langgraph import HostChatModel, HostToolNode, wrap
from agentsessions.sdk.testing import check_replay


@tool
def shout(text: str) -> str:
    """Say it loudly."""
    return text.upper()


def next_step(state: MessagesState) -> str:
    return "tools" if getattr(state["messages"][-1], "tool_calls", None) else END


async def test_a_sync_model_node_is_answered_by_the_host() -> None:
    model = HostChatModel(model="small").bind_tools([shout])

    def agent(state: MessagesState) -> dict[str, Any]:  # LangGraph runs it in a worker thread
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", HostToolNode([shout]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", next_step, ["tools", END])
    graph.add_edge("tools", "agent")
    report = await check_replay(
        wrap(graph.compile(), id="sync", version="1"),
        "say hi",
        model=[Message("assistant", [ToolCall("c1", "shout", {"text": "hi"})]), "HI"],
    )
    assert report.model_calls == 0 and report.recorded_results_served == 1
    assert report.outputs == ["", "HI"]
