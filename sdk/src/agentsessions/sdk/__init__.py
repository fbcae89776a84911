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

The names load on first use (PEP 562): a process that needs a few of the SDK's modules (the host,
a client) does not import the harness server and the native API with them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
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

# The module that defines each name of __all__.
_HOMES: dict[str, str] = {
    "ConversionError": "convert",
    "ApprovalParkedError": "errors",
    "CorrelationError": "errors",
    "ExecutionCancelledError": "errors",
    "ProtocolError": "errors",
    "SinkClosedError": "errors",
    "SinkError": "errors",
    "ToolCallRejectedError": "errors",
    "ToolError": "errors",
    "find_park": "errors",
    "Execution": "execution",
    "ToolFunction": "execution",
    "EventSink": "harness",
    "Harness": "harness",
    "Start": "harness",
    "message_text": "harness",
    "text_message": "harness",
    "NativeHarness": "native",
    "define_harness": "native",
    "HarnessServicer": "servicer",
    "HarnessServer": "serving",
    "run_server": "serving",
    "serve": "serving",
    "start_server": "serving",
    "ApprovalDecision": "types",
    "DataPart": "types",
    "FilePart": "types",
    "HarnessDescriptor": "types",
    "Mediation": "types",
    "Message": "types",
    "ModelCall": "types",
    "ModelResult": "types",
    "Part": "types",
    "ReasoningPart": "types",
    "ResultCode": "types",
    "Resumability": "types",
    "TextPart": "types",
    "ToolCall": "types",
    "ToolChoice": "types",
    "ToolChoiceMode": "types",
    "ToolDefinition": "types",
    "ToolResult": "types",
    "ToolSpec": "types",
    "Usage": "types",
}


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
