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

    @classmethod
    def at(cls, execution_id: str, tool_call_id: str, request_seq: int) -> ApprovalParkedError:
        """Parked at the approval request ``request_seq`` for ``tool_call_id``."""
        return cls(
            common_pb2.ApprovalRef(
                execution_id=execution_id, tool_call_id=tool_call_id, request_seq=request_seq
            )
        )


class ToolError(Exception):
    """Raised by an in-harness tool to report a failed result (``is_error``, the message as
    ``error``) that the model then sees; any other exception fails the execution."""


def find_park(error: BaseException | None) -> ApprovalParkedError | None:
    """The approval park ``error`` carries, or None.

    A park is still a park when a framework wrapped it: raised ``from`` it (``__cause__``),
    raised while handling it (``__context__``, unless suppressed with ``from None``: that says
    the new error is not about the park), or grouped by a TaskGroup (every member of the group
    then has to carry the same park, or the run failed for another reason too)."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ApprovalParkedError):
            return error
        if isinstance(error, BaseExceptionGroup):
            parks = [find_park(inner) for inner in error.exceptions]
            first = parks[0] if parks else None
            if first is not None and all(p is not None and p.ref == first.ref for p in parks):
                return first
            return None
        if error.__cause__ is not None:
            error = error.__cause__
        elif error.__suppress_context__:
            return None
        else:
            error = error.__context__
    return None
