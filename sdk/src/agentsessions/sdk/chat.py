"""Chat-completions (the OpenAI-compatible wire format) <-> the contract's native values, in both
directions, in one place: the host's OpenAI-compatible provider speaks to its endpoint with these
functions, and a framework adapter uses the same ones to hand the host what its framework built.

Towards chat completions: text parts are concatenated, reasoning parts are dropped (journaled
provider state, not input), tool calls become ``tool_calls`` and each tool result its own role
"tool" message; file and data parts are refused with :class:`ConversionError`, because sending
less than the harness built would make the journal describe a call that never happened. From
chat completions: ``reasoning_content`` becomes a ``ReasoningPart(provider="openai")``, tool calls
become :class:`ToolCall` parts (arguments parsed, JSON integers kept as ``int``), usage becomes
:class:`Usage`.

``ModelCall.params`` convention: every request body field other than ``model``, ``messages``,
``tools``, ``tool_choice``, ``stream`` and ``stream_options`` is a param named as the field, whose
value is the field's JSON text (``{"temperature": "0.2", "max_tokens": "256"}``);
:func:`params_from_chat` and :func:`chat_params` convert between the two.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field
from typing import Any

from agentsessions.sdk.convert import ConversionError, check_json
from agentsessions.sdk.structs import struct
from agentsessions.sdk.types import (
    DataPart,
    FilePart,
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
    Usage,
)

JSON = dict[str, Any]

# Request body fields that are not provider params.
REQUEST_FIELDS = frozenset({"model", "messages", "tools", "tool_choice", "stream", "stream_options"})
_MODES_TO_CHAT = {
    ToolChoiceMode.AUTO: "auto",
    ToolChoiceMode.NONE: "none",
    ToolChoiceMode.REQUIRED: "required",
}
_MODES_FROM_CHAT = {name: mode for mode, name in _MODES_TO_CHAT.items()}
# Roles a chat request may use for instructions; the contract has one, "system".
_SYSTEM_ROLES = frozenset({"system", "developer"})
REASONING_PROVIDER = "openai"


def _json_text(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


# -- requests: native -> chat ------------------------------------------------------------------------


def chat_request(call: ModelCall, *, model: str, stream: bool = False) -> JSON:
    """The chat-completions request body for ``call`` (``model`` is the provider's model id).

    ``call.params`` are not included: :func:`chat_params` gives them as body fields for a provider
    that sends them."""
    body: JSON = {"model": model, "messages": chat_messages(call.messages)}
    if call.tools:
        body["tools"] = chat_tools(call.tools)
    if call.tool_choice is not None:
        choice = chat_tool_choice(call.tool_choice)
        if choice is not None:
            body["tool_choice"] = choice
    if stream:
        body["stream"] = True
        # Without this a streamed completion ends with no token accounting.
        body["stream_options"] = {"include_usage": True}
    return body


def chat_messages(messages: Sequence[Message]) -> list[JSON]:
    """Messages as chat messages; tool results become separate role "tool" messages."""
    out: list[JSON] = []
    for index, message in enumerate(messages):
        role = message.role or "user"
        text: list[str] = []
        tool_calls: list[JSON] = []
        tool_messages: list[JSON] = []
        for part_index, part in enumerate(message.parts):
            if isinstance(part, TextPart):
                text.append(part.text)
            elif isinstance(part, ReasoningPart):
                continue  # journaled provider state, not input this format accepts
            elif isinstance(part, ToolCall):
                tool_calls.append(chat_tool_call(part))
            elif isinstance(part, ToolResult):
                tool_messages.append(
                    {"role": "tool", "tool_call_id": part.id, "content": tool_result_text(part)}
                )
            else:
                raise ConversionError(
                    f"message {index} part {part_index}: {_part_kind(part)} parts are not supported "
                    "by chat completions"
                )
        if text or tool_calls or not tool_messages:
            chat: JSON = {"role": role, "content": "".join(text)}
            if tool_calls:
                chat["tool_calls"] = tool_calls
                if not text:
                    chat["content"] = None
            out.append(chat)
        out.extend(tool_messages)
    return out


def _part_kind(part: Part) -> str:
    if isinstance(part, FilePart):
        return "file"
    if isinstance(part, DataPart):
        return "data"
    return type(part).__name__


def chat_tool_call(call: ToolCall) -> JSON:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": _json_text(call.args)},
    }


def tool_result_text(result: ToolResult) -> str:
    """What a model reads of a tool result: its text content, else its output as JSON, else its
    error, else its output URI."""
    texts: list[str] = []
    for part in result.content:
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif not isinstance(part, ReasoningPart):
            raise ConversionError(
                f"tool result {result.id!r}: {_part_kind(part)} content parts are not supported "
                "by chat completions"
            )
    if texts:
        return "".join(texts)
    if result.output is not None:
        return _json_text(result.output)
    if result.error:
        return result.error
    return result.output_uri


def chat_tools(tools: Iterable[ToolDefinition]) -> list[JSON]:
    out: list[JSON] = []
    for tool in tools:
        function: JSON = {"name": tool.name}
        if tool.description:
            function["description"] = tool.description
        function["parameters"] = (
            tool.schema if tool.schema is not None else {"type": "object", "properties": {}}
        )
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: ToolChoice) -> JSON | str | None:
    """The ``tool_choice`` field for ``choice`` (None: leave it out, the provider's default)."""
    if choice.name:
        return {"type": "function", "function": {"name": choice.name}}
    return _MODES_TO_CHAT.get(choice.mode)


def chat_params(params: Mapping[str, str]) -> JSON:
    """``ModelCall.params`` as request body fields, in key order (deterministic request bodies).

    Known parameters get their type: ``temperature``, ``top_p``, ``presence_penalty`` and
    ``frequency_penalty`` finite numbers; ``max_tokens``, ``max_completion_tokens``, ``seed``, ``n``
    and ``top_logprobs`` integers; ``logprobs``, ``parallel_tool_calls`` and ``store`` booleans
    (``true``/``false``); ``response_format``, ``logit_bias`` and ``metadata`` JSON objects; ``stop``
    a string or a JSON list of strings. Any other value is sent as the JSON its text spells, else as
    the string itself, so provider-specific options pass through. A wrong type, or a field the
    request sets itself, raises :class:`ConversionError` naming the parameter, before anything is sent.
    """
    return {key: _param_value(key, params[key]) for key in sorted(params)}


_NUMBER_PARAMS = frozenset({"temperature", "top_p", "presence_penalty", "frequency_penalty"})
_INTEGER_PARAMS = frozenset({"max_tokens", "max_completion_tokens", "seed", "n", "top_logprobs"})
_BOOLEAN_PARAMS = frozenset({"logprobs", "parallel_tool_calls", "store"})
_OBJECT_PARAMS = frozenset({"response_format", "logit_bias", "metadata"})
_NOT_JSON: Any = object()


def _param_value(key: str, text: str) -> Any:
    if key in REQUEST_FIELDS:
        raise ConversionError(f"params.{key}: {key} is part of the request itself, not a param")
    if key in _NUMBER_PARAMS:
        try:
            number = float(text)
        except ValueError:
            raise ConversionError(f"params.{key}: {text!r} is not a number") from None
        if not math.isfinite(number):
            raise ConversionError(f"params.{key}: {text!r} is not a finite number")
        return number
    if key in _INTEGER_PARAMS:
        try:
            return int(text)
        except ValueError:
            raise ConversionError(f"params.{key}: {text!r} is not an integer") from None
    if key in _BOOLEAN_PARAMS:
        if text not in ("true", "false"):
            raise ConversionError(f"params.{key}: {text!r} is not true or false")
        return text == "true"
    decoded = _param_json(text)
    if key in _OBJECT_PARAMS:
        if not isinstance(decoded, dict):
            raise ConversionError(f"params.{key}: {text!r} is not a JSON object")
        return decoded
    if key == "stop":
        if not text.lstrip().startswith("["):
            return text
        if isinstance(decoded, list) and all(isinstance(item, str) for item in decoded):
            return decoded
        raise ConversionError(f"params.stop: {text!r} is neither a string nor a JSON list of strings")
    return text if decoded is _NOT_JSON else decoded


def _no_json_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity are not valid request values


def _param_json(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_json_constants)
    except ValueError:
        return _NOT_JSON


# -- requests: chat -> native ---------------------------------------------------------------------


def model_call_from_chat(body: Mapping[str, Any]) -> ModelCall:
    """The ModelCall a chat-completions request body describes (what an adapter hands the host)."""
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list):
        raise ConversionError("request messages: expected a list of chat messages")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise ConversionError("request tools: expected a list")
    choice = body.get("tool_choice")
    model = body.get("model") or ""
    if not isinstance(model, str):
        raise ConversionError("request model: expected a string")
    return ModelCall(
        messages=tuple(messages_from_chat(raw_messages)),
        model=model,
        tools=tuple(tools_from_chat(tools)),
        tool_choice=tool_choice_from_chat(choice) if choice is not None else None,
        params=params_from_chat(body),
    )


def params_from_chat(body: Mapping[str, Any]) -> dict[str, str]:
    """The provider params of a request body (see the module's convention)."""
    params: dict[str, str] = {}
    for key, value in body.items():
        if key in REQUEST_FIELDS or value is None:
            continue
        check_json(value, f"request {key}")
        params[key] = _json_text(value)
    return params


def messages_from_chat(messages: Iterable[Mapping[str, Any]]) -> list[Message]:
    """Chat messages as contract messages (one per chat message; "developer" becomes "system")."""
    out: list[Message] = []
    for index, raw in enumerate(messages):
        if not isinstance(raw, Mapping):
            raise ConversionError(f"message {index}: expected an object")
        role = raw.get("role")
        if not isinstance(role, str) or not role:
            raise ConversionError(f"message {index}: role must be a non-empty string")
        where = f"message {index}"
        if role == "tool":
            call_id = raw.get("tool_call_id")
            if not isinstance(call_id, str):
                raise ConversionError(f"{where}: a tool message needs a tool_call_id string")
            answer = _content_parts(raw.get("content"), where)
            out.append(Message("tool", (ToolResult(id=call_id, content=tuple(answer)),)))
            continue
        parts: list[Part] = []
        reasoning = raw.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            parts.append(ReasoningPart(provider=REASONING_PROVIDER, opaque=reasoning.encode()))
        parts.extend(_content_parts(raw.get("content"), where))
        for position, call in enumerate(raw.get("tool_calls") or []):
            parts.append(_tool_call_from_chat(call, f"{where} tool call {position}"))
        out.append(Message("system" if role in _SYSTEM_ROLES else role, tuple(parts)))
    return out


def _content_parts(content: object, where: str) -> list[Part]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [TextPart(content)]
    if not isinstance(content, list):
        raise ConversionError(f"{where}: content must be a string or a list of content parts")
    parts: list[Part] = []
    for index, item in enumerate(content):
        kind = item.get("type") if isinstance(item, Mapping) else None
        if kind == "text" and isinstance(item.get("text"), str):
            parts.append(TextPart(item["text"]))
        elif kind == "refusal" and isinstance(item.get("refusal"), str):
            parts.append(TextPart(item["refusal"]))
        else:
            raise ConversionError(f"{where} content {index}: {kind or 'untyped'} content is not supported")
    return parts


def _tool_call_from_chat(raw: object, where: str) -> ToolCall:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("function"), Mapping):
        raise ConversionError(f"{where} has no function")
    function = raw["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ConversionError(f"{where} has no function name")
    call_id = raw.get("id") or ""
    if not isinstance(call_id, str):
        raise ConversionError(f"{where} id is not a string")
    return ToolCall(id=call_id, name=name, args=parse_arguments(function.get("arguments") or "", name))


def parse_arguments(arguments: object, name: str) -> dict[str, Any]:
    """A tool call's ``arguments`` (a JSON string, or an object some servers send) as a dict."""
    if isinstance(arguments, Mapping):
        decoded: object = dict(arguments)
    elif isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ConversionError(f"tool call {name!r} arguments are not JSON: {exc}") from None
    else:
        raise ConversionError(f"tool call {name!r} arguments are not a JSON string")
    if not isinstance(decoded, dict):
        raise ConversionError(f"tool call {name!r} arguments are not a JSON object")
    check_json(decoded, f"tool call {name!r} arguments")
    return decoded


def tools_from_chat(tools: Iterable[Mapping[str, Any]]) -> list[ToolDefinition]:
    out: list[ToolDefinition] = []
    for index, raw in enumerate(tools):
        function = raw.get("function") if isinstance(raw, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ConversionError(
                f"tool {index}: expected {{'type': 'function', 'function': {{'name': ...}}}}"
            )
        schema = function.get("parameters")
        if schema is not None and not isinstance(schema, dict):
            raise ConversionError(f"tool {index} parameters: expected a JSON Schema object")
        description = function.get("description") or ""
        out.append(ToolDefinition(name=function["name"], description=str(description), schema=schema))
    return out


def tool_choice_from_chat(choice: object) -> ToolChoice:
    if isinstance(choice, str) and choice in _MODES_FROM_CHAT:
        return ToolChoice(mode=_MODES_FROM_CHAT[choice])
    if isinstance(choice, Mapping):
        function = choice.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            return ToolChoice(mode=ToolChoiceMode.REQUIRED, name=function["name"])
    raise ConversionError(f"tool_choice {choice!r}: expected auto, none, required or a function")


# -- completions: chat -> native --------------------------------------------------------------------


def model_result_from_chat(body: Mapping[str, Any], *, model: str) -> ModelResult:
    """The ModelResult of a (non-streamed) chat-completions response."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        raise ConversionError("response has no choices")
    message = choices[0].get("message")
    if not isinstance(message, Mapping):
        raise ConversionError("response choice has no message")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ConversionError("response tool_calls is not a list")
    tool_calls = [_tool_call_from_chat(raw, f"response tool call {i}") for i, raw in enumerate(calls)]
    usage = body.get("usage")
    return ModelResult(
        message=assistant_message(
            model,
            reasoning=_text_field(message, "reasoning_content"),
            text=_text_field(message, "content"),
            tool_calls=tool_calls,
        ),
        usage=usage_from_chat(usage, model=model) if isinstance(usage, Mapping) else None,
    )


def assistant_message(model: str, *, reasoning: str, text: str, tool_calls: Sequence[ToolCall]) -> Message:
    """A completion's message: reasoning first, then text, then tool calls."""
    parts: list[Part] = []
    if reasoning:
        parts.append(ReasoningPart(provider=REASONING_PROVIDER, model_id=model, opaque=reasoning.encode()))
    if text:
        parts.append(TextPart(text))
    parts.extend(tool_calls)
    return Message("assistant", tuple(parts))


def _text_field(body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConversionError(f"response {name} is not a string")
    return value


def usage_from_chat(raw: Mapping[str, Any], *, model: str) -> Usage:
    details = raw.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, Mapping) else 0
    return Usage(
        model=model,
        input_tokens=_int(raw.get("prompt_tokens")),
        output_tokens=_int(raw.get("completion_tokens")),
        reasoning_tokens=_int(reasoning),
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@struct
class _PendingToolCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@struct
class ChatCompletionStream:
    """Accumulates a streamed chat completion chunk by chunk (``chat.completion.chunk`` objects)."""

    model: str
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, _PendingToolCall] = field(default_factory=dict)
    usage: Usage | None = None

    def absorb(self, chunk: Mapping[str, Any]) -> str:
        """Take one chunk; returns its new text (for a delta callback)."""
        error = chunk.get("error")
        if isinstance(error, Mapping):
            raise ConversionError(f"stream error: {error.get('message', 'unknown')}")
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self.usage = usage_from_chat(usage, model=self.model)
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            return ""  # usage-only chunks carry no choice
        delta = choices[0].get("delta")
        if not isinstance(delta, Mapping):
            return ""
        self.reasoning.append(_text_field(delta, "reasoning_content"))
        for raw in delta.get("tool_calls") or []:
            self._absorb_tool_call(raw)
        text = _text_field(delta, "content")
        self.text.append(text)
        return text

    def _absorb_tool_call(self, raw: object) -> None:
        if not isinstance(raw, Mapping):
            raise ConversionError("stream tool call delta is not an object")
        index = raw.get("index", 0)
        if not isinstance(index, int):
            raise ConversionError("stream tool call index is not an integer")
        pending = self.tool_calls.setdefault(index, _PendingToolCall())
        if isinstance(raw.get("id"), str) and raw["id"]:
            pending.call_id = raw["id"]
        function = raw.get("function")
        if isinstance(function, Mapping):
            if isinstance(function.get("name"), str) and function["name"]:
                pending.name = function["name"]
            if isinstance(function.get("arguments"), str):
                pending.arguments.append(function["arguments"])

    def result(self) -> ModelResult:
        calls = []
        for index in sorted(self.tool_calls):
            pending = self.tool_calls[index]
            if not pending.name:
                raise ConversionError(f"streamed tool call {index} has no function name")
            args = parse_arguments("".join(pending.arguments), pending.name)
            calls.append(ToolCall(id=pending.call_id, name=pending.name, args=args))
        message = assistant_message(
            self.model, reasoning="".join(self.reasoning), text="".join(self.text), tool_calls=calls
        )
        return ModelResult(message=message, usage=self.usage)


# -- completions: native -> chat (what an adapter hands its framework) --------------------------------


def chat_completion(result: ModelResult, *, model: str, id: str = "", created: int = 0) -> JSON:
    """``result`` as a ``chat.completion`` response object."""
    message: JSON = {"role": "assistant", "content": result.message.text() or None}
    reasoning = _reasoning_text(result.message)
    if reasoning:
        message["reasoning_content"] = reasoning
    calls = result.message.tool_calls
    if calls:
        message["tool_calls"] = [chat_tool_call(call) for call in calls]
    body: JSON = {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
    }
    if result.usage is not None:
        body["usage"] = chat_usage(result.usage)
    return body


def chat_completion_chunks(result: ModelResult, *, model: str, id: str = "", created: int = 0) -> list[JSON]:
    """``result`` as the ``chat.completion.chunk`` objects of a stream (text in one chunk, one
    chunk per tool call, then the finish reason, then usage when known)."""

    def chunk(delta: JSON, finish: str | None = None) -> JSON:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [choice],
        }

    first: JSON = {"role": "assistant"}
    reasoning = _reasoning_text(result.message)
    if reasoning:
        first["reasoning_content"] = reasoning
    text = result.message.text()
    if text:
        first["content"] = text
    chunks = [chunk(first)]
    calls = result.message.tool_calls
    for index, call in enumerate(calls):
        chunks.append(chunk({"tool_calls": [{"index": index, **chat_tool_call(call)}]}))
    chunks.append(chunk({}, "tool_calls" if calls else "stop"))
    if result.usage is not None:
        chunks.append(
            {
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": chat_usage(result.usage),
            }
        )
    return chunks


def chat_usage(usage: Usage) -> JSON:
    out: JSON = {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }
    if usage.reasoning_tokens:
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return out


def _reasoning_text(message: Message) -> str:
    texts = []
    for part in message.parts:
        if (
            isinstance(part, ReasoningPart)
            and part.provider == REASONING_PROVIDER
            and part.opaque is not None
        ):
            texts.append(part.opaque.decode("utf-8", "replace"))
    return "".join(texts)
