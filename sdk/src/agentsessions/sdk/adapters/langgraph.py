"""A LangGraph graph as an agentsessions harness (``pip install "agentsessions-sdk[langgraph]"``).

LangChain's and LangGraph's own extension points carry the graph's effects to the host:

- :class:`HostChatModel`, a LangChain ``BaseChatModel`` answered by the host (``ainvoke``,
  ``invoke`` from a worker thread, ``astream``; ``bind_tools`` as usual), so every model call is
  journaled and a replay sends nothing to a provider. Requests are built with LangChain's
  ``convert_to_openai_messages`` and handed to the host as a ``ModelCall``;
- :class:`HostToolNode`, a LangGraph ``ToolNode`` whose ``awrap_tool_call`` interceptor makes each
  tool call an execution effect: an ordinary tool runs in the harness and is reported (and is not
  run again on replay or Resume), a tool named in ``host_tools`` is run by the host, and a tool
  named in ``approval`` is a REQUIRES_APPROVAL call. That is LangGraph's human-in-the-loop
  interrupt before a tool, with the host as the one who interrupts: the host journals the request,
  parks the turn (the graph run unwinds, as at an ``interrupt()``), and after ``Approve`` the
  ``Resume`` re-runs the graph from the journal, where the gated call gets the host's receipt
  (the host runs an approved call in v1; a denial reaches the model as an error message).

:func:`wrap` builds the harness from a compiled graph whose state has a ``messages`` list::

    model = HostChatModel().bind_tools(tools)
    ...  # an ordinary StateGraph(MessagesState) with a model node and HostToolNode(tools, ...)
    harness = wrap(graph, id="my-agent", version="1")

The graph runs without a checkpointer of its own: the journal is the state. Each execution starts
the graph on the conversation the journal holds (``Execution.conversation``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from agentsessions.sdk import chat
from agentsessions.sdk.adapters.routing import (
    Reason,
    ToolRoutes,
    current_execution,
    error_text,
    execution_loop,
    reported,
    route,
    running,
)
from agentsessions.sdk.execution import Execution
from agentsessions.sdk.native import NativeHarness
from agentsessions.sdk.types import HarnessDescriptor, Message, ModelCall, ModelResult, ToolCall, ToolResult

SYSTEM = "agentsessions"
# How long a model call made from a worker thread (a sync node's ``invoke``) may wait for the
# execution's event loop to answer it: a bound, far above the host's own model timeouts.
THREAD_CALL_LIMIT_S = 3600.0
# LangChain chat-model keyword arguments that are chat-completions body fields.
_PARAMS = ("temperature", "top_p", "max_tokens", "seed", "presence_penalty", "frequency_penalty", "stop")


class HostChatModel(BaseChatModel):
    """A LangChain chat model answered by the agentsessions host of the running execution.

    ``model`` is the model id the host is asked for ("" lets the host use its configured model);
    ``temperature``, ``max_tokens`` (and the other sampling fields, also as call keyword
    arguments) become the call's params: journaled, hashed and sent by the host."""

    model: str = ""
    temperature: float | None = None
    max_tokens: int | None = None
    top_p: float | None = None
    seed: int | None = None

    @property
    def _llm_type(self) -> str:
        return SYSTEM

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        bound: dict[str, Any] = {"tools": [convert_to_openai_tool(t) for t in tools], **kwargs}
        if tool_choice is not None:
            bound["tool_choice"] = _tool_choice(tool_choice)
        return self.bind(**bound)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        result = await self._ask(messages, stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=ai_message(result, model=self.model))])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # A sync node runs in a worker thread: the model call goes to the execution's own loop.
        loop = execution_loop("HostChatModel.invoke")
        if _on_loop(loop):
            raise RuntimeError("HostChatModel.invoke was called on the event loop: use ainvoke there")
        future = asyncio.run_coroutine_threadsafe(self._ask(messages, stop, kwargs), loop)
        result = future.result(THREAD_CALL_LIMIT_S)
        return ChatResult(generations=[ChatGeneration(message=ai_message(result, model=self.model))])

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        # The host answers with one whole completion (one OUTPUT record); the stream is that.
        result = await self._ask(messages, stop, kwargs)
        message = ai_message(result, model=self.model)
        chunk = AIMessageChunk(
            content=message.content,
            tool_call_chunks=[
                {
                    "name": c["name"],
                    "args": json.dumps(c["args"]),
                    "id": c["id"],
                    "index": i,
                    "type": "tool_call_chunk",
                }
                for i, c in enumerate(message.tool_calls)
            ],
            usage_metadata=message.usage_metadata,
            response_metadata=message.response_metadata,
        )
        if run_manager is not None and isinstance(chunk.content, str) and chunk.content:
            await run_manager.on_llm_new_token(chunk.content, chunk=ChatGenerationChunk(message=chunk))
        yield ChatGenerationChunk(message=chunk)

    async def _ask(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: Mapping[str, Any]
    ) -> ModelResult:
        ex = current_execution("HostChatModel")
        return await ex.model(self.model_call(messages, stop=stop, **kwargs))

    def model_call(
        self, messages: Sequence[BaseMessage], *, stop: list[str] | None = None, **kwargs: Any
    ) -> ModelCall:
        """The ModelCall this model makes for ``messages`` (with bound tools and settings)."""
        body: dict[str, Any] = {"model": self.model, "messages": convert_to_openai_messages(list(messages))}
        if kwargs.get("tools"):
            body["tools"] = list(kwargs["tools"])
        if kwargs.get("tool_choice") is not None:
            body["tool_choice"] = kwargs["tool_choice"]
        for name in _PARAMS:
            value = kwargs.get(name, getattr(self, name, None))
            if value is not None:
                body[name] = value
        if stop:
            body["stop"] = list(stop)
        return chat.model_call_from_chat(body)


