"""A pydantic-ai agent as an agentsessions harness (``pip install "agentsessions-sdk[pydantic-ai]"``).

Two pydantic-ai extension points carry the agent's effects to the host:

- :class:`HostModel`, a pydantic-ai ``Model`` whose requests the host answers (``request`` and
  ``request_stream``, the latter fed from the host's one result), so every model call is
  journaled and a replay sends nothing to a provider;
- :class:`HostTools`, a capability whose ``wrap_tool_execute`` makes every tool call an
  execution effect: an ordinary function tool runs in the harness and is reported (and is not run
  again on replay or Resume), a tool of the ``'external'`` kind (``ExternalToolset``) or named in
  ``host_tools`` is run by the host, and a tool with ``requires_approval=True`` is a
  REQUIRES_APPROVAL call: the host parks the turn and, once a person approves, runs it.

:func:`wrap` builds the harness::

    agent = Agent(HostModel(), instructions="...", tools=[...])
    harness = wrap(agent, id="my-agent", version="1", host_tools=["lookup_order"])

pydantic-ai runs a completion's tool calls concurrently; the SDK lets them reach the host in the
completion's order (``agentsessions.sdk.execution``), so a replay issues them exactly as live.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import field
from typing import Any

from pydantic_ai import Agent, AgentRunResultEvent
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ModelRetry, ToolFailed, ToolFailedError, ToolRetryError
from pydantic_ai.messages import (
    ERROR_OUTCOMES,
    InstructionPart,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    SystemPromptPart,
    TextContent,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.messages import TextPart as PaiTextPart
from pydantic_ai.messages import ThinkingPart as PaiThinkingPart
from pydantic_ai.models import CompletedStreamedResponse, Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext
from pydantic_ai.tools import ToolDefinition as PaiToolDefinition
from pydantic_ai.usage import RequestUsage

from agentsessions.sdk import chat
from agentsessions.sdk.adapters.routing import (
    Reason,
    ToolRoutes,
    current_execution,
    error_text,
    reported,
    result_value,
    route,
    running,
)
from agentsessions.sdk.convert import ConversionError
from agentsessions.sdk.execution import Execution
from agentsessions.sdk.native import NativeHarness
from agentsessions.sdk.structs import struct
from agentsessions.sdk.types import (
    HarnessDescriptor,
    Message,
    ModelCall,
    ModelResult,
    Part,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
    ToolResult,
)

SYSTEM = "agentsessions"
# A failed in-harness call that pydantic-ai should answer with a retry prompt (ModelRetry) rather
# than a plain failure: marked in the reported result, so a replay raises the same.
RETRY_MARK = {"pydantic_ai": "retry"}
# pydantic-ai model settings that are chat-completions body fields, and the field each one is.
_SETTINGS = {
    "max_tokens": "max_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "logit_bias": "logit_bias",
    "parallel_tool_calls": "parallel_tool_calls",
    "stop_sequences": "stop",
}


class HostModel(Model):
    """A pydantic-ai model answered by the agentsessions host of the running execution.

    ``model`` is the model id the host is asked for ("" lets the host use its configured model).
    Model settings that are chat-completions fields (temperature, max_tokens, top_p, seed,
    stop_sequences, ...) become the call's params: journaled, hashed and sent by the host."""

    def __init__(self, model: str = "", *, settings: ModelSettings | None = None) -> None:
        super().__init__(settings=settings)
        self._model = model

    @property
    def model_name(self) -> str:
        return self._model or SYSTEM

    @property
    def system(self) -> str:
        return SYSTEM

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        model_settings, model_request_parameters = self.prepare_request(
            model_settings, model_request_parameters
        )
        ex = current_execution("HostModel")
        call = model_call(messages, model_settings, model_request_parameters, model=self._model)
        return model_response(await ex.model(call), model_name=self.model_name)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        # The host answers with one whole completion (journaled as one OUTPUT); the stream replays it.
        response = await self.request(messages, model_settings, model_request_parameters)
        yield CompletedStreamedResponse(
            response, model_request_parameters=model_request_parameters, replay_events=True
        )


