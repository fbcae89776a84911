"""A scripted model: replays a fixed list of completions, one per call, in order.

It drives demos and tests of agent loops without a network: each completion is an assistant
message that may hold text and tool_call parts, so a script can walk a harness through tool
use ("call read_file", then "call write_file", then "done"). Calls beyond the script fail with
``ModelError`` instead of inventing an answer. Every received call is kept (``calls``) so a
caller can check what the harness asked, and how many times the provider was invoked.

A script file (``ScriptedModel.from_file``) is a JSON list whose items are either a string
(an assistant text reply) or a proto3-JSON ``agentsessions.v1.Message``, for example::

    [
      {"role": "assistant", "parts": [{"toolCall": {"id": "c1", "tool": "read_file",
                                                     "args": {"path": "README.md"}}}]},
      "The README says hello."
    ]
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format, struct_pb2

from agentsessions.host.models.provider import DeltaCallback, ModelError
from agentsessions.v1 import common_pb2, harness_pb2

Completion = common_pb2.Message | str


def assistant_text(text: str) -> common_pb2.Message:
    """An assistant message holding one text part."""
    return common_pb2.Message(role="assistant", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))])


def tool_call_part(call_id: str, tool: str, args: Mapping[str, Any] | None = None) -> common_pb2.Part:
    """A model-proposed tool call as a message part."""
    struct = struct_pb2.Struct()
    struct.update(dict(args or {}))
    return common_pb2.Part(tool_call=common_pb2.ToolCall(id=call_id, tool=tool, args=struct))


def assistant_tool_calls(*parts: common_pb2.Part, text: str = "") -> common_pb2.Message:
    """An assistant message proposing tool calls, optionally preceded by text."""
    message = common_pb2.Message(role="assistant")
    if text:
        message.parts.append(common_pb2.Part(text=common_pb2.TextPart(text=text)))
    message.parts.extend(parts)
    return message


def _as_message(completion: Completion) -> common_pb2.Message:
    if isinstance(completion, str):
        return assistant_text(completion)
    message = common_pb2.Message()
    message.CopyFrom(completion)
    return message


class ScriptedModel:
    """A :class:`ModelProvider` answering each call with the next scripted completion."""

    def __init__(self, completions: Iterable[Completion], *, chunk_size: int = 16) -> None:
        if chunk_size <= 0:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        self._script = [_as_message(completion) for completion in completions]
        self._next = 0
        self._chunk_size = chunk_size
        self._calls: list[common_pb2.ModelCall] = []

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        """Load a script file (blocking; call at startup). Raises ValueError naming the item."""
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(document, list):
            raise ValueError(f"{path}: a script is a JSON list of completions")
        return cls(_parse_item(item, f"{path}[{index}]") for index, item in enumerate(document))

    @property
    def calls(self) -> Sequence[common_pb2.ModelCall]:
        """Every call received so far, in order (copies)."""
        return tuple(self._calls)

    @property
    def remaining(self) -> int:
        """Completions not yet served."""
        return len(self._script) - self._next

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        received = common_pb2.ModelCall()
        received.CopyFrom(call)
        self._calls.append(received)
        if self._next >= len(self._script):
            raise ModelError(
                f"scripted model exhausted: call {len(self._calls)} but the script has {len(self._script)}"
            )
        message = _as_message(self._script[self._next])
        self._next += 1
        if on_delta is not None:
            for part in message.parts:
                if part.WhichOneof("part") != "text":
                    continue
                text = part.text.text
                for offset in range(0, len(text), self._chunk_size):
                    await on_delta(text[offset : offset + self._chunk_size])
        return harness_pb2.ModelResult(message=message, model_call_id=call.id)


def _parse_item(item: object, where: str) -> Completion:
    if isinstance(item, str):
        return item
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a string or a Message object")
    message = common_pb2.Message()
    try:
        json_format.ParseDict(item, message)
    except json_format.ParseError as exc:
        raise ValueError(f"{where}: not an agentsessions.v1.Message: {exc}") from exc
    return message
