"""The OpenAI-compatible provider against a real chat-completions HTTP endpoint on loopback.

The endpoint is a small stdlib HTTP server in a thread: it records every request (path,
headers, JSON body) and answers with scripted responses, plain JSON or server-sent events.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from google.protobuf import struct_pb2

from agentsessions.host.models.openai import OpenAIModel
from agentsessions.host.models.provider import ModelError
from agentsessions.sdk.harness import message_text, text_message
from agentsessions.v1 import common_pb2


@dataclass
class Reply:
    status: int = 200
    content_type: str = "application/json"
    chunks: list[bytes] = field(default_factory=list)
    declare_length: bool = True


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class Endpoint:
    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.replies: list[Reply] = []
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with endpoint.lock:
                    headers = {name.lower(): value for name, value in self.headers.items()}
                    endpoint.requests.append(Recorded(self.path, headers, body))
                    reply = endpoint.replies.pop(0)
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                if reply.declare_length:
                    self.send_header("Content-Length", str(sum(len(c) for c in reply.chunks)))
                self.end_headers()
                for chunk in reply.chunks:
                    self.wfile.write(chunk)
                    self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def reply_json(self, body: dict[str, Any], status: int = 200) -> None:
        self.replies.append(Reply(status=status, chunks=[json.dumps(body).encode()]))

    def reply_events(self, *events: dict[str, Any], done: bool = True) -> None:
        chunks = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events]
        if done:
            chunks.append(b"data: [DONE]\n\n")
        self.replies.append(Reply(content_type="text/event-stream", chunks=chunks, declare_length=False))


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint()
    thread = threading.Thread(target=served.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        served.server.shutdown()
        served.server.server_close()
        thread.join(timeout=10)


@pytest.fixture(autouse=True)
def no_provider_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MODEL_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def completion(content: str | None, **message: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content, **message}}]}


def call(*messages: common_pb2.Message, model: str = "") -> common_pb2.ModelCall:
    return common_pb2.ModelCall(model=model, messages=list(messages))


class Deltas:
    def __init__(self) -> None:
        self.chunks: list[str] = []

    async def __call__(self, chunk: str) -> None:
        self.chunks.append(chunk)


async def test_non_streamed_completion(endpoint: Endpoint) -> None:
    body = completion("hello")
    body["usage"] = {
        "prompt_tokens": 7,
        "completion_tokens": 2,
        "completion_tokens_details": {"reasoning_tokens": 1},
    }
    endpoint.reply_json(body)
    system = text_message("system", "be kind")
    user = common_pb2.Message(
        role="user",
        parts=[
            common_pb2.Part(text=common_pb2.TextPart(text="hi ")),
            common_pb2.Part(reasoning=common_pb2.ReasoningPart(provider="openai", opaque_bytes=b"hidden")),
            common_pb2.Part(text=common_pb2.TextPart(text="there")),
        ],
    )
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        result = await model.complete(call(system, user))
    finally:
        await model.aclose()
    (request,) = endpoint.requests
    assert request.path == "/v1/chat/completions"
    assert request.body == {
        "model": "gpt-test",
        "messages": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi there"}],
    }
    assert result.message == text_message("assistant", "hello")
    assert (result.usage.model, result.usage.input_tokens, result.usage.output_tokens) == ("gpt-test", 7, 2)
    assert result.usage.reasoning_tokens == 1


@pytest.mark.parametrize(("requested", "sent"), [("", "gpt-test"), ("echo", "gpt-test"), ("other", "other")])
async def test_request_model_defaults_to_the_configured_one(
    endpoint: Endpoint, requested: str, sent: str
) -> None:
    endpoint.reply_json(completion("ok"))
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        await model.complete(call(text_message("user", "x"), model=requested))
    finally:
        await model.aclose()
    assert endpoint.requests[0].body["model"] == sent


async def test_streamed_completion_delivers_deltas(endpoint: Endpoint) -> None:
    endpoint.reply_events(
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "Hel"}}]},
        {"choices": [{"delta": {"content": "lo "}}]},
        {"choices": [{"delta": {"content": "world"}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3}},
    )
    deltas = Deltas()
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        result = await model.complete(call(text_message("user", "greet")), deltas)
    finally:
        await model.aclose()
    assert deltas.chunks == ["Hel", "lo ", "world"]
    assert message_text(result.message) == "".join(deltas.chunks)
    assert result.message == text_message("assistant", "Hello world")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (4, 3)
    body = endpoint.requests[0].body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert endpoint.requests[0].headers["accept"] == "text/event-stream"


async def test_streaming_can_be_turned_off(endpoint: Endpoint) -> None:
    endpoint.reply_json(completion("whole"))
    deltas = Deltas()
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url, stream=False)
    try:
        result = await model.complete(call(text_message("user", "x")), deltas)
    finally:
        await model.aclose()
    assert "stream" not in endpoint.requests[0].body
    assert deltas.chunks == [] and message_text(result.message) == "whole"


def schema() -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})
    return value


def args(**values: Any) -> struct_pb2.Struct:
    value = struct_pb2.Struct()
    value.update(values)
    return value


async def test_tools_and_tool_calls_map_both_ways(endpoint: Endpoint) -> None:
    endpoint.reply_json(
        completion(
            None,
            tool_calls=[
                {
                    "id": "call_9",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q": "moon"}'},
                }
            ],
        )
    )
    assistant = common_pb2.Message(
        role="assistant",
        parts=[
            common_pb2.Part(tool_call=common_pb2.ToolCall(id="call_1", tool="lookup", args=args(q="sun")))
        ],
    )
    tool_reply = common_pb2.Message(
        role="tool",
        parts=[
            common_pb2.Part(
                tool_result=common_pb2.ToolResult(
                    id="call_1", content=[common_pb2.Part(text=common_pb2.TextPart(text="a star"))]
                )
            )
        ],
    )
    request = call(text_message("user", "what is the sun?"), assistant, tool_reply)
    request.tools.add(name="lookup", description="look things up", input_schema=schema())
    request.tool_choice.mode = common_pb2.ToolChoice.MODE_REQUIRED
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        result = await model.complete(request)
    finally:
        await model.aclose()
    body = endpoint.requests[0].body
    assert body["messages"] == [
        {"role": "user", "content": "what is the sun?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"q":"sun"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "a star"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "look things up",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
            },
        }
    ]
    assert body["tool_choice"] == "required"
    (part,) = result.message.parts
    assert part.tool_call == common_pb2.ToolCall(id="call_9", tool="lookup", args=args(q="moon"))


async def test_named_tool_choice(endpoint: Endpoint) -> None:
    endpoint.reply_json(completion("ok"))
    request = call(text_message("user", "x"))
    request.tools.add(name="lookup")
    request.tool_choice.name = "lookup"
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        await model.complete(request)
    finally:
        await model.aclose()
    body = endpoint.requests[0].body
    assert body["tool_choice"] == {"type": "function", "function": {"name": "lookup"}}
    assert body["tools"][0]["function"]["parameters"] == {"type": "object", "properties": {}}


async def test_streamed_tool_call_arguments_are_joined(endpoint: Endpoint) -> None:
    endpoint.reply_events(
        {
            "choices": [
                {"delta": {"tool_calls": [{"index": 0, "id": "call_3", "function": {"name": "lookup"}}]}}
            ]
        },
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"q": '}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"tide"}'}}]}}]},
    )
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        result = await model.complete(call(text_message("user", "x")), Deltas())
    finally:
        await model.aclose()
    (part,) = result.message.parts
    assert part.tool_call == common_pb2.ToolCall(id="call_3", tool="lookup", args=args(q="tide"))


async def test_reasoning_content_becomes_a_reasoning_part(endpoint: Endpoint) -> None:
    endpoint.reply_json(completion("42", reasoning_content="think first"))
    model = OpenAIModel("deep-test", base_url=endpoint.base_url)
    try:
        result = await model.complete(call(text_message("user", "answer?")))
    finally:
        await model.aclose()
    reasoning, text = result.message.parts
    assert reasoning.reasoning == common_pb2.ReasoningPart(
        provider="openai", model_id="deep-test", opaque_bytes=b"think first"
    )
    assert text.text.text == "42"


async def test_streamed_reasoning_content_is_collected(endpoint: Endpoint) -> None:
    endpoint.reply_events(
        {"choices": [{"delta": {"reasoning_content": "step 1, "}}]},
        {"choices": [{"delta": {"reasoning_content": "step 2"}}]},
        {"choices": [{"delta": {"content": "done"}}]},
    )
    deltas = Deltas()
    model = OpenAIModel("deep-test", base_url=endpoint.base_url)
    try:
        result = await model.complete(call(text_message("user", "x")), deltas)
    finally:
        await model.aclose()
    assert deltas.chunks == ["done"]
    assert result.message.parts[0].reasoning.opaque_bytes == b"step 1, step 2"
    assert result.message.parts[1].text.text == "done"


@pytest.mark.parametrize(
    "part",
    [
        common_pb2.Part(file=common_pb2.FilePart(mime="image/png", uri="file:///x.png")),
        common_pb2.Part(data=common_pb2.DataPart(data=args(k=1))),
    ],
    ids=["file", "data"],
)
async def test_file_and_data_parts_are_refused_before_sending(
    endpoint: Endpoint, part: common_pb2.Part
) -> None:
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        with pytest.raises(ModelError, match="parts are not supported"):
            await model.complete(call(common_pb2.Message(role="user", parts=[part])))
    finally:
        await model.aclose()
    assert endpoint.requests == []


async def test_http_error_carries_the_provider_message(endpoint: Endpoint) -> None:
    endpoint.reply_json(
        {"error": {"message": "invalid model id", "type": "invalid_request_error"}}, status=404
    )
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        with pytest.raises(ModelError) as failure:
            await model.complete(call(text_message("user", "x")))
    finally:
        await model.aclose()
    assert "HTTP 404" in str(failure.value) and "invalid model id" in str(failure.value)


async def test_oversized_response_is_refused(endpoint: Endpoint) -> None:
    endpoint.reply_json(completion("x" * 4096))
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url, max_response_bytes=1024)
    try:
        with pytest.raises(ModelError, match="exceeds the 1024 byte limit"):
            await model.complete(call(text_message("user", "x")))
    finally:
        await model.aclose()


async def test_oversized_undeclared_stream_is_refused(endpoint: Endpoint) -> None:
    endpoint.reply_events(*[{"choices": [{"delta": {"content": "y" * 200}}]} for _ in range(10)])
    deltas = Deltas()
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url, max_response_bytes=1024)
    try:
        with pytest.raises(ModelError, match="exceeds the 1024 byte limit"):
            await model.complete(call(text_message("user", "x")), deltas)
    finally:
        await model.aclose()
    assert len("".join(deltas.chunks)) < 1024


async def test_malformed_response_is_a_model_error(endpoint: Endpoint) -> None:
    endpoint.replies.append(Reply(chunks=[b"<html>not json</html>"]))
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url)
    try:
        with pytest.raises(ModelError, match="not JSON"):
            await model.complete(call(text_message("user", "x")))
    finally:
        await model.aclose()


async def test_unreachable_endpoint_is_a_model_error(endpoint: Endpoint) -> None:
    base_url = endpoint.base_url
    endpoint.server.shutdown()
    endpoint.server.server_close()
    model = OpenAIModel("gpt-test", base_url=base_url, connect_timeout=5)
    try:
        with pytest.raises(ModelError, match=r"request to .* failed"):
            await model.complete(call(text_message("user", "x")))
    finally:
        await model.aclose()


@pytest.mark.parametrize(
    ("env", "auth_header", "header", "value"),
    [
        (
            {"MODEL_API_KEY": "key-model", "OPENAI_API_KEY": "key-openai"},
            "Authorization",
            "authorization",
            "Bearer key-model",
        ),
        ({"OPENAI_API_KEY": "key-openai"}, "Authorization", "authorization", "Bearer key-openai"),
        ({"MODEL_API_KEY": "key-model"}, "api-key", "api-key", "key-model"),
        ({}, "Authorization", "authorization", None),
        ({"MODEL_API_KEY": "key-model"}, "", "authorization", None),
    ],
    ids=["model-key-preferred", "openai-key", "raw-header", "no-key", "no-header"],
)
async def test_key_comes_only_from_the_environment(
    endpoint: Endpoint,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    auth_header: str,
    header: str,
    value: str | None,
) -> None:
    for name, key in env.items():
        monkeypatch.setenv(name, key)
    endpoint.reply_json(completion("ok"))
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url, auth_header=auth_header)
    try:
        await model.complete(call(text_message("user", "x")))
    finally:
        await model.aclose()
    headers = endpoint.requests[0].headers
    assert headers.get(header) == value
    sent = json.dumps(endpoint.requests[0].body)
    assert "key-model" not in sent and "key-openai" not in sent