# -- pydantic-ai messages <-> the contract's ---------------------------------------------------------


def model_call(
    messages: Sequence[ModelMessage],
    settings: ModelSettings | None,
    parameters: ModelRequestParameters,
    *,
    model: str = "",
) -> ModelCall:
    """The ModelCall a pydantic-ai request describes: the instructions as a system message, then
    the messages; the function and output tools; "required" when text output is not allowed."""
    native: list[Message] = []
    instructions = _instructions(messages, parameters)
    if instructions:
        native.append(Message.system(instructions))
    native.extend(messages_to_native(messages))
    tools = [
        ToolDefinition(name=t.name, description=t.description or "", schema=dict(t.parameters_json_schema))
        for t in parameters.declared_tool_defs.values()
    ]
    choice = ToolChoice(mode=ToolChoiceMode.REQUIRED) if tools and not parameters.allow_text_output else None
    return ModelCall(
        messages=native, model=model, tools=tools, tool_choice=choice, params=settings_params(settings)
    )


def _instructions(messages: Sequence[ModelMessage], parameters: ModelRequestParameters) -> str | None:
    if parameters.instruction_parts is not None:
        return InstructionPart.join(parameters.instruction_parts) if parameters.instruction_parts else None
    for message in reversed(messages):  # a direct Model.request() call: the latest request's
        if isinstance(message, ModelRequest) and message.instructions is not None:
            return message.instructions
    return None


def settings_params(settings: ModelSettings | None) -> dict[str, str]:
    """The chat-completions params of pydantic-ai model settings (others are not sent)."""
    if not settings:
        return {}
    values: Mapping[str, Any] = settings  # a TypedDict: read it as the mapping it is
    body = {field: values[key] for key, field in _SETTINGS.items() if values.get(key) is not None}
    return chat.params_from_chat(body)


def messages_to_native(messages: Sequence[ModelMessage]) -> list[Message]:
    """pydantic-ai messages (as the agent prepared them for a model) as the contract's messages.

    Requests: a system prompt is a "system" message, a user prompt a "user" message, consecutive
    tool returns one "tool" message (the text the model reads of each). Responses: text, tool
    calls and thinking (as reasoning). Parts chat completions cannot carry (files, native tools)
    raise ConversionError naming the part."""
    out: list[Message] = []
    for index, message in enumerate(messages):
        if isinstance(message, ModelResponse):
            out.append(Message("assistant", [_response_part(p, index) for p in message.parts]))
            continue
        results: list[ToolResult] = []
        for part in message.parts:
            if isinstance(part, ToolReturnPart):
                results.append(_tool_return(part))
                continue
            if results:
                out.append(Message.tool(*results))
                results = []
            out.append(_request_part(part, index))
        if results:
            out.append(Message.tool(*results))
    return out


def _tool_return(part: ToolReturnPart) -> ToolResult:
    failed = part.outcome in ERROR_OUTCOMES or part.outcome == "denied"
    return ToolResult(id=part.tool_call_id, content=(TextPart(part.model_response_str()),), is_error=failed)


def _request_part(part: ModelRequestPart, index: int) -> Message:
    if isinstance(part, SystemPromptPart):
        return Message.system(part.content)
    if isinstance(part, UserPromptPart):
        if isinstance(part.content, str):
            return Message.user(part.content)
        texts: list[Part] = []
        for item in part.content:
            if isinstance(item, str):
                texts.append(TextPart(item))
            elif isinstance(item, TextContent):
                texts.append(TextPart(item.content))
            else:
                raise ConversionError(
                    f"message {index}: user content {type(item).__name__} is not supported by the host's "
                    "chat-completions model (text only)"
                )
        return Message("user", texts)
    raise ConversionError(f"message {index}: pydantic-ai request part {type(part).__name__} is not supported")


def _response_part(part: ModelResponsePart, index: int) -> Part:
    if isinstance(part, PaiTextPart):
        return TextPart(part.content)
    if isinstance(part, ToolCallPart):
        return ToolCall(id=part.tool_call_id, name=part.tool_name, args=part.args_as_dict())
    if isinstance(part, PaiThinkingPart):
        return ReasoningPart(
            provider=part.provider_name or chat.REASONING_PROVIDER, opaque=part.content.encode()
        )
    raise ConversionError(
        f"message {index}: pydantic-ai response part {type(part).__name__} is not supported"
    )


