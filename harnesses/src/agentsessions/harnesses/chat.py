"""The chat harness: the whole conversation so far, plus the new inputs, in one model call.

Context, in order: an optional system message from the execution config
(``{"system_prompt": "..."}``), the message of every INPUT and OUTPUT event in the history, then
this execution's inputs. A malformed config fails the execution before any model call.

Serve it on its own: ``python -m agentsessions.harnesses.chat --listen 127.0.0.1:50062``.
"""

from __future__ import annotations

import json
import sys

from agentsessions.sdk import EventSink, Start, text_message
from agentsessions.sdk.cli import serve_main
from agentsessions.v1 import common_pb2, harness_pb2

_CONVERSATION_KINDS = (common_pb2.EVENT_INPUT, common_pb2.EVENT_OUTPUT)


class ChatConfigError(ValueError):
    """The execution config is not a chat config."""


class ChatHarness:
    """A multi-turn chat over the host's model; ``model`` "" lets the host pick its configured one."""

    def __init__(self, model: str = "") -> None:
        self._model = model

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id="chat",
            version="1",
            models=[self._model] if self._model else [],
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        messages = conversation(start)
        await sink.model(common_pb2.ModelCall(model=self._model, messages=messages))


def system_prompt(config: bytes) -> str:
    """The system prompt an execution config asks for ("" for none)."""
    if not config:
        return ""
    try:
        decoded = json.loads(config)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ChatConfigError(f"chat config is not JSON: {exc}") from None
    if not isinstance(decoded, dict):
        raise ChatConfigError("chat config must be a JSON object")
    prompt = decoded.get("system_prompt", "")
    if not isinstance(prompt, str):
        raise ChatConfigError(f"chat config system_prompt must be a string, got {type(prompt).__name__}")
    return prompt


def conversation(start: Start) -> list[common_pb2.Message]:
    """The messages one chat turn sends to the model."""
    messages: list[common_pb2.Message] = []
    prompt = system_prompt(start.config)
    if prompt:
        messages.append(text_message("system", prompt))
    for event in start.history:
        if event.kind in _CONVERSATION_KINDS and event.HasField("message"):
            messages.append(event.message)
    messages.extend(start.inputs)
    return messages


if __name__ == "__main__":
    sys.exit(serve_main(ChatHarness(), prog="python -m agentsessions.harnesses.chat"))
