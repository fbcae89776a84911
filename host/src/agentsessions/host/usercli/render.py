"""What the client commands print: sessions and records for a person, proto3 JSON for scripts.

``--json`` prints each message as one line of proto3 JSON (camelCase field names, enum names):
one object for a unary call, one line per item for a stream (``list``, ``log``, ``exec``).

For a person, :class:`TurnView` renders a stream of Exec frames as it arrives: model output as
running text (the deltas), then tool calls, tool results, approvals, usage and errors on lines of
their own. It takes records from any source, so ``log`` and ``watch`` (LiveSessions.Watch, each
record as it becomes durable) use it too.
"""

from __future__ import annotations

import json
import sys
from dataclasses import field
from datetime import UTC, datetime
from typing import Any, TextIO

from google.protobuf import json_format
from google.protobuf.message import Message

from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2

K = common_pb2.EventKind
_ARGS_LIMIT = 160


def to_json(message: Message) -> str:
    """One line of proto3 JSON."""
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":"), ensure_ascii=False)


def state_name(session: session_pb2.Session) -> str:
    return session_pb2.ExecState.Name(session.exec_state).removeprefix("EXEC_")


def compute_name(session: session_pb2.Session) -> str:
    return session_pb2.ComputeState.Name(session.compute_state).removeprefix("COMPUTE_")


def kind_name(kind: common_pb2.EventKind.ValueType) -> str:
    return K.Name(kind).removeprefix("EVENT_")


