"""The embedded echo model: "echo:" + the last user message, optionally streamed."""

from __future__ import annotations

import pytest

from agentsessions.host.models.echo import EchoModel
from agentsessions.sdk.harness import message_text, text_message
from agentsessions.v1 import common_pb2


def call(*messages: common_pb2.Message) -> common_pb2.ModelCall:
    return common_pb2.ModelCall(model="echo", messages=list(messages))


async def test_answers_the_last_user_message() -> None:
    result = await EchoModel().complete(
        call(text_message("system", "s"), text_message("user", "one"), text_message("user", "two"))
    )
    assert result.message == text_message("assistant", "echo:two")


async def test_skips_trailing_assistant_messages() -> None:
    result = await EchoModel().complete(call(text_message("user", "q"), text_message("assistant", "a")))
    assert message_text(result.message) == "echo:q"


async def test_without_a_user_message_echoes_nothing() -> None:
    result = await EchoModel().complete(call())
    assert message_text(result.message) == "echo:"


async def test_streams_the_reply_in_chunks() -> None:
    chunks: list[str] = []

    async def on_delta(chunk: str) -> None:
        chunks.append(chunk)

    result = await EchoModel(chunk_size=3).complete(call(text_message("user", "streaming")), on_delta)
    assert chunks == ["ech", "o:s", "tre", "ami", "ng"]
    assert "".join(chunks) == message_text(result.message) == "echo:streaming"


def test_chunk_size_must_be_positive() -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        EchoModel(chunk_size=0)
