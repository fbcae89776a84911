"""The chat harness: the whole conversation so far, plus the new inputs, in one model call.

Context, in order: an optional system message from the execution config
(``{"system_prompt": "..."}``), the conversation the journal holds (every INPUT and OUTPUT, and
the tool exchanges of earlier turns: ``Start.conversation()``), then this execution's inputs. A
malformed config fails the execution before any model call.

Serve it on its own: ``python -m agentsessions.harnesses.chat --listen 127.0.0.1:50062``.
"""

from __future__ import annotations

import json
import sys

from agentsessions.sdk import Execution, HarnessDescriptor, Message, NativeHarness, Start
from agentsessions.sdk.cli import serve_main


class ChatConfigError(ValueError):
    """The execution config is not a chat config."""


class ChatHarness(NativeHarness):
    """A multi-turn chat over the host's model; ``model`` "" lets the host pick its configured one."""

    def __init__(self, model: str = "") -> None:
        super().__init__()
        self._model = model
        self.descriptor = HarnessDescriptor(id="chat", version="1", models=(model,) if model else ())

    async def execute(self, ex: Execution) -> None:
        await ex.model(conversation(ex.start), model=self._model)


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


def conversation(start: Start) -> list[Message]:
    """The messages one chat turn sends to the model."""
    prompt = system_prompt(start.config)
    return ([Message.system(prompt)] if prompt else []) + start.conversation()


if __name__ == "__main__":
    sys.exit(serve_main(ChatHarness(), prog="python -m agentsessions.harnesses.chat"))
