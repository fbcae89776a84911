"""The harness-author API: what a harness implements and the sink it talks to.

A harness is any object with ``describe()`` and ``run(start, sink)``. The same object runs
in-process inside the host (the host hands it the controller's sink directly) or behind
``Harness.Connect`` in its own process (``agentsessions.sdk.serve`` bridges the stream to a sink).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from agentsessions.v1 import common_pb2, harness_pb2


@dataclass(frozen=True)
class Start:
    """Everything one execution needs, as the host sends it in the Start frame."""

    session: str
    execution_id: str
    inputs: Sequence[common_pb2.Message] = ()
    history: Sequence[common_pb2.Event] = ()
    config: bytes = b""
    resume_from_seq: int = 0
    identity: harness_pb2.IdentityContext | None = field(default=None)

    def last_input_text(self) -> str:
        """Concatenated text parts of the last input ("" when there are no inputs)."""
        if not self.inputs:
            return ""
        return message_text(self.inputs[-1])


def message_text(message: common_pb2.Message) -> str:
    """The concatenation of a message's text parts."""
    return "".join(p.text.text for p in message.parts if p.WhichOneof("part") == "text")


def text_message(role: str, text: str) -> common_pb2.Message:
    """A message holding one text part."""
    return common_pb2.Message(role=role, parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))])


@runtime_checkable
class EventSink(Protocol):
    """The host side of an execution, as a harness sees it.

    Every method journals before it returns. Calls are serialized: one request is
    outstanding at a time. After the execution ends the sink is sealed and every call
    raises ``SinkClosedError``; after a park every call raises the same
    ``ApprovalParkedError``.
    """

    async def model(self, call: common_pb2.ModelCall) -> harness_pb2.ModelResult:
        """Ask the host to call a model; returns the completion (journaled as OUTPUT)."""
        ...

    async def output(self, text: str) -> None:
        """Record assistant text produced without a model call."""
        ...

    async def tool_call(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult:
        """Ask the host to run a CONTROLLER_MEDIATED or REQUIRES_APPROVAL tool call."""
        ...

    async def report(self, result: common_pb2.ToolResult) -> None:
        """Record the result of a tool the harness ran itself (IN_HARNESS_REPORTED)."""
        ...

    async def usage(self, usage: common_pb2.Usage) -> None:
        """Record token accounting."""
        ...


@runtime_checkable
class Harness(Protocol):
    """An agent the host can run: describe it, then run one execution per call."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        """What the harness is: id, version, models, tools, capabilities."""
        ...

    async def run(self, start: Start, sink: EventSink) -> None:
        """Run one execution. Returning means COMPLETED; raising means FAILED."""
        ...