def _tool_choice(choice: str) -> str | dict[str, Any]:
    if choice in ("auto", "none", "required"):
        return choice
    if choice == "any":
        return "required"
    return {"type": "function", "function": {"name": choice}}


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def ai_message(result: ModelResult, *, model: str = "") -> AIMessage:
    """The host's completion as a LangChain AIMessage (tool call ids as the SDK settled them)."""
    usage = result.usage
    metadata = (
        UsageMetadata(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            total_tokens=usage.input_tokens + usage.output_tokens,
        )
        if usage is not None
        else None
    )
    return AIMessage(
        content=result.text(),
        tool_calls=[
            {"name": c.name, "args": dict(c.args), "id": c.id, "type": "tool_call"} for c in result.tool_calls
        ],
        usage_metadata=metadata,
        response_metadata={
            "model_name": (usage.model if usage is not None and usage.model else model or SYSTEM)
        },
    )


def langchain_messages(messages: Sequence[Message]) -> list[AnyMessage]:
    """The contract's messages (a conversation rebuilt from the journal) as LangChain messages."""
    out: list[AnyMessage] = []
    names: dict[str, str] = {}
    for message in messages:
        if message.role == "assistant":
            calls = message.tool_calls
            names.update({c.id: c.name for c in calls})
            out.append(
                AIMessage(
                    content=message.text(),
                    tool_calls=[
                        {"name": c.name, "args": dict(c.args), "id": c.id, "type": "tool_call"} for c in calls
                    ],
                )
            )
        elif message.role == "tool":
            out.extend(_tool_message(r, names.get(r.id, "")) for r in message.tool_results)
        elif message.role == "system":
            out.append(SystemMessage(content=message.text()))
        else:
            out.append(HumanMessage(content=message.text()))
    return out


def _tool_message(result: ToolResult, name: str) -> ToolMessage:
    """The ToolMessage the model gets for ``result``: the same text on every run."""
    if result.is_error:
        return ToolMessage(content=error_text(result), tool_call_id=result.id, name=name, status="error")
    return ToolMessage(content=chat.tool_result_text(result), tool_call_id=result.id, name=name)


# -- tools --------------------------------------------------------------------------------------------


