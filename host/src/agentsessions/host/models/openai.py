"""A provider for OpenAI-compatible chat-completions endpoints, spoken directly over httpx.

The request body is ``{model, messages, tools, tool_choice, stream}``, converted to and from the
contract's types by the SDK's chat-completions converter (``agentsessions.sdk.chat``, the one a
harness adapter uses too), whose docstring states the rules: outbound, text parts are
concatenated, reasoning parts are dropped, file or data parts are refused; inbound,
``reasoning_content`` becomes a ``ReasoningPart{provider: "openai"}``, tool calls become ToolCall
parts and usage is returned (the host journals it as USAGE). ``ModelCall.params`` are sent as typed
request fields (``chat.chat_params``); requests are retried on 429, 5xx and connection errors within
timeouts (``models.transport``).

The API key comes only from the environment (``MODEL_API_KEY``, else ``OPENAI_API_KEY``), never
from arguments or config, so it never lands in argv or the journal.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from agentsessions.host.models.policy import RetryPolicy, Timeouts
from agentsessions.host.models.provider import DeltaCallback, ModelError
from agentsessions.sdk.jsonvalues import ConversionError
from agentsessions.v1 import common_pb2, harness_pb2

if TYPE_CHECKING:
    import httpx

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_PATH = "/chat/completions"
DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
KEY_ENV_VARS = ("MODEL_API_KEY", "OPENAI_API_KEY")
# Request models that mean "whatever this provider is configured with" (echo is the sample harnesses' id).
_DEFAULT_MODEL_ALIASES = frozenset({"", "echo"})

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
        # httpx and tenacity load with the first provider, not with the host (start-up time).
        from agentsessions.host.models.transport import ChatTransport

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
        import httpx  # loaded by the transport already: a dictionary lookup

        # The SDK converters load with the first request, not with the host (bench/README.md, start-up).
        from agentsessions.sdk import chat

        model = self.model if call.model in _DEFAULT_MODEL_ALIASES else call.model
        stream = self._stream and on_delta is not None
        body = build_request(call, model, stream=stream)
        try:
            body.update(chat.chat_params(call.params))
        except ConversionError as exc:
            raise ModelError(str(exc)) from None
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
        completion = _StreamedCompletion(model)
        async for payload in self._sse_payloads(response, model):
            chunk = _decode_json(model, payload)
            delta_text = completion.absorb(chunk)
            if delta_text:
                await on_delta(delta_text)
        return completion.result()

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
    """The chat-completions request body for a ModelCall (the SDK's converter, agentsessions.sdk.chat)."""
    from agentsessions.sdk import chat, convert

    try:
        return chat.chat_request(convert.model_call_from_proto(call), model=model, stream=stream)
    except ConversionError as exc:
        raise ModelError(str(exc)) from None


def parse_response(model: str, body: JSON) -> harness_pb2.ModelResult:
    """A ModelResult for a non-streamed chat-completions response."""
    from agentsessions.sdk import chat, convert

    try:
        return convert.model_result_to_proto(chat.model_result_from_chat(body, model=model))
    except ConversionError as exc:
        raise ModelError(f"model {model}: {exc}") from None


class _StreamedCompletion:
    """Accumulates a streamed completion chunk by chunk (the SDK's ChatCompletionStream)."""

    def __init__(self, model: str) -> None:
        from agentsessions.sdk import chat

        self._model = model
        self._stream = chat.ChatCompletionStream(model)

    def absorb(self, chunk: JSON) -> str:
        """Take one chunk; returns its new text (for the delta callback)."""
        try:
            return self._stream.absorb(chunk)
        except ConversionError as exc:
            raise ModelError(f"model {self._model}: {exc}") from None

    def result(self) -> harness_pb2.ModelResult:
        from agentsessions.sdk import convert

        try:
            return convert.model_result_to_proto(self._stream.result())
        except ConversionError as exc:
            raise ModelError(f"model {self._model}: {exc}") from None


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
    from agentsessions.host.models.transport import error_detail  # loaded with the provider's transport

    detail = error_detail(raw)
    return f"model {model}: HTTP {status}" + (f": {detail}" if detail else "")
