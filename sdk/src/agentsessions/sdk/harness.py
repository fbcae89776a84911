"""The harness contract at the protocol level: what a harness implements and the sink it talks to.

A harness is any object with ``describe()`` and ``run(start, sink)``. The same object runs
in-process inside the host (the host hands it the controller's sink directly) or behind
``Harness.Connect`` in its own process (``agentsessions.sdk.serve`` bridges the stream to a sink).
Most harnesses are easier to write with the native API (:mod:`agentsessions.sdk.native`), which
implements this protocol on top of plain Python values.

Cancel hook. A harness may also define ``async def cancel(self, execution_id: str, reason: str)
-> bool``. It is called when the host cancels a running execution: in-process by the host
itself, behind Connect by the SDK when the host's Cancel frame arrives (the stream sink is
sealed first, so blocked and later sink calls raise ``ExecutionCancelledError``). Return True
when the run will now end by itself (promptly: the host gives it its cancel grace); return False
to have the run cancelled as a task at once. Without the hook the run is cancelled as a task
(in-process), or behind Connect after the SDK's ``cancel_grace``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from agentsessions.sdk.extensions import COMPACTION_PRINCIPAL, RESULTS_PRINCIPAL, SUMMARY_PREFIX
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, harness_pb2

if TYPE_CHECKING:
    from agentsessions.sdk.types import Message

_INPUT = common_pb2.EVENT_INPUT
_OUTPUT = common_pb2.EVENT_OUTPUT
_MODEL_CALL = common_pb2.EVENT_MODEL_CALL
_TOOL_RESULT = common_pb2.EVENT_TOOL_RESULT
_LIFECYCLE = common_pb2.EVENT_LIFECYCLE
_BASELINE = common_pb2.Lifecycle.LIFECYCLE_BASELINE


@struct(frozen=True)
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

    def conversation(self, *, inputs: bool = True) -> list[Message]:
        """The whole prior conversation rebuilt from the journal, then (``inputs``) this
        execution's inputs, as native messages.

        In journal order: every INPUT message; every OUTPUT (a completion, with its tool calls'
        ids settled as :mod:`agentsessions.sdk.callids` does live, or direct assistant text);
        and after a completion, each recorded result answering one of its tool calls as a role
        "tool" message. A tool call that never got a result (a turn that failed, was cancelled
        or still waits for approval) is left out, so the conversation is one a model accepts.
        What the journal never holds (a system prompt) the harness adds itself."""
        return conversation(self.history, self.inputs if inputs else ())


def conversation(
    history: Sequence[common_pb2.Event], inputs: Sequence[common_pb2.Message] = ()
) -> list[Message]:
    """See :meth:`Start.conversation`."""
    # The native types, loaded by the first conversation rather than with this module: a host
    # that only relays the contract's messages never builds them (bench/README.md, start-up).
    from agentsessions.sdk import convert
    from agentsessions.sdk.callids import CallIds
    from agentsessions.sdk.types import Message, ToolCall

    out: list[Message] = []
    ids: dict[str, CallIds] = {}
    after_model: set[str] = set()  # executions whose next OUTPUT is a completion
    open_calls: dict[tuple[str, str], int] = {}  # (execution, call id) -> index in out
    answered: set[tuple[str, str]] = set()
    for event in history:
        kind = event.kind
        execution = event.execution_id
        if kind == _INPUT and event.HasField("message"):
            out.append(convert.message_from_proto(event.message))
        elif kind == _MODEL_CALL:
            after_model.add(execution)
        elif kind == _LIFECYCLE and event.lifecycle.kind == _BASELINE:
            # A compaction's summary stands for everything before it.
            out = [Message.user(SUMMARY_PREFIX + event.lifecycle.detail)]
            after_model.clear()
            open_calls.clear()
        elif kind == _OUTPUT and event.HasField("message"):
            if event.actor.principal in (RESULTS_PRINCIPAL, COMPACTION_PRINCIPAL):
                continue  # the host's own record (a settled result, a summary), not the assistant's
            message = convert.message_from_proto(event.message)
            if execution in after_model:
                after_model.discard(execution)
                message = ids.setdefault(execution, CallIds(execution)).completion(message)
                for call in message.tool_calls:
                    open_calls[(execution, call.id)] = len(out)
            out.append(message)
        elif kind == _TOOL_RESULT and event.HasField("result"):
            key = (execution, event.result.id)
            if key in open_calls and key not in answered:
                answered.add(key)
                out.append(Message.tool(convert.tool_result_from_proto(event.result)))
    unanswered: dict[int, set[str]] = {}
    for key, index in open_calls.items():
        if key not in answered:
            unanswered.setdefault(index, set()).add(key[1])
    emptied: set[int] = set()
    for index, call_ids in unanswered.items():
        kept = tuple(p for p in out[index].parts if not (isinstance(p, ToolCall) and p.id in call_ids))
        out[index] = Message(out[index].role, kept)
        if not kept:
            emptied.add(index)
    if emptied:
        out = [m for index, m in enumerate(out) if index not in emptied]
    out.extend(convert.message_from_proto(m) for m in inputs)
    return out


def message_text(message: common_pb2.Message) -> str:
    """The concatenation of a wire message's text parts."""
    return "".join(p.text.text for p in message.parts if p.WhichOneof("part") == "text")


