"""A harness for crash tests, served in its own process:
``agentsessions-harness serve tests.support.crash_harness:CrashHarness --listen unix:PATH``.

Its turn is a fixed script that touches every kind of effect, each input derived only from what
the host returned before (so a recovered run asks for exactly what was recorded):

1. model call (the user's input) -> completion A
2. usage report
3. CONTROLLER_MEDIATED tool call ``call-1`` to ``record_effect``, idempotency key
   ``<execution id>/call-1``, with A in its arguments
4. in-harness tool result ``report-1`` (reported, not executed by the host)
5. model call (input, A, the tool's result) -> completion B
6. usage report
7. output ``done: B``

The turn's config is JSON: ``{"dir": <control directory>, "cut": <cut point>, "approval": <bool>}``
(with ``approval`` the tool call is REQUIRES_APPROVAL: the first run parks at it). At the cut point
the run stops and waits for a ``dir/release`` marker (adding a line to ``dir/blocked``), so the host is
idle there, provably past the point. A test creates the marker before it recovers the turn, so a
later incarnation runs straight through. ``during_tool_call`` is held by the tool itself (it gets
``hold`` in its arguments); ``during_model_call`` by the model endpoint.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from google.protobuf import struct_pb2

from agentsessions.sdk import EventSink, Start, message_text, text_message
from agentsessions.v1 import common_pb2, harness_pb2

BLOCKED = "blocked"
RELEASE = "release"
TOOL = "record_effect"
TOOL_CALL_ID = "call-1"
REPORT_ID = "report-1"
USAGE = common_pb2.Usage(model="chaos", input_tokens=3, output_tokens=5)

# Where a first incarnation can be stopped, in script order.
CUT_POINTS = (
    "during_model_call",
    "after_model_call",
    "after_usage",
    "during_tool_call",
    "after_tool_call",
    "after_tool_result",
    "after_output",
)

# A held run gives up after this long, so a test that never releases it still ends.
HOLD_LIMIT_S = 60.0
POLL_S = 0.02


def turn_config(control: Path, cut: str, *, approval: bool = False) -> bytes:
    """The Exec config that makes a CrashHarness turn stop at ``cut``; with ``approval`` its
    tool call is REQUIRES_APPROVAL instead of CONTROLLER_MEDIATED."""
    return json.dumps({"dir": str(control), "cut": cut, "approval": approval}, sort_keys=True).encode()


def idempotency_key(execution_id: str) -> str:
    return f"{execution_id}/{TOOL_CALL_ID}"


class CrashHarness:
    """Runs the script above; stops at the configured cut point until released."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id="crash",
            version="1",
            models=["chaos"],
            tools=[harness_pb2.ToolSpec(name=TOOL, mediation=common_pb2.MEDIATION_CONTROLLER_MEDIATED)],
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        config: dict[str, Any] = json.loads(start.config)
        control = Path(str(config["dir"]))
        cut = str(config.get("cut", ""))
        prompt = text_message("user", start.last_input_text())

        first = await sink.model(common_pb2.ModelCall(messages=[prompt]))
        answer = message_text(first.message)
        await _stop_if(control, cut, "after_model_call")

        await sink.usage(USAGE)
        await _stop_if(control, cut, "after_usage")

        args = struct_pb2.Struct()
        args.update({"dir": str(control), "hold": cut == "during_tool_call", "note": answer})
        result = await sink.tool_call(
            common_pb2.ToolCall(
                id=TOOL_CALL_ID,
                tool=TOOL,
                args=args,
                mediation=(
                    common_pb2.MEDIATION_REQUIRES_APPROVAL
                    if config.get("approval")
                    else common_pb2.MEDIATION_CONTROLLER_MEDIATED
                ),
                idempotency_key=idempotency_key(start.execution_id),
            )
        )
        tool_text = "".join(p.text.text for p in result.content if p.WhichOneof("part") == "text")
        await _stop_if(control, cut, "after_tool_call")

        await sink.report(
            common_pb2.ToolResult(
                id=REPORT_ID,
                content=[common_pb2.Part(text=common_pb2.TextPart(text=f"checked: {tool_text}"))],
            )
        )
        await _stop_if(control, cut, "after_tool_result")

        second = await sink.model(
            common_pb2.ModelCall(
                messages=[prompt, text_message("assistant", answer), text_message("user", tool_text)]
            )
        )
        await sink.usage(USAGE)
        await sink.output(f"done: {message_text(second.message)}")
        await _stop_if(control, cut, "after_output")


async def _stop_if(control: Path, cut: str, point: str) -> None:
    """At the cut point of a first incarnation, wait for the release marker (bounded)."""
    if cut != point or (control / RELEASE).exists():
        return
    with (control / BLOCKED).open("a") as stops:  # one line per run that stopped
        stops.write(point + "\n")
    async with asyncio.timeout(HOLD_LIMIT_S):
        # Polled: the release marker comes from another process.
        while not (control / RELEASE).exists():  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)
