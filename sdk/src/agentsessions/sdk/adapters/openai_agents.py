"""An OpenAI Agents SDK agent as an agentsessions harness.

Install with ``pip install "agentsessions-sdk[openai-agents]"``.

The Agents SDK's own extension points carry the agent's effects to the host:

- :class:`HostModel` (an Agents SDK ``Model``) and :class:`HostModelProvider` (its
  ``ModelProvider``): every model request of the run, ``get_response`` and ``stream_response``
  alike (``Runner.run_streamed`` is fed from the host's one result), goes to the host, so it is
  journaled and a replay sends nothing to a provider. The request is built with the Agents SDK's
  own chat-completions converter, then handed to the host as a ``ModelCall``;
- each ``FunctionTool`` of the agent (and of the agents it hands off to) is rerouted
  (``on_invoke_tool``): an ordinary tool runs in the harness and is reported (and is not run again
  on replay or Resume), a tool named in ``host_tools`` is run by the host, and a tool with
  ``needs_approval`` (True, or a policy that says so for the call) is a REQUIRES_APPROVAL call:
  the host parks the turn and, once a person approves, runs it. The run never stops with the
  Agents SDK's own interruptions: the host's park is the interruption, ``Approve`` + ``Resume``
  its ``RunState.approve`` + re-run.

:func:`wrap` builds the harness::

    agent = Agent(name="shop", instructions="...", tools=[lookup_order, add_note, refund])
    harness = wrap(agent, id="my-agent", version="1", host_tools=["lookup_order"])

The Agents SDK runs a completion's tool calls concurrently; the SDK lets them reach the host in
the completion's order. Tracing is disabled for the runs the harness makes (the Agents SDK would
export traces to a provider otherwise); pass a ``RunConfig`` to choose otherwise.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any, cast

from agents import Agent, FunctionTool, ModelSettings, RunConfig, Runner, Tool
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.models.chatcmpl_converter import Converter
from agents.models.chatcmpl_stream_handler import ChatCmplStreamHandler
from agents.models.fake_id import FAKE_RESPONSES_ID
from agents.models.interface import Model, ModelProvider, ModelTracing
from agents.tool_context import ToolContext
from agents.usage import Usage as AgentsUsage
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessage
from openai.types.responses import Response, ResponsePromptParam

from agentsessions.sdk import chat
from agentsessions.sdk.adapters.routing import (
    Reason,
    ToolRoutes,
    current_execution,
    error_text,
    reported,
    route,
    running,
)
from agentsessions.sdk.execution import Execution
from agentsessions.sdk.native import NativeHarness
from agentsessions.sdk.types import HarnessDescriptor, Message, ModelCall, ModelResult, ToolCall, ToolResult

SYSTEM = "agentsessions"
# Agents SDK model settings that are chat-completions body fields.
_SETTINGS = ("temperature", "top_p", "frequency_penalty", "presence_penalty", "max_tokens", "top_logprobs")


class HostModel(Model):
    """An Agents SDK model answered by the agentsessions host of the running execution.

    ``model`` is the model id the host is asked for ("" lets the host use its configured model).
    Sampling settings (temperature, top_p, max_tokens, penalties, ``extra_args``) become the
    call's params: journaled, hashed and sent by the host."""

    def __init__(self, model: str = "") -> None:
        self.model = model

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: ResponsePromptParam | None = None,
    ) -> ModelResponse:
        result = await self._ask(system_instructions, input, model_settings, tools, output_schema, handoffs)
        completion = chat.chat_completion(result, model=self.model or SYSTEM)
        message = ChatCompletionMessage.model_validate(completion["choices"][0]["message"])
        items = Converter.message_to_output_items(message, provider_data={"model": self.model or SYSTEM})
        return ModelResponse(output=items, usage=_usage(result), response_id=None)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: ResponsePromptParam | None = None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        result = await self._ask(system_instructions, input, model_settings, tools, output_schema, handoffs)
        name = self.model or SYSTEM
        chunks = [
            ChatCompletionChunk.model_validate(c) for c in chat.chat_completion_chunks(result, model=name)
        ]

        async def replayed() -> AsyncIterator[ChatCompletionChunk]:
            for chunk in chunks:
                yield chunk

        base = Response(
            id=FAKE_RESPONSES_ID,
            created_at=time.time(),
            model=name,
            object="response",
            output=[],
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=False,
        )
        async for event in ChatCmplStreamHandler.handle_stream(base, cast(Any, replayed()), model=name):
            yield event

    async def _ask(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: Sequence[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: Sequence[Handoff[Any, Any]],
    ) -> ModelResult:
        ex = current_execution("agentsessions HostModel")
        call = model_call(
            system_instructions, input, model_settings, tools, output_schema, handoffs, model=self.model
        )
        return await ex.model(call)


class HostModelProvider(ModelProvider):
    """A ``ModelProvider`` whose every model (whatever name an agent asks for) is the host's."""

    def __init__(self, model: str = "") -> None:
        self.model = model

    def get_model(self, model_name: str | None) -> Model:
        return HostModel(self.model)


def model_call(
    system_instructions: str | None,
    input: str | list[TResponseInputItem],
    model_settings: ModelSettings,
    tools: Sequence[Tool],
    output_schema: AgentOutputSchemaBase | None,
    handoffs: Sequence[Handoff[Any, Any]],
    *,
    model: str = "",
) -> ModelCall:
    """The ModelCall an Agents SDK model request describes, built through the Agents SDK's own
    chat-completions converter (instructions first, as a system message)."""
    messages: list[Any] = list(Converter.items_to_messages(input))
    if system_instructions:
        messages.insert(0, {"role": "system", "content": system_instructions})
    converted = [Converter.tool_to_openai(tool) for tool in tools]
    converted += [Converter.convert_handoff_tool(handoff) for handoff in handoffs]
    body: dict[str, Any] = {"model": model, "messages": chat_json(messages)}
    if converted:
        body["tools"] = chat_json(converted)
        if model_settings.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = model_settings.parallel_tool_calls
    choice = Converter.convert_tool_choice(model_settings.tool_choice)
    if isinstance(choice, (str, dict)):
        body["tool_choice"] = chat_json(choice)
    response_format = Converter.convert_response_format(output_schema)
    if isinstance(response_format, dict):
        body["response_format"] = chat_json(response_format)
    for name in _SETTINGS:
        value = getattr(model_settings, name, None)
        if value is not None:
            body[name] = value
    body.update(model_settings.extra_args or {})
    return chat.model_call_from_chat(body)


def chat_json(value: Any) -> Any:
    """The converter's output as plain JSON values (it returns typed dicts and iterables)."""
    if isinstance(value, Mapping):
        return {str(k): chat_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or (
        hasattr(value, "__iter__") and not isinstance(value, (str, bytes))
    ):
        return [chat_json(v) for v in value]
    return value


def _usage(result: ModelResult) -> AgentsUsage:
    if result.usage is None:
        return AgentsUsage(requests=1)
    u = result.usage
    return AgentsUsage(
        requests=1,
        input_tokens=u.input_tokens,
        output_tokens=u.output_tokens,
        total_tokens=u.input_tokens + u.output_tokens,
    )


# -- tools --------------------------------------------------------------------------------------------


def routed_agent(agent: Agent[Any], routes: ToolRoutes) -> Agent[Any]:
    """A copy of ``agent`` (and of the agents it hands off to) whose function tools are routed
    through the running execution; the original is left as it was."""
    copies: dict[int, Agent[Any]] = {}

    def copy(original: Agent[Any]) -> Agent[Any]:
        made = copies.get(id(original))
        if made is not None:
            return made
        clone = original.clone(tools=[])
        copies[id(original)] = clone
        clone.tools = [routed_tool(t, routes) if isinstance(t, FunctionTool) else t for t in original.tools]
        clone.handoffs = [copy(h) if isinstance(h, Agent) else h for h in original.handoffs]
        return clone

    return copy(agent)


def routed_tool(tool: FunctionTool, routes: ToolRoutes) -> FunctionTool:
    """``tool`` with its invocation made an execution effect (see the module docstring)."""
    invoke = tool.on_invoke_tool
    policy = tool.needs_approval

    async def on_invoke_tool(ctx: ToolContext[Any], arguments: str) -> Any:
        args = chat.parse_arguments(arguments, tool.name)
        call = ToolCall(id=ctx.tool_call_id, name=tool.name, args=args)
        if isinstance(policy, bool):
            approval = policy
        else:
            decided = policy(ctx, args, ctx.tool_call_id)
            approval = bool(await decided) if hasattr(decided, "__await__") else bool(decided)

        async def run(_: dict[str, Any]) -> ToolResult:
            return reported(call.id, await invoke(ctx, arguments))

        result = await route(routes, call, run, approval=approval, where="Agents SDK tool call")
        # A failure reaches the model as a failed Agents SDK tool's does, as a message; an object
        # as JSON text (the Agents SDK would send its Python repr).
        return error_text(result) if result.is_error else chat.tool_result_text(result)

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, needs_approval=False)


# -- the harness --------------------------------------------------------------------------------------


def conversation_input(ex: Execution) -> list[TResponseInputItem]:
    """The journal's conversation (and this execution's inputs) as Agents SDK input items."""
    items: list[Any] = []
    for message in ex.conversation():
        items.extend(_items(message))
    return items


def _items(message: Message) -> list[dict[str, Any]]:
    if message.role == "tool":
        return [
            {
                "type": "function_call_output",
                "call_id": result.id,
                "output": error_text(result) if result.is_error else chat.tool_result_text(result),
            }
            for result in message.tool_results
        ]
    out: list[dict[str, Any]] = []
    text = message.text()
    if message.role == "assistant":
        if text:
            out.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "id": FAKE_RESPONSES_ID,
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            )
        for call in message.tool_calls:
            out.append(
                {
                    "type": "function_call",
                    "call_id": call.id,
                    "name": call.name,
                    "arguments": chat.chat_tool_call(call)["function"]["arguments"],
                }
            )
        return out
    return [{"role": "system" if message.role == "system" else "user", "content": text}]