def text_message(role: str, text: str) -> common_pb2.Message:
    """A wire message holding one text part."""
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
        """Ask the host to call a model; returns the completion (journaled as OUTPUT, and its
        usage, when the provider reports one, as USAGE)."""
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
        """Record token accounting. The host already journals a model call's usage: a usage
        equal to the last model call's is that same accounting and is not journaled again."""
        ...


@runtime_checkable
class RecordedResults(Protocol):
    """Optional sink surface: serving recorded in-harness tool results on replay and recovery.

    ``recorded_effects`` is how many effects of this execution the journal already holds (0 on a
    live turn); ``run_mode`` is "live", "recovery" or "replay". While the harness's effects are
    within the recorded ones, :meth:`recorded_report` returns the recorded result of an
    IN_HARNESS_REPORTED call instead of the harness running the tool again (and consumes that
    effect); past them, the harness runs the tool and reports as usual."""

    recorded_effects: int
    run_mode: str

    async def recorded_report(self, call: common_pb2.ToolCall) -> common_pb2.ToolResult: ...


@runtime_checkable
class ApprovalDetails(Protocol):
    """Optional sink surface: the reason a harness gives an approval request, and the recorded
    decision (with its reason) behind a receipt the sink returned."""

    def approval_reason(self, tool_call_id: str, reason: str) -> None:
        """Say why the next REQUIRES_APPROVAL call with this id needs a decision (journaled as
        the APPROVAL_REQUEST's reason)."""
        ...

    def approval_decision(self, tool_call_id: str) -> common_pb2.ApprovalResult | None: ...


@runtime_checkable
class Harness(Protocol):
    """An agent the host can run: describe it, then run one execution per call (and, optionally,
    ``cancel``: see the module docstring)."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        """What the harness is: id, version, models, tools, capabilities."""
        ...

    async def run(self, start: Start, sink: EventSink) -> None:
        """Run one execution. Returning means COMPLETED; raising means FAILED."""
        ...


def recorded_results(sink: object) -> RecordedResults | None:
    """``sink`` when it offers the recorded-results surface (a cheap check: a protocol
    ``isinstance`` costs tens of microseconds, on every execution)."""
    if callable(getattr(sink, "recorded_report", None)) and hasattr(sink, "recorded_effects"):
        return sink  # type: ignore[return-value]
    return None


def approval_details(sink: object) -> ApprovalDetails | None:
    """``sink`` when it offers the approval-details surface (checked as cheaply)."""
    if callable(getattr(sink, "approval_decision", None)) and callable(
        getattr(sink, "approval_reason", None)
    ):
        return sink  # type: ignore[return-value]
    return None


def require_harness(obj: object, where: str) -> Harness:
    """``obj`` when it is a harness; a TypeError saying what it is instead otherwise."""
    if isinstance(obj, type):
        raise TypeError(
            f"{where} needs a harness object, got the class {obj.__name__}: pass an instance, "
            f"{obj.__name__}()"
        )
    if isinstance(obj, Harness):
        return obj
    missing = " and ".join(name for name in ("describe", "run") if not callable(getattr(obj, name, None)))
    hint = (
        " (a plain function: decorate it with @agentsessions.sdk.define_harness(...))"
        if callable(obj)
        else ""
    )
    raise TypeError(
        f"{where} needs a harness, an object with async describe() and run(start, sink); "
        f"got a {type(obj).__name__} without {missing}{hint}"
    )