def _time(stamp: Any) -> str:
    if not stamp.seconds and not stamp.nanos:
        return "-"
    moment = datetime.fromtimestamp(stamp.seconds + stamp.nanos / 1e9, UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def session_row_header() -> str:
    return f"{'UID':<29} {'STATE':<10} {'COMPUTE':<10} {'SEQ':>5}  {'HARNESS':<12} NAME"


def session_row(session: session_pb2.Session) -> str:
    """One line of ``list``."""
    return (
        f"{session.metadata.uid:<29} {state_name(session):<10} {compute_name(session):<10} "
        f"{session.last_seq:>5}  {session.harness:<12} {session.metadata.name}"
    ).rstrip()


def session_details(session: session_pb2.Session) -> list[str]:
    """The lines of ``get``."""
    meta = session.metadata
    rows = [
        ("uid", meta.uid),
        ("project", meta.project),
        ("name", meta.name or "-"),
        ("harness", session.harness or "-"),
        ("model", session.model or "-"),
        ("state", f"{state_name(session)} (compute {compute_name(session)})"),
        ("last seq", str(session.last_seq)),
    ]
    if session.parent_uid:
        rows.append(("forked from", f"{session.parent_uid} at seq {session.fork_seq}"))
    if session.HasField("pending_approval"):
        ref = session.pending_approval
        rows.append(
            (
                "pending",
                f"call {ref.tool_call_id} of execution {ref.execution_id} (request #{ref.request_seq})",
            )
        )
    if session.labels:
        rows.append(("labels", ", ".join(f"{k}={v}" for k, v in sorted(session.labels.items()))))
    if session.annotations:
        rows.append(("annotations", ", ".join(f"{k}={v}" for k, v in sorted(session.annotations.items()))))
    rows.append(("created", _time(meta.create_time)))
    rows.append(("updated", _time(meta.update_time)))
    return [f"{name:<12} {value}" for name, value in rows]


def message_text(message: common_pb2.Message) -> str:
    return "".join(part.text.text for part in message.parts if part.WhichOneof("part") == "text")


def _compact(value: Message) -> str:
    text = json.dumps(
        json_format.MessageToDict(value), separators=(",", ":"), ensure_ascii=False, sort_keys=True
    )
    return text if len(text) <= _ARGS_LIMIT else text[: _ARGS_LIMIT - 1] + "…"


def _actor(identity: common_pb2.IdentityRef) -> str:
    return identity.principal or "an unnamed caller"


_MEDIATION = {
    common_pb2.MEDIATION_CONTROLLER_MEDIATED: "run by the host",
    common_pb2.MEDIATION_REQUIRES_APPROVAL: "run by the host after approval",
    common_pb2.MEDIATION_IN_HARNESS_REPORTED: "run by the harness",
}

_LIFECYCLE = {
    common_pb2.Lifecycle.LIFECYCLE_SUSPEND: "suspended",
    common_pb2.Lifecycle.LIFECYCLE_RESUME: "resumed",
    common_pb2.Lifecycle.LIFECYCLE_FORK: "forked from",
    common_pb2.Lifecycle.LIFECYCLE_BASELINE: "baseline",
    common_pb2.Lifecycle.LIFECYCLE_CANCEL: "cancelled",
}


def record_line(record: common_pb2.LogRecord) -> str:
    """``#seq KIND detail hash`` for ``log``: every record on one line."""
    event = record.event
    body = event.WhichOneof("body")
    detail = ""
    if body == "message":
        detail = json.dumps(message_text(event.message), ensure_ascii=False)
        calls = [p.tool_call.tool for p in event.message.parts if p.WhichOneof("part") == "tool_call"]
        if calls:
            detail += f" +calls {','.join(calls)}"
    elif body == "execution_start":
        start = event.execution_start
        detail = f"harness={start.harness} version={start.harness_version} inputs={start.input_count}"
    elif body == "model":
        detail = f"model={event.model.model} input_hash={event.model.input_hash[:12]}"
    elif body == "tool":
        detail = f"{event.tool.tool} id={event.tool.id} {common_pb2.Mediation.Name(event.tool.mediation)}"
    elif body == "result":
        detail = f"id={event.result.id} " + ("error" if event.result.is_error else "ok")
    elif body == "approval":
        detail = f"call={event.approval.tool_call_id}"
    elif body == "approval_result":
        verdict = "approved" if event.approval_result.approved else "denied"
        detail = f"{verdict} request=#{event.approval_result.request_seq} by {_actor(event.actor)}"
    elif body == "usage":
        detail = f"in={event.usage.input_tokens} out={event.usage.output_tokens}"
    elif body == "lifecycle":
        kind = common_pb2.Lifecycle.Kind.Name(event.lifecycle.kind).removeprefix("LIFECYCLE_")
        detail = f"{kind} {event.lifecycle.detail}".strip()
    elif body == "end":
        detail = event.end.state
    elif body == "error":
        detail = event.error.description
    return f"#{record.seq:<4} {kind_name(event.kind):<16} {detail}  {record.content_hash[:16]}"


@struct
class TurnView:
    """Renders Exec frames (or any records) for a person, as they arrive.

    ``outcome`` is what the stream showed: "completed", "failed", "cancelled", "awaiting", or ""
    when no execution ended in it.
    """

    out: TextIO = field(default_factory=lambda: sys.stdout)
    verbose: bool = False
    outcome: str = ""
    failure: str = ""
    parked: session_pb2.Session | None = None
    _streamed: bool = False
    _line_open: bool = False
    _tools: dict[str, str] = field(default_factory=dict)

    def update(self, update: session_pb2.ExecUpdate) -> None:
        which = update.WhichOneof("update")
        if which == "delta":
            self.delta(update.delta)
        elif which == "record":
            self.record(update.record)
        elif which == "session" and update.session.HasField("pending_approval"):
            self.parked = update.session
            self.outcome = "awaiting"

    def state(self, session: session_pb2.Session) -> None:
        """A change of the session's derived state (``watch``)."""
        self._say(f"   [{state_name(session).lower()}]")

    def queue(self, turns: int) -> None:
        """The session's queued turns changed (``watch``)."""
        self._say(f"   [{turns} turn(s) queued]" if turns else "   [no turns queued]")

    def learn(self, record: common_pb2.LogRecord) -> None:
        """Take what an earlier record says (tool names) without printing it."""
        if record.event.kind == K.EVENT_TOOL_CALL:
            self._tools[record.event.tool.id] = record.event.tool.tool

    def delta(self, delta: session_pb2.Delta) -> None:
        if delta.chunk:
            self._write(delta.chunk)
            self._streamed = True
        if delta.done:
            self._close_line()

    def record(self, record: common_pb2.LogRecord) -> None:
        event = record.event
        kind = event.kind
        if self.verbose:
            self._say(f"  {record_line(record)}")
        if kind == K.EVENT_INPUT:
            self._say(f"> {message_text(event.message)}")
        elif kind == K.EVENT_MODEL_CALL:
            self._streamed = False
        elif kind == K.EVENT_OUTPUT:
            self._output(event.message)
        elif kind == K.EVENT_TOOL_CALL:
            self._tools[event.tool.id] = event.tool.tool
            mediation = _MEDIATION.get(event.tool.mediation, "")
            self._say(f"-> {event.tool.tool} {_compact(event.tool.args)} ({mediation})")
        elif kind == K.EVENT_TOOL_RESULT:
            self._result(event.result)
        elif kind == K.EVENT_APPROVAL_REQUEST:
            tool = self._tools.get(event.approval.tool_call_id, "a tool call")
            self._say(
                f"?  {tool} awaits approval (call {event.approval.tool_call_id}, request #{record.seq})"
            )
        elif kind == K.EVENT_APPROVAL_RESULT:
            decision = event.approval_result
            verdict = "approved" if decision.approved else "denied"
            reason = f": {decision.reason}" if decision.reason else ""
            self._say(f"=  {verdict} by {_actor(event.actor)}{reason}")
        elif kind == K.EVENT_USAGE:
            usage = event.usage
            self._say(
                f"   usage: {usage.input_tokens} input + {usage.output_tokens} output tokens ({usage.model})"
            )
        elif kind == K.EVENT_LIFECYCLE:
            self._lifecycle(event.lifecycle)
        elif kind == K.EVENT_ERROR:
            self.outcome, self.failure = "failed", event.error.description
            self._say(f"!  error: {event.error.description}")
        elif kind == K.EVENT_END:
            self._end(event.end)

    def _output(self, message: common_pb2.Message) -> None:
        text = message_text(message)
        if not self._streamed and text:
            self._write(text)
        self._close_line()
        self._streamed = False
        for part in message.parts:
            if part.WhichOneof("part") == "tool_call":
                self._tools[part.tool_call.id] = part.tool_call.tool

    def _result(self, result: common_pb2.ToolResult) -> None:
        tool = self._tools.get(result.id, result.id)
        if result.code == common_pb2.ToolResult.APPROVAL_DENIED:
            self._say(f"<- {tool}: not run, the approval was denied")
        elif result.is_error:
            self._say(f"<- {tool}: error: {result.error}")
        elif result.HasField("output"):
            self._say(f"<- {tool}: {_compact(result.output)}")
        else:
            self._say(f"<- {tool}: {message_text(common_pb2.Message(parts=result.content)) or 'ok'}")

    def _lifecycle(self, lifecycle: common_pb2.Lifecycle) -> None:
        what = _LIFECYCLE.get(lifecycle.kind, "lifecycle")
        detail = f" {lifecycle.detail}" if lifecycle.detail else ""
        if lifecycle.kind == common_pb2.Lifecycle.LIFECYCLE_CANCEL:
            self.outcome = "cancelled"
        self._say(f"   ({what}{detail})")

    def _end(self, end: common_pb2.HarnessEnd) -> None:
        if end.state == "COMPLETED":
            self.outcome = "completed"
            return
        self.outcome = "cancelled" if end.state == "CANCELED" else "failed"
        self.failure = end.error.description or end.state
        self._say(f"!  turn ended {end.state}: {self.failure}")

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self._line_open = not text.endswith("\n")

    def _close_line(self) -> None:
        if self._line_open:
            self._write("\n")

    def _say(self, line: str) -> None:
        self._close_line()
        self._write(line + "\n")