async def run_agent(
    agent: Agent[Any],
    ex: Execution,
    *,
    routes: ToolRoutes | None = None,
    model: str = "",
    stream: bool = False,
    run_config: RunConfig | None = None,
    max_turns: int | None = None,
) -> Any:
    """Run ``agent`` as execution ``ex``: its input is the conversation the journal holds (this
    execution's inputs last), its model the host's, its tools routed. ``stream`` drives it
    through ``Runner.run_streamed``. Returns the run's final output."""
    config = run_config or RunConfig(tracing_disabled=True)
    config = dataclasses.replace(config, model=HostModel(model), model_provider=HostModelProvider(model))
    routed = routed_agent(agent, routes or ToolRoutes())
    items = conversation_input(ex)
    options: dict[str, Any] = {"run_config": config}
    if max_turns is not None:
        options["max_turns"] = max_turns
    with running(ex):
        if stream:
            streamed = Runner.run_streamed(routed, items, **options)
            async for _ in streamed.stream_events():
                pass
            return streamed.final_output
        result = await Runner.run(routed, items, **options)
        return result.final_output


class OpenAIAgentsHarness(NativeHarness):
    """An Agents SDK agent served as a harness: each execution is one run (:func:`run_agent`)."""

    def __init__(
        self,
        agent: Agent[Any],
        descriptor: HarnessDescriptor,
        *,
        routes: ToolRoutes,
        model: str = "",
        stream: bool = False,
        run_config: RunConfig | None = None,
        max_turns: int | None = None,
    ) -> None:
        super().__init__()
        self.agent = agent
        self.descriptor = descriptor
        self.routes = routes
        self.model = model
        self.stream = stream
        self.run_config = run_config
        self.max_turns = max_turns

    async def execute(self, ex: Execution) -> None:
        await run_agent(
            self.agent,
            ex,
            routes=self.routes,
            model=self.model,
            stream=self.stream,
            run_config=self.run_config,
            max_turns=self.max_turns,
        )


