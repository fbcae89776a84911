"""Typed errors a harness can see from its sink."""

from __future__ import annotations

from agentsessions.v1 import common_pb2


class SinkError(Exception):
    """Base class of every error an EventSink raises."""


class SinkClosedError(SinkError):
    """The execution ended; the sink accepts no more calls."""


class ProtocolError(SinkError):
    """The peer broke the Harness.Connect protocol (correlation, ordering, framing)."""


class CorrelationError(ProtocolError):
    """A reply did not match the request it answers (execution, session or call id)."""


class ToolCallRejectedError(SinkError):
    """The host refused a tool call before recording its intent."""


class ExecutionCancelledError(SinkError):
    """The host cancelled the execution."""


class ApprovalParkedError(SinkError):
    """The tool call awaits a human decision; the execution must unwind now.

    The host resumes the execution later, once the decision is recorded.
    """

    def __init__(self, ref: common_pb2.ApprovalRef) -> None:
        super().__init__(
            f"tool call {ref.tool_call_id!r} of execution {ref.execution_id!r} "
            f"is parked awaiting approval (request seq {ref.request_seq})"
        )
        self.ref = ref
