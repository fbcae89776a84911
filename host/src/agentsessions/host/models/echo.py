"""The embedded echo model: answers "echo:" + the text of the last user message."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agentsessions.host.models.provider import DeltaCallback
from agentsessions.sdk.harness import message_text, text_message
from agentsessions.v1 import common_pb2, harness_pb2

PREFIX = "echo:"
# Streaming yields to the event loop after this much text, so a huge echo shares the host.
YIELD_EVERY_CHARS = 16 * 1024


class EchoModel:
    """A deterministic provider for the embedded default and for tests.

    With ``on_delta`` the reply is also streamed, ``chunk_size`` characters at a time; the
    returned message is always the whole reply.
    """

    def __init__(self, *, chunk_size: int = 8) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        self._chunk_size = chunk_size

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        reply = PREFIX + _last_user_text(call.messages)
        if on_delta is not None:
            since_yield = 0
            for offset in range(0, len(reply), self._chunk_size):
                await on_delta(reply[offset : offset + self._chunk_size])
                since_yield += self._chunk_size
                if since_yield >= YIELD_EVERY_CHARS:
                    since_yield = 0
                    await asyncio.sleep(0)
        return harness_pb2.ModelResult(message=text_message("assistant", reply))


def _last_user_text(messages: Sequence[common_pb2.Message]) -> str:
    for message in reversed(messages):
        if message.role == "user":
            return message_text(message)
    return ""
