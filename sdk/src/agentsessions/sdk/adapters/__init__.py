"""Framework adapters: an existing agent of a framework as an agentsessions harness.

One module per framework, each an extra of the SDK distribution, so the thin SDK stays
``grpcio`` + ``protobuf`` and ``import agentsessions.sdk`` imports no framework:

- :mod:`agentsessions.sdk.adapters.pydantic_ai` (``pip install "agentsessions-sdk[pydantic-ai]"``):
  a pydantic-ai ``Model`` the host answers and a capability that routes the agent's tools;
- :mod:`agentsessions.sdk.adapters.openai_agents` (``[openai-agents]``): an Agents SDK ``Model`` /
  ``ModelProvider`` the host answers, and the agent's function tools routed through the host;
- :mod:`agentsessions.sdk.adapters.langgraph` (``[langgraph]``): a LangChain ``BaseChatModel`` the
  host answers and a LangGraph tool node that routes tool calls.

Every adapter follows the same rules (docs/harnesses.md states them for authors):

- the framework's model calls go to the host (``Execution.model``): journaled live, answered
  from the journal on replay and recovery, never sent to a provider by the harness;
- a tool the framework would run itself is an in-harness tool (IN_HARNESS_REPORTED): it runs
  once, live, and its recorded result is served on replay and Resume;
- a tool named in ``host_tools`` (or of the framework's own "executed elsewhere" kind) is run by
  the host (CONTROLLER_MEDIATED), from the host's ``--tools-config``;
- the framework's approval primitive maps onto REQUIRES_APPROVAL: the host journals the request
  (with a reason), parks the turn, and runs the call after an approving decision;
- the framework's conversation is rebuilt from the journal (``Execution.conversation``) at the
  start of every execution, so a fork or a later turn continues where the journal says.
"""
