"""A shop-support agent written with the OpenAI Agents SDK, served as an agentsessions harness.

    cd examples && agentsessions-harness serve openai_agents_agent:harness --listen 127.0.0.1:50061
    PYTHONPATH=examples agentsessions serve --tools-config examples/tools.toml \
        --model MODEL --model-base-url URL --harness shop=127.0.0.1:50061

The agent is ordinary Agents SDK code; the part that makes it a harness is at the end. Its tools:
``lookup_order`` is run by the host (examples/tools.toml), ``add_note`` runs here and appends to a
notes file (once: a replay or a Resume serves the recorded result), and ``refund`` needs a
person's approval (the Agents SDK's ``needs_approval``), after which the host runs it.
"""

from __future__ import annotations

import os
from pathlib import Path

from agents import Agent, function_tool

NOTES = Path(os.environ.get("SHOP_NOTES", "shop-notes.txt"))


@function_tool
def lookup_order(order_id: str) -> dict[str, object]:
    """Look up an order by its id: status, item and amount paid."""
    raise NotImplementedError("run by the host (examples/tools.toml)")


@function_tool
def add_note(order_id: str, text: str) -> str:
    """Append a note to the order's support log."""
    with NOTES.open("a", encoding="utf-8") as notes:
        notes.write(f"{order_id}: {text}\n")
    return f"noted on {order_id}"


@function_tool(needs_approval=True)
def refund(order_id: str, amount_cents: int) -> dict[str, object]:
    """Refund part or all of an order (a person approves each refund first)."""
    raise NotImplementedError("run by the host (examples/tools.toml) once approved")


agent = Agent(
    name="shop",
    instructions="You help customers of a small shop. Look orders up before answering; "
    "note what you told the customer; refunds need a person's approval.",
    tools=[lookup_order, add_note, refund],
)


# == agentsessions: the wrapping part ==
from agentsessions.sdk.adapters.openai_agents import wrap  # noqa: E402

harness = wrap(
    agent,
    id="shop-openai-agents",
    version="1",
    host_tools=["lookup_order"],
    reasons={
        "refund": lambda call: f"refund {call.args.get('amount_cents')} cents of {call.args.get('order_id')}"
    },
)