def model_response(result: ModelResult, *, model_name: str) -> ModelResponse:
    """The host's completion as a pydantic-ai response (tool call ids as the SDK settled them)."""
    parts: list[ModelResponsePart] = []
    for part in result.message.parts:
        if isinstance(part, TextPart):
            parts.append(PaiTextPart(part.text))
        elif isinstance(part, ToolCall):
            parts.append(ToolCallPart(part.name, dict(part.args), tool_call_id=part.id))
        elif isinstance(part, ReasoningPart) and part.opaque is not None:
            parts.append(PaiThinkingPart(part.opaque.decode("utf-8", "replace"), provider_name=part.provider))
    usage = result.usage
    return ModelResponse(
        parts=parts,
        usage=RequestUsage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
        if usage is not None
        else RequestUsage(),
        model_name=(usage.model if usage is not None and usage.model else model_name),
        provider_name=SYSTEM,
        finish_reason="tool_call" if result.tool_calls else "stop",
    )


def messages_from_native(messages: Sequence[Message]) -> list[ModelMessage]:
    """The contract's messages (a conversation rebuilt from the journal) as pydantic-ai history."""
    out: list[ModelMessage] = []
    pending: list[ModelRequestPart] = []
    names: dict[str, str] = {}
    for message in messages:
        if message.role == "assistant":
            if pending:
                out.append(ModelRequest(parts=pending))
                pending = []
            parts: list[ModelResponsePart] = []
            for part in message.parts:
                if isinstance(part, TextPart):
                    parts.append(PaiTextPart(part.text))
                elif isinstance(part, ToolCall):
                    names[part.id] = part.name
                    parts.append(ToolCallPart(part.name, dict(part.args), tool_call_id=part.id))
            out.append(ModelResponse(parts=parts, provider_name=SYSTEM))
        elif message.role == "tool":
            for result in message.tool_results:
                content: Any = error_text(result) if result.is_error else result_value(result)
                pending.append(
                    ToolReturnPart(
                        names.get(result.id, ""),
                        content,
                        tool_call_id=result.id,
                        outcome="failed" if result.is_error else "success",
                    )
                )
        elif message.role == "system":
            pending.append(SystemPromptPart(message.text()))
        else:
            pending.append(UserPromptPart(message.text()))
    if pending:
        out.append(ModelRequest(parts=pending))
    return out


# -- tools --------------------------------------------------------------------------------------------


@struct
class HostTools(AbstractCapability[Any]):
    """Routes every tool call of a run through the running execution (see the module docstring).

    Tools of the deferred kinds (``'external'``, ``'unapproved'``) are offered to the model as
    ordinary function tools, so pydantic-ai hands their calls to ``wrap_tool_execute`` too instead
    of ending the run with ``DeferredToolRequests``: the host is where they are deferred to."""

    routes: ToolRoutes = field(default_factory=ToolRoutes)
    _kinds: dict[str, str] = field(default_factory=dict, repr=False)

    async def prepare_tools(
        self, ctx: RunContext[Any], tool_defs: list[PaiToolDefinition]
    ) -> list[PaiToolDefinition]:
        prepared = []
        for tool_def in tool_defs:
            if tool_def.kind in ("external", "unapproved"):
                self._kinds[tool_def.name] = tool_def.kind
                tool_def = dataclasses.replace(tool_def, kind="function")
            prepared.append(tool_def)
        return prepared

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: PaiToolDefinition,
        args: dict[str, Any],
        handler: Any,
    ) -> Any:
        kind = self._kinds.get(call.tool_name, tool_def.kind)
        native = ToolCall(id=call.tool_call_id, name=call.tool_name, args=call.args_as_dict())

        async def run(_: dict[str, Any]) -> ToolResult:
            try:
                value = await handler(args)
            except ToolRetryError as exc:
                retry = exc.tool_retry
                text = (
                    retry.model_response_str(wrap_if_error=False)
                    if isinstance(retry, ToolReturnPart)
                    else str(retry.content)
                )
                return ToolResult(id=native.id, is_error=True, error=text, output=dict(RETRY_MARK))
            except ToolFailedError as exc:
                return ToolResult.failure(native.id, exc.tool_failed.model_response_str(wrap_if_error=False))
            return reported(native.id, value)

        result = await route(
            self.routes,
            native,
            run,
            approval=kind == "unapproved",
            external=kind == "external",
            where="pydantic-ai tool call",
        )
        if result.is_error:
            if result.output == RETRY_MARK:
                raise ModelRetry(result.error)
            raise ToolFailed(error_text(result))
        return result_value(result)


