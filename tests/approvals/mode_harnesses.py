"""A harness and host tools for the mode tests, the harness servable in its own process:
``agentsessions-harness serve tests.approvals.mode_harnesses:ModeHarness --listen 127.0.0.1:0``.

:class:`ModeHarness` declares tool classes in its descriptor (``[tool-class: ...]``) and makes the
tool calls its execution config lists (``{"calls": [{"tool": ..., "mediation": ..., "args": ...}]}``),
whatever the session's mode: it is the harness that "would allow it". After each call it records
one OUTPUT (JSON) with the mode the host told it, the receipt and the decision behind it (with the
decision's reason), so a test reads what the harness saw from the journal.

``write_note`` / ``read_note`` are host-run Python tools with a real effect: a file in a directory
the call names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentsessions.sdk import EventSink, Start
from agentsessions.sdk.errors import SinkError
from agentsessions.sdk.harness import approval_details
from agentsessions.sdk.modes import with_tool_classes
from agentsessions.v1 import harness_pb2
from tests.approvals.harnesses import receipt_summary, tool_call

DEFAULT_CLASSES: dict[str, Sequence[str]] = {
    "write_note": ["write"],
    "read_note": ["read-only"],
    "run": ["subprocess"],
}


class ModeHarness:
    """Makes the configured calls and records what came back (see the module docstring)."""

    def __init__(self, classes: Mapping[str, Sequence[str]] | None = None) -> None:
        self.classes = dict(DEFAULT_CLASSES if classes is None else classes)

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id="moder",
            version="1",
            models=["echo"],
            tools=[
                harness_pb2.ToolSpec(name=name, description=with_tool_classes(f"the {name} tool", classes))
                for name, classes in self.classes.items()
            ],
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        config: dict[str, Any] = json.loads(start.config) if start.config else {}
        details = approval_details(sink)
        for index, spec in enumerate(config.get("calls", [])):
            call = tool_call(spec, start.execution_id, index, "")
            seen: dict[str, Any] = {"host_mode": getattr(sink, "host_mode", "")}
            try:
                seen["receipt"] = receipt_summary(await sink.tool_call(call))
            except SinkError as exc:
                if not spec.get("catch", False):
                    raise
                seen["refused"] = str(exc)
            decision = details.approval_decision(call.id) if details is not None else None
            if decision is not None:
                seen["decision"] = {"approved": decision.approved, "reason": decision.reason}
            await sink.output(json.dumps(seen, sort_keys=True))


def write_note(args: dict[str, Any], context: object) -> dict[str, Any]:
    """Write a note file."""
    path = Path(args["dir"]) / args.get("name", "note.txt")
    path.write_text(args.get("text", ""), encoding="utf-8")
    return {"written": str(path)}


def read_note(args: dict[str, Any], context: object) -> dict[str, Any]:
    """Read a note file."""
    path = Path(args["dir"]) / args.get("name", "note.txt")
    return {"text": path.read_text(encoding="utf-8") if path.exists() else ""}
