"""A provider for OpenAI-compatible chat-completions endpoints, spoken directly over httpx.

The request body is ``{model, messages, tools, tool_choice, stream}``. Outbound, text parts are
concatenated, reasoning parts are dropped (they are journaled provider state, not input) and
file or data parts are refused: silently sending less than the harness built would make the
journal describe a call that never happened. Inbound, ``reasoning_content`` becomes a
``ReasoningPart{provider: "openai"}``, tool calls become ToolCall parts and usage is returned.
``ModelCall.params`` are sent as typed request fields (``models.params``); requests are retried
on 429, 5xx and connection errors within timeouts (``models.transport``).

The API key comes only from the environment (``MODEL_API_KEY``, else ``OPENAI_API_KEY``), never
from arguments or config, so it never lands in argv or the journal.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from google.protobuf import json_format, struct_pb2

from agentsessions.host.models.params import request_params
from agentsessions.host.models.provider import DeltaCallback, ModelError
from agentsessions.host.models.transport import ChatTransport, RetryPolicy, Timeouts
from agentsessions.v1 import common_pb2, harness_pb2

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_PATH = "/chat/completions"
DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
KEY_ENV_VARS = ("MODEL_API_KEY", "OPENAI_API_KEY")
# Request models that mean "whatever this provider is configured with" (echo is the sample harnesses' id).
_DEFAULT_MODEL_ALIASES = frozenset({"", "echo"})
_TOOL_CHOICE_MODES = {
    common_pb2.ToolChoice.MODE_AUTO: "auto",
    common_pb2.ToolChoice.MODE_NONE: "none",
    common_pb2.ToolChoice.MODE_REQUIRED: "required",
}

JSON = dict[str, Any]


def api_key_from_env(environ: Mapping[str, str] | None = None) -> str:
    """The provider key from the environment ("" when none is set)."""
    env = os.environ if environ is None else environ
    for name in KEY_ENV_VARS:
        value = env.get(name, "")
        if value:
            return value
    return ""


class OpenAIModel:
    """Chat completions at ``base_url + path`` for ``model`` (used when a call names "" or "echo").

    ``auth_header`` "Authorization" sends ``Bearer <key>``, any other header sends the raw key,
    and "" (or no key in the environment) sends none. ``timeout`` bounds a whole completion,
    retries included; ``connect_timeout`` and ``read_timeout`` bound connecting and each read;
    ``retry`` says how a request that got 429, 5xx or no answer is retried.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str = DEFAULT_BASE_URL,
        path: str = DEFAULT_PATH,
        auth_header: str = "Authorization",
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        stream: bool = True,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not model:
            raise ValueError("a default model is required: it is recorded on every model call")
        if max_response_bytes <= 0:
            raise ValueError(f"max_response_bytes must be positive, got {max_response_bytes}")
        self.model = model
        if not path.startswith("/"):
            path = "/" + path
        self.url = base_url.rstrip("/") + path
        self._timeout = timeout
        self._transport = ChatTransport(
            timeouts=Timeouts(connect=connect_timeout, read=read_timeout, total=timeout), retry=retry
        )
        self._max_response_bytes = max_response_bytes
        self._stream = stream
        self._headers = {"Content-Type": "application/json"}
        key = api_key_from_env()
        if auth_header and key:
            self._headers[auth_header] = f"Bearer {key}" if auth_header.lower() == "authorization" else key

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        model = self.model if call.model in _DEFAULT_MODEL_ALIASES else call.model
        stream = self._stream and on_delta is not None
        body = build_request(call, model, stream=stream)
        body.update(request_params(call.params))
        try:
            async with asyncio.timeout(self._timeout):
                return await self._post(model, body, on_delta if stream else None)
        except TimeoutError:
            raise ModelError(f"model {model}: no completion within {self._timeout} s") from None
        except httpx.HTTPError as exc:
            raise ModelError(
                f"model {model}: request to {self.url} failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def aclose(self) -> None:
        await self._transport.aclose()

    async def _post(self, model: str, body: JSON, on_delta: DeltaCallback | None) -> harness_pb2.ModelResult:
        payload = json.dumps(body).encode()
        headers = {
            **self._headers,
            "Accept": "text/event-stream" if on_delta is not None else "application/json",
        }
        async with self._transport.post(self.url, payload, headers, model=model) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > self._max_response_bytes:
                raise self._too_large(model)
            if response.status_code != 200:
                raw = await self._read_capped(response, model, limit=64 * 1024, truncate=True)
                raise ModelError(_status_message(model, response.status_code, raw))
            content_type = response.headers.get("content-type", "")
            if on_delta is not None and content_type.startswith("text/event-stream"):
                return await self._read_stream(model, response, on_delta)
            raw = await self._read_capped(response, model, limit=self._max_response_bytes)
        return parse_response(model, _decode_json(model, raw))

    async def _read_capped(
        self, response: httpx.Response, model: str, *, limit: int, truncate: bool = False
    ) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > limit:
                if truncate:
                    chunks.append(chunk[: limit - (size - len(chunk))])
                    break
                raise self._too_large(model)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _read_stream(
        self, model: str, response: httpx.Response, on_delta: DeltaCallback
    ) -> harness_pb2.ModelResult:
        completion = _StreamedCompletion()
        async for payload in self._sse_payloads(response, model):
            chunk = _decode_json(model, payload)
            delta_text = completion.absorb(model, chunk)
            if delta_text:
                await on_delta(delta_text)
        return completion.result(model)

    async def _sse_payloads(self, response: httpx.Response, model: str) -> AsyncIterator[bytes]:
        """The data payloads of a server-sent event stream, up to ``[DONE]``."""
        buffer = b""
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > self._max_response_bytes:
                raise self._too_large(model)
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                payload = _sse_data(line)
                if payload is None:
                    continue
                if payload == b"[DONE]":
                    return
                yield payload
        payload = _sse_data(buffer)
        if payload is not None and payload != b"[DONE]":
            yield payload

    def _too_large(self, model: str) -> ModelError:
        return ModelError(f"model {model}: response exceeds the {self._max_response_bytes} byte limit")


def build_request(call: common_pb2.ModelCall, model: str, *, stream: bool) -> JSON:
    """The chat-completions request body for a ModelCall."""
    body: JSON = {"model": model, "messages": chat_messages(call.messages)}
    if call.tools:
        body["tools"] = [_tool_definition(tool) for tool in call.tools]
    if call.HasField("tool_choice"):
        choice = _tool_choice(call.tool_choice)
        if choice is not None:
            body["tool_choice"] = choice
    if stream:
        body["stream"] = True
        # Without this a streamed completion ends with no token accounting.
        body["stream_options"] = {"include_usage": True}
    return body


def chat_messages(messages: Sequence[common_pb2.Message]) -> list[JSON]:
    """Wire messages as chat messages; tool results become separate role "tool" messages."""
    out: list[JSON] = []
    for index, message in enumerate(messages):
        role = message.role or "user"
        text: list[str] = []
        tool_calls: list[JSON] = []
        tool_messages: list[JSON] = []
        for part_index, part in enumerate(message.parts):
            kind = part.WhichOneof("part")
            if kind == "text":
                text.append(part.text.text)
            elif kind == "reasoning":
                continue  # journaled provider state, not input this endpoint accepts
            elif kind == "tool_call":
                tool_calls.append(_chat_tool_call(part.tool_call))
            elif kind == "tool_result":
                tool_messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": part.tool_result.id,
                        "content": _tool_result_text(part.tool_result),
                    }
                )
            else:
                raise ModelError(
                    f"message {index} part {part_index}: {kind or 'empty'} parts are not supported "
                    "by the OpenAI-compatible provider"
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


def _chat_tool_call(call: common_pb2.ToolCall) -> JSON:
    arguments = _struct_json(call.args) if call.HasField("args") else "{}"
    return {"id": call.id, "type": "function", "function": {"name": call.tool, "arguments": arguments}}


def _tool_result_text(result: common_pb2.ToolResult) -> str:
    texts: list[str] = []
    for part in result.content:
        kind = part.WhichOneof("part")
        if kind == "text":
            texts.append(part.text.text)
        elif kind != "reasoning":
            raise ModelError(
                f"tool result {result.id!r}: {kind or 'empty'} content parts are not supported "
                "by the OpenAI-compatible provider"
            )
    if texts:
        return "".join(texts)
    if result.HasField("output"):
        return _struct_json(result.output)
    if result.error:
        return result.error
    return result.output_uri


def _struct_json(value: struct_pb2.Struct) -> str:
    return json.dumps(json_format.MessageToDict(value), separators=(",", ":"), sort_keys=True)


def _tool_definition(tool: common_pb2.ToolDefinition) -> JSON:
    function: JSON = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    if tool.HasField("input_schema"):
        function["parameters"] = json_format.MessageToDict(tool.input_schema)
    else:
        function["parameters"] = {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


def _tool_choice(choice: common_pb2.ToolChoice) -> JSON | str | None:
    if choice.name:
        return {"type": "function", "function": {"name": choice.name}}
    return _TOOL_CHOICE_MODES.get(choice.mode)


def parse_response(model: str, body: JSON) -> harness_pb2.ModelResult:
    """A ModelResult for a non-streamed chat-completions response."""
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ModelError(f"model {model}: response has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ModelError(f"model {model}: response choice has no message")
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ModelError(f"model {model}: response tool_calls is not a list")
    tool_calls = [_tool_call_part(model, position, raw) for position, raw in enumerate(calls)]
    result = harness_pb2.ModelResult(
        message=_assistant_message(
            model,
            reasoning=_text_field(model, message, "reasoning_content"),
            text=_text_field(model, message, "content"),
            tool_calls=tool_calls,
        )
    )
    usage = body.get("usage")
    if isinstance(usage, dict):
        result.usage.CopyFrom(_usage(model, usage))
    return result


def _assistant_message(
    model: str, *, reasoning: str, text: str, tool_calls: Sequence[common_pb2.ToolCall]
) -> common_pb2.Message:
    message = common_pb2.Message(role="assistant")
    if reasoning:
        message.parts.add().reasoning.CopyFrom(
            common_pb2.ReasoningPart(provider="openai", model_id=model, opaque_bytes=reasoning.encode())
        )
    if text:
        message.parts.add().text.text = text
    for call in tool_calls:
        message.parts.add().tool_call.CopyFrom(call)
    return message


def _text_field(model: str, body: Mapping[str, Any], name: str) -> str:
    value = body.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ModelError(f"model {model}: response {name} is not a string")
    return value


def _tool_call_part(model: str, position: int, raw: object) -> common_pb2.ToolCall:
    if not isinstance(raw, dict) or not isinstance(raw.get("function"), dict):
        raise ModelError(f"model {model}: response tool call {position} has no function")
    function = raw["function"]
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ModelError(f"model {model}: response tool call {position} has no function name")
    call_id = raw.get("id") or ""
    if not isinstance(call_id, str):
        raise ModelError(f"model {model}: response tool call {position} id is not a string")
    return _tool_call(model, call_id, name, function.get("arguments") or "")


def _tool_call(model: str, call_id: str, name: str, arguments: object) -> common_pb2.ToolCall:
    call = common_pb2.ToolCall(id=call_id, tool=name)
    if isinstance(arguments, dict):
        decoded: object = arguments
    elif isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ModelError(f"model {model}: tool call {name!r} arguments are not JSON: {exc}") from None
    else:
        raise ModelError(f"model {model}: tool call {name!r} arguments are not a JSON string")
    if not isinstance(decoded, dict):
        raise ModelError(f"model {model}: tool call {name!r} arguments are not a JSON object")
    call.args.update(decoded)
    return call


def _usage(model: str, raw: Mapping[str, Any]) -> common_pb2.Usage:
    details = raw.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else 0
    return common_pb2.Usage(
        model=model,
        input_tokens=_int(raw.get("prompt_tokens")),
        output_tokens=_int(raw.get("completion_tokens")),
        reasoning_tokens=_int(reasoning),
    )


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class _PendingToolCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class _StreamedCompletion:
    """Accumulates a streamed completion chunk by chunk."""

    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, _PendingToolCall] = field(default_factory=dict)
    usage: common_pb2.Usage | None = None

    def absorb(self, model: str, chunk: JSON) -> str:
        """Take one chunk; returns its new text (for the delta callback)."""
        if isinstance(chunk.get("error"), dict):
            raise ModelError(f"model {model}: stream error: {chunk['error'].get('message', 'unknown')}")
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = _usage(model, usage)
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return ""  # usage-only chunks carry no choice
        delta = choices[0].get("delta")
        if not isinstance(delta, dict):
            return ""
        self.reasoning.append(_text_field(model, delta, "reasoning_content"))
        for raw in delta.get("tool_calls") or []:
            self._absorb_tool_call(model, raw)
        text = _text_field(model, delta, "content")
        self.text.append(text)
        return text

    def _absorb_tool_call(self, model: str, raw: object) -> None:
        if not isinstance(raw, dict):
            raise ModelError(f"model {model}: stream tool call delta is not an object")
        index = raw.get("index", 0)
        if not isinstance(index, int):
            raise ModelError(f"model {model}: stream tool call index is not an integer")
        pending = self.tool_calls.setdefault(index, _PendingToolCall())
        if isinstance(raw.get("id"), str) and raw["id"]:
            pending.call_id = raw["id"]
        function = raw.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str) and function["name"]:
                pending.name = function["name"]
            if isinstance(function.get("arguments"), str):
                pending.arguments.append(function["arguments"])

    def result(self, model: str) -> harness_pb2.ModelResult:
        calls = []
        for index in sorted(self.tool_calls):
            pending = self.tool_calls[index]
            if not pending.name:
                raise ModelError(f"model {model}: streamed tool call {index} has no function name")
            calls.append(_tool_call(model, pending.call_id, pending.name, "".join(pending.arguments)))
        result = harness_pb2.ModelResult(
            message=_assistant_message(
                model, reasoning="".join(self.reasoning), text="".join(self.text), tool_calls=calls
            )
        )
        if self.usage is not None:
            result.usage.CopyFrom(self.usage)
        return result


def _sse_data(line: bytes) -> bytes | None:
    line = line.strip()
    if not line.startswith(b"data:"):
        return None  # comments, blank separators, event: and id: lines
    return line[len(b"data:") :].strip()


def _decode_json(model: str, raw: bytes) -> JSON:
    try:
        decoded = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"model {model}: response is not JSON: {exc}") from None
    if not isinstance(decoded, dict):
        raise ModelError(f"model {model}: response is not a JSON object")
    return decoded


def _status_message(model: str, status: int, raw: bytes) -> str:
    detail = ""
    try:
        decoded = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
        message = decoded["error"].get("message")
        if isinstance(message, str):
            detail = message
    if not detail:
        detail = raw.decode("utf-8", "replace").strip()
        if len(detail) > 200:
            detail = detail[:200] + "..."
    return f"model {model}: HTTP {status}" + (f": {detail}" if detail else "")