# -- the harness --------------------------------------------------------------------------------------


async def run_agent(
    agent: Agent[Any, Any],
    ex: Execution,
    *,
    routes: ToolRoutes | None = None,
    model: Model | None = None,
    stream: bool = False,
    **run_options: Any,
) -> Any:
    """Run ``agent`` as execution ``ex``: its history is the conversation the journal holds, its
    prompt the last input, its model the host (``model``, default :class:`HostModel`) and its
    tools routed by :class:`HostTools`. ``stream`` drives it through ``run_stream_events``.
    Returns the run's output; the completions are journaled as they happen."""
    conversation = ex.conversation()
    prompt: str | None = None
    if ex.inputs and conversation and conversation[-1].role == "user":
        prompt = conversation.pop().text()
    history = messages_from_native(conversation)
    capabilities = [HostTools(routes or ToolRoutes()), *run_options.pop("capabilities", ())]
    host_model = model if model is not None else _agent_host_model(agent)
    with running(ex):
        if stream:
            output: Any = None
            async with agent.run_stream_events(
                prompt, message_history=history, model=host_model, capabilities=capabilities, **run_options
            ) as events:
                async for event in events:
                    if isinstance(event, AgentRunResultEvent):
                        output = event.result.output
            return output
        result = await agent.run(
            prompt, message_history=history, model=host_model, capabilities=capabilities, **run_options
        )
        return result.output


def _agent_host_model(agent: Agent[Any, Any]) -> Model:
    current = agent.model
    return current if isinstance(current, HostModel) else HostModel()


class PydanticAIHarness(NativeHarness):
    """A pydantic-ai agent served as a harness: each execution is one agent run (:func:`run_agent`)."""

    def __init__(
        self,
        agent: Agent[Any, Any],
        descriptor: HarnessDescriptor,
        *,
        routes: ToolRoutes,
        stream: bool = False,
        run_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.agent = agent
        self.descriptor = descriptor
        self.routes = routes
        self.stream = stream
        self.run_options = dict(run_options or {})

    async def execute(self, ex: Execution) -> None:
        await run_agent(self.agent, ex, routes=self.routes, stream=self.stream, **self.run_options)


def wrap(
    agent: Agent[Any, Any],
    *,
    id: str,
    version: str,
    host_tools: Collection[str] = (),
    reasons: Mapping[str, Reason] | None = None,
    reason: Reason | None = None,
    models: Sequence[str] = (),
    stream: bool = False,
    run_options: Mapping[str, Any] | None = None,
) -> PydanticAIHarness:
    """``agent`` as a harness with this id and version (bump the version when a change would
    make recorded executions replay differently). ``host_tools``: tools the host runs;
    ``reasons``/``reason``: why an approval-gated call needs a decision; ``stream``: drive the
    agent through its streaming API; ``run_options``: more ``agent.run`` keyword arguments."""
    descriptor = HarnessDescriptor(
        id=id, version=version, models=tuple(models), fork_safe=True, streaming=stream
    )
    return PydanticAIHarness(
        agent,
        descriptor,
        routes=ToolRoutes.of(host_tools, reasons, reason),
        stream=stream,
        run_options=run_options,
    )


__all__ = [
    "HostModel",
    "HostTools",
    "PydanticAIHarness",
    "messages_from_native",
    "messages_to_native",
    "model_call",
    "model_response",
    "run_agent",
    "settings_params",
    "wrap",
]
