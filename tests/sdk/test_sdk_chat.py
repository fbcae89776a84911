"""The chat-completions converter, both directions (the host's OpenAI provider and framework
adapters share it)."""

from __future__ import annotations

from typing import Any

import pytest

from agentsessions.sdk import (
    ConversionError,
    DataPart,
    Message,
    ModelCall,
    ModelResult,
    ReasoningPart,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
    ToolResult,
    Usage,
    chat,
)

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "list files"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "ls", "arguments": '{"depth":2,"path":"."}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt b.txt"},
    {"role": "assistant", "content": "two files"},
]


def test_chat_messages_round_trip_through_contract_messages() -> None:
    messages = chat.messages_from_chat(CONVERSATION)
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    (call,) = messages[2].tool_calls
    assert call == ToolCall(id="call_1", name="ls", args={"depth": 2, "path": "."})
    assert type(call.args["depth"]) is int
    assert messages[3].tool_results == (ToolResult(id="call_1", content=(TextPart("a.txt b.txt"),)),)
    assert chat.chat_messages(messages) == CONVERSATION


def test_tool_results_become_role_tool_messages_in_order() -> None:
    answer = Message(
        "tool",
        (
            ToolResult.ok("a", {"n": 3}),
            ToolResult.failure("b", "no such file"),
            ToolResult(id="c", output_uri="s3://big"),
        ),
    )
    assert chat.chat_messages([answer]) == [
        {"role": "tool", "tool_call_id": "a", "content": '{"n":3}'},
        {"role": "tool", "tool_call_id": "b", "content": "no such file"},
        {"role": "tool", "tool_call_id": "c", "content": "s3://big"},
    ]


def test_reasoning_is_dropped_and_data_refused_towards_chat() -> None:
    reasoning = Message("assistant", (ReasoningPart(provider="openai", opaque=b"r"), TextPart("hi")))
    assert chat.chat_messages([reasoning]) == [{"role": "assistant", "content": "hi"}]
    with pytest.raises(ConversionError, match="message 0 part 0: data parts are not supported"):
        chat.chat_messages([Message("user", (DataPart({"a": 1}),))])


def test_a_request_body_converts_both_ways_with_params() -> None:
    body = {
        "model": "gpt-4o",
        "messages": CONVERSATION[:2],
        "tools": [
            {
                "type": "function",
                "function": {"name": "ls", "description": "list", "parameters": {"type": "object"}},
            }
        ],
        "tool_choice": "auto",
        "temperature": 0.2,
        "max_tokens": 256,
        "stop": ["\n"],
        "stream": True,
    }
    call = chat.model_call_from_chat(body)
    assert call.model == "gpt-4o"
    assert call.tools == (ToolDefinition("ls", "list", {"type": "object"}),)
    assert call.tool_choice == ToolChoice(ToolChoiceMode.AUTO)
    assert call.params == {"temperature": "0.2", "max_tokens": "256", "stop": '["\\n"]'}
    again = chat.chat_request(call, model="gpt-4o", stream=True)
    assert again == {
        "model": "gpt-4o",
        "messages": CONVERSATION[:2],
        "tools": body["tools"],
        "tool_choice": "auto",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert chat.chat_params(call.params) == {"temperature": 0.2, "max_tokens": 256, "stop": ["\n"]}
    with pytest.raises(ConversionError, match=r"params\.model: model is part of the request"):
        chat.chat_params({"model": '"x"'})
    named = chat.tool_choice_from_chat({"type": "function", "function": {"name": "ls"}})
    assert named == ToolChoice(ToolChoiceMode.REQUIRED, "ls")
    assert chat.chat_tool_choice(named) == {"type": "function", "function": {"name": "ls"}}


def test_a_completion_converts_both_ways() -> None:
    body = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "reasoning_content": "think",
                    "content": "calling",
                    "tool_calls": [
                        {"id": "c9", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                    ],
                }
            }
        ],
        "usage": {
            "prompt_tokens": 5,
            "completion_tokens": 7,
            "completion_tokens_details": {"reasoning_tokens": 2},
        },
    }
    result = chat.model_result_from_chat(body, model="m")
    assert result == ModelResult(
        Message(
            "assistant",
            (
                ReasoningPart(provider="openai", model_id="m", opaque=b"think"),
                TextPart("calling"),
                ToolCall(id="c9", name="ls"),
            ),
        ),
        Usage("m", 5, 7, 2),
    )
    completion = chat.chat_completion(result, model="m", id="x")
    message = completion["choices"][0]["message"]
    assert message["content"] == "calling" and message["reasoning_content"] == "think"
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert chat.model_result_from_chat(completion, model="m") == result
    with pytest.raises(ConversionError, match="response has no choices"):
        chat.model_result_from_chat({"choices": []}, model="m")
    with pytest.raises(ConversionError, match="arguments are not JSON"):
        chat.model_result_from_chat(
            {"choices": [{"message": {"tool_calls": [{"function": {"name": "x", "arguments": "{oops"}}]}}]},
            model="m",
        )


def test_a_stream_accumulates_into_the_same_result_its_chunks_came_from() -> None:
    result = ModelResult(
        Message("assistant", (TextPart("two files"), ToolCall(id="c1", name="ls", args={"path": "."}))),
        Usage("m", 1, 2),
    )
    stream = chat.ChatCompletionStream("m")
    texts = [stream.absorb(chunk) for chunk in chat.chat_completion_chunks(result, model="m")]
    assert "".join(texts) == "two files"
    assert stream.result() == result


def test_integers_beyond_the_safe_range_in_model_arguments_are_refused() -> None:
    with pytest.raises(ConversionError, match="beyond"):
        chat.parse_arguments('{"id": 9007199254740993}', "lookup")
    call = ModelCall(messages=(Message.user("x"),))
    assert chat.chat_request(call, model="m") == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
    }
