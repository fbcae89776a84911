"""Harness SDK for agentsessions.v1.

A harness implements :class:`Harness` (``describe`` and ``run``) and talks to the host through
the :class:`EventSink` it is handed. ``serve`` exposes a harness over ``Harness.Connect``.
"""

from agentsessions.sdk.errors import (
    ApprovalParkedError,
    CorrelationError,
    ExecutionCancelledError,
    ProtocolError,
    SinkClosedError,
    SinkError,
    ToolCallRejectedError,
)
from agentsessions.sdk.harness import EventSink, Harness, Start, message_text, text_message
from agentsessions.sdk.servicer import HarnessServicer
from agentsessions.sdk.serving import HarnessServer, run_server, serve, start_server

__all__ = [
    "ApprovalParkedError",
    "CorrelationError",
    "EventSink",
    "ExecutionCancelledError",
    "Harness",
    "HarnessServer",
    "HarnessServicer",
    "ProtocolError",
    "SinkClosedError",
    "SinkError",
    "Start",
    "ToolCallRejectedError",
    "message_text",
    "run_server",
    "serve",
    "start_server",
    "text_message",
]
