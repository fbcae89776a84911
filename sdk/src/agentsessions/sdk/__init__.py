"""Harness SDK for agentsessions.v1.

The native API (plain Python values; protobuf only at the wire):

- :func:`define_harness` / :class:`NativeHarness`: a harness from an ``async def`` of an
  :class:`Execution`, the handle that makes model calls, tool calls and outputs with the replay
  rules built in (see :mod:`agentsessions.sdk.execution`);
- the contract's values: :class:`Message` and its parts, :class:`ToolCall`, :class:`ToolResult`,
  :class:`ToolDefinition`, :class:`ModelCall`, :class:`ModelResult`, ... (:mod:`.types`), their
  wire converters (:mod:`.convert`) and the chat-completions converter (:mod:`.chat`);
- a test kit that runs a harness without a host (:mod:`agentsessions.sdk.testing`).

The protocol level stays available: a harness is any object with ``describe()`` and
``run(start, sink)`` (:class:`Harness`, :class:`Start`, :class:`EventSink`, ``*_pb2`` values).
``serve`` exposes either kind over ``Harness.Connect``.
"""

from agentsessions.sdk.convert import ConversionError
from agentsessions.sdk.errors import (
    ApprovalParkedError,
    CorrelationError,
    ExecutionCancelledError,
    ProtocolError,
    SinkClosedError,
    SinkError,
    ToolCallRejectedError,
    ToolError,
    find_park,
)
from agentsessions.sdk.execution import Execution, ToolFunction
from agentsessions.sdk.harness import EventSink, Harness, Start, message_text, text_message
from agentsessions.sdk.native import NativeHarness, define_harness
from agentsessions.sdk.servicer import HarnessServicer
from agentsessions.sdk.serving import HarnessServer, run_server, serve, start_server
from agentsessions.sdk.types import (
    ApprovalDecision,
    DataPart,
    FilePart,
    HarnessDescriptor,
    Mediation,
    Message,
    ModelCall,
    ModelResult,
    Part,
    ReasoningPart,
    ResultCode,
    Resumability,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
    ToolResult,
    ToolSpec,
    Usage,
)

__all__ = [
    "ApprovalDecision",
    "ApprovalParkedError",
    "ConversionError",
    "CorrelationError",
    "DataPart",
    "EventSink",
    "Execution",
    "ExecutionCancelledError",
    "FilePart",
    "Harness",
    "HarnessDescriptor",
    "HarnessServer",
    "HarnessServicer",
    "Mediation",
    "Message",
    "ModelCall",
    "ModelResult",
    "NativeHarness",
    "Part",
    "ProtocolError",
    "ReasoningPart",
    "ResultCode",
    "Resumability",
    "SinkClosedError",
    "SinkError",
    "Start",
    "TextPart",
    "ToolCall",
    "ToolCallRejectedError",
    "ToolChoice",
    "ToolChoiceMode",
    "ToolDefinition",
    "ToolError",
    "ToolFunction",
    "ToolResult",
    "ToolSpec",
    "Usage",
    "define_harness",
    "find_park",
    "message_text",
    "run_server",
    "serve",
    "start_server",
    "text_message",
]