def host_tool_calls(
    routes: ToolRoutes, approval: Collection[str] = ()
) -> Callable[
    [ToolCallRequest, Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]],
    Awaitable[ToolMessage],
]:
    """A ``ToolNode`` ``awrap_tool_call`` interceptor routing each call through the execution."""
    gated = frozenset(approval)

    async def intercept(
        request: ToolCallRequest, execute: Callable[[ToolCallRequest], Awaitable[ToolMessage | Command[Any]]]
    ) -> ToolMessage:
        raw = request.tool_call
        call = ToolCall(id=raw["id"] or "", name=raw["name"], args=dict(raw["args"]))

        async def run(_: dict[str, Any]) -> ToolResult:
            answer = await execute(request)
            if not isinstance(answer, ToolMessage):
                raise TypeError(
                    f"tool {call.name!r} returned a {type(answer).__name__}; a routed tool returns a message"
                )
            if answer.status == "error":
                return ToolResult.failure(call.id, answer.text)
            return reported(call.id, answer.content)

        result = await route(routes, call, run, approval=call.name in gated, where="LangGraph tool call")
        return _tool_message(result, call.name)

    return intercept


class HostToolNode(ToolNode):
    """A LangGraph ``ToolNode`` whose calls are execution effects (see the module docstring):
    ``host_tools`` run on the host, ``approval`` tools are gated by a person and run on the host
    after approval (``reasons``/``reason``: why), the others run here and are reported.

    A host-run or approval-gated tool still needs its LangChain declaration (name, description,
    argument schema) for the model; its body does not run in the harness."""

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        host_tools: Collection[str] = (),
        approval: Collection[str] = (),
        reasons: Mapping[str, Reason] | None = None,
        reason: Reason | None = None,
        name: str = "tools",
        messages_key: str = "messages",
    ) -> None:
        routes = ToolRoutes.of(host_tools, reasons, reason)
        super().__init__(
            tools, name=name, messages_key=messages_key, awrap_tool_call=host_tool_calls(routes, approval)
        )


# -- the harness --------------------------------------------------------------------------------------


async def run_graph(
    graph: Any,
    ex: Execution,
    *,
    stream: bool = False,
    messages_key: str = "messages",
    config: Mapping[str, Any] | None = None,
) -> Any:
    """Run the compiled ``graph`` as execution ``ex``, starting from the conversation the journal
    holds under ``messages_key``. ``stream`` drives it through ``astream`` (values and messages).
    Returns the final state."""
    state = {messages_key: langchain_messages(ex.conversation())}
    options = dict(config or {})
    with running(ex):
        if stream:
            final: Any = None
            async for mode, chunk in graph.astream(state, options, stream_mode=["values", "messages"]):
                if mode == "values":
                    final = chunk
            return final
        return await graph.ainvoke(state, options)


class LangGraphHarness(NativeHarness):
    """A compiled LangGraph graph served as a harness: each execution is one graph run."""

    def __init__(
        self,
        graph: Any,
        descriptor: HarnessDescriptor,
        *,
        stream: bool = False,
        messages_key: str = "messages",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.graph = graph
        self.descriptor = descriptor
        self.stream = stream
        self.messages_key = messages_key
        self.config = dict(config or {})

    async def execute(self, ex: Execution) -> None:
        await run_graph(
            self.graph, ex, stream=self.stream, messages_key=self.messages_key, config=self.config
        )


def wrap(
    graph: Any,
    *,
    id: str,
    version: str,
    models: Sequence[str] = (),
    stream: bool = False,
    messages_key: str = "messages",
    config: Mapping[str, Any] | None = None,
) -> LangGraphHarness:
    """The compiled ``graph`` as a harness with this id and version (bump the version when a
    change would make recorded executions replay differently). Its model is a
    :class:`HostChatModel`, its tools a :class:`HostToolNode`; ``stream`` drives it through
    ``astream``; ``config`` is the run's ``RunnableConfig`` (a recursion limit, say)."""
    descriptor = HarnessDescriptor(
        id=id, version=version, models=tuple(models), fork_safe=True, streaming=stream
    )
    return LangGraphHarness(graph, descriptor, stream=stream, messages_key=messages_key, config=config)


__all__ = [
    "HostChatModel",
    "HostToolNode",
    "LangGraphHarness",
    "ai_message",
    "host_tool_calls",
    "langchain_messages",
    "run_graph",
    "wrap",
]
