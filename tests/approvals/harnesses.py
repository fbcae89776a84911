"""Harnesses for the approval and lifecycle tests, servable in their own process:
``agentsessions-harness serve tests.approvals.harnesses:ToolHarness --listen 127.0.0.1:0``.

:class:`ToolHarness` asks the echo model about its last input, then makes the tool calls its
execution config lists (JSON ``{"calls": [...], "model": true}``) through ``sink.tool_call`` and
records what it got back as one OUTPUT per call, so a test reads the receipt the harness saw
from the journal. Without a config it makes one REQUIRES_APPROVAL ``stamp`` call whose
arguments carry the model's answer. Everything it emits is derived from the Start and from the
sink's replies, so a re-run of an execution emits the same effects (STATELESS_REPLAY).

:class:`BlockingHarness` emits one OUTPUT and then waits until the host cancels it, told by its
cancel hook (``agentsessions.sdk.harness``): in-process by the host, behind Harness.Connect by the
SDK when the Cancel frame arrives while the harness is busy with its own work.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from google.protobuf import json_format, struct_pb2

from agentsessions.sdk import EventSink, Start, text_message
from agentsessions.sdk.errors import SinkError
from agentsessions.v1 import common_pb2, harness_pb2
from tests.support.harnesses import descriptor

MEDIATIONS = {
    "approval": common_pb2.MEDIATION_REQUIRES_APPROVAL,
    "mediated": common_pb2.MEDIATION_CONTROLLER_MEDIATED,
    "reported": common_pb2.MEDIATION_IN_HARNESS_REPORTED,
    "unspecified": common_pb2.MEDIATION_UNSPECIFIED,
}

# How long a blocked harness waits for a cancel before giving up (bounds a test that goes wrong).
BLOCK_LIMIT_S = 60.0


def receipt_summary(result: common_pb2.ToolResult) -> dict[str, Any]:
    """What a harness learns from a receipt, as a JSON-ready dict (the OUTPUT it records)."""
    return {
        "id": result.id,
        "is_error": result.is_error,
        "code": common_pb2.ToolResult.Code.Name(result.code),
        "error": result.error,
        "content": [p.text.text for p in result.content if p.WhichOneof("part") == "text"],
        "output": json_format.MessageToDict(result.output) if result.HasField("output") else None,
        "approval_request_seq": result.approval_request_seq,
        "approval_decision_seq": result.approval_decision_seq,
    }


def tool_call(spec: dict[str, Any], execution_id: str, index: int, answer: str) -> common_pb2.ToolCall:
    """The ToolCall one config entry asks for; ids and keys derive from the execution."""
    call = common_pb2.ToolCall(
        id=spec.get("id", f"call-{index}"),
        tool=spec.get("tool", "stamp"),
        mediation=MEDIATIONS[spec.get("mediation", "approval")],
        idempotency_key=spec.get("key", f"{execution_id}-{index}"),
    )
    args = spec.get("args", {"text": answer})
    if args is not None:
        struct = struct_pb2.Struct()
        struct.update(args)
        call.args.CopyFrom(struct)
    return call


class ToolHarness:
    """Model call, then the configured tool calls, each answered by one OUTPUT."""

    def __init__(self, harness_id: str = "tooler") -> None:
        self.harness_id = harness_id

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor(self.harness_id)

    async def run(self, start: Start, sink: EventSink) -> None:
        config: dict[str, Any] = json.loads(start.config) if start.config else {}
        answer = ""
        if config.get("model", True):
            result = await sink.model(
                common_pb2.ModelCall(model="echo", messages=[text_message("user", start.last_input_text())])
            )
            answer = "".join(p.text.text for p in result.message.parts)
        calls = config.get("calls", [{}])
        for index, spec in enumerate(calls):
            call = tool_call(spec, start.execution_id, index, answer)
            if spec.get("catch", False):
                try:
                    receipt = await sink.tool_call(call)
                except SinkError as exc:
                    await sink.output(f"refused: {exc}")
                    continue
            else:
                receipt = await sink.tool_call(call)
            await sink.output(json.dumps(receipt_summary(receipt), sort_keys=True))


class BlockingHarness:
    """Emits "working", then waits for its cancel hook and ends by itself."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self._cancelled: dict[str, asyncio.Event] = {}

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor("blocker")

    async def run(self, start: Start, sink: EventSink) -> None:
        cancelled = self._cancelled.setdefault(start.execution_id, asyncio.Event())
        try:
            await sink.output("working")
            self.entered.set()
            async with asyncio.timeout(BLOCK_LIMIT_S):
                await cancelled.wait()
        finally:
            self._cancelled.pop(start.execution_id, None)

    async def cancel(self, execution_id: str, reason: str) -> bool:
        cancelled = self._cancelled.get(execution_id)
        if cancelled is None:
            return False
        cancelled.set()
        return True  # run() returns as soon as it sees the event