def wrap(
    agent: Agent[Any],
    *,
    id: str,
    version: str,
    host_tools: Collection[str] = (),
    reasons: Mapping[str, Reason] | None = None,
    reason: Reason | None = None,
    model: str = "",
    models: Sequence[str] = (),
    stream: bool = False,
    run_config: RunConfig | None = None,
    max_turns: int | None = None,
) -> OpenAIAgentsHarness:
    """``agent`` as a harness with this id and version (bump the version when a change would
    make recorded executions replay differently). ``host_tools``: tools the host runs;
    ``reasons``/``reason``: why an approval-gated call needs a decision; ``model``: the model id
    to ask the host for ("": the host's configured model); ``stream``: drive the agent through
    ``Runner.run_streamed``."""
    descriptor = HarnessDescriptor(
        id=id, version=version, models=tuple(models), fork_safe=True, streaming=stream
    )
    return OpenAIAgentsHarness(
        agent,
        descriptor,
        routes=ToolRoutes.of(host_tools, reasons, reason),
        model=model,
        stream=stream,
        run_config=run_config,
        max_turns=max_turns,
    )


__all__ = [
    "HostModel",
    "HostModelProvider",
    "OpenAIAgentsHarness",
    "conversation_input",
    "model_call",
    "routed_agent",
    "routed_tool",
    "run_agent",
    "wrap",
]
