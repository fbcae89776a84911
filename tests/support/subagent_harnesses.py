"""Harnesses for the subagent tests, served in-process or in their own process
(``agentsessions-harness serve tests.support.subagent_harnesses:Delegator`` / ``:Worker``).

:class:`Delegator` asks for the host's ``task`` tool. Its turn: one model call on the user's input;
each ``task`` call the completion proposes is made, in order (REQUIRES_APPROVAL, idempotency key
``<execution id>/<call id>``); then it outputs one line per result (``ok <text>`` or ``error <error>``).
Everything it asks for comes from what the host returned, so a re-driven run asks for exactly what
was recorded.

:class:`Worker` is a child. Its prompt is JSON: ``{"name": N, "dir": D, "hold": bool, "fail": bool}``.
It outputs ``working on N``, runs the host's ``record_effect`` tool once (key ``<execution id>/effect``,
so the effect file shows each child's effect exactly once; with ``hold`` the tool waits for
``D/release``), then outputs ``done N``; with ``fail`` it fails after its first output instead. With
``stop_after_effect`` it waits for ``D/release`` after the effect, in the harness (a line in
``D/stopped`` says it stands there).
A prompt that is not JSON is simply echoed back as ``done <prompt>``.

The Delegator's Describe waits at the gate of ``tests.support.describe_gate`` while its process's
working directory holds the gate's file (in process, the file is never there).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from google.protobuf import struct_pb2

from agentsessions.sdk import EventSink, Start, message_text, text_message
from agentsessions.v1 import common_pb2, harness_pb2
from tests.support import describe_gate

TASK = "task"
EFFECT_TOOL = "record_effect"
RELEASE = "release"
STOPPED = "stopped"
HOLD_LIMIT_S = 60.0
POLL_S = 0.02


def _text(result: common_pb2.ToolResult) -> str:
    return "".join(p.text.text for p in result.content if p.WhichOneof("part") == "text")


class Delegator:
    """Delegates what its model proposes to subagents (see the module doc)."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        await describe_gate.hold_while_asked()  # a crash test may hold the host at this Describe
        return harness_pb2.HarnessDescriptor(
            id="delegator",
            version="1",
            models=["scripted"],
            tools=[harness_pb2.ToolSpec(name=TASK, mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL)],
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        prompt = text_message("user", start.last_input_text())
        reply = await sink.model(common_pb2.ModelCall(messages=[prompt]))
        proposed = [p.tool_call for p in reply.message.parts if p.WhichOneof("part") == "tool_call"]
        lines = []
        for proposal in proposed:
            result = await sink.tool_call(
                common_pb2.ToolCall(
                    id=proposal.id,
                    tool=proposal.tool,
                    args=proposal.args,
                    mediation=common_pb2.MEDIATION_REQUIRES_APPROVAL,
                    idempotency_key=f"{start.execution_id}/{proposal.id}",
                )
            )
            lines.append(f"error {result.error}" if result.is_error else f"ok {_text(result)}")
        await sink.output("\n".join(lines) or message_text(reply.message))


class Worker:
    """A child that does one counted effect (see the module doc)."""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id="worker",
            version="1",
            models=["scripted"],
            tools=[
                harness_pb2.ToolSpec(name=EFFECT_TOOL, mediation=common_pb2.MEDIATION_CONTROLLER_MEDIATED)
            ],
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        prompt = start.last_input_text()
        try:
            job: dict[str, Any] = json.loads(prompt)
        except ValueError:
            await sink.output(f"done {prompt}")
            return
        name = str(job["name"])
        await sink.output(f"working on {name}")
        if job.get("fail"):
            raise RuntimeError(f"worker {name} failed on purpose")
        if job.get("dir"):
            args = struct_pb2.Struct()
            args.update({"dir": str(job["dir"]), "hold": bool(job.get("hold")), "note": name})
            await sink.tool_call(
                common_pb2.ToolCall(
                    id="effect",
                    tool=EFFECT_TOOL,
                    args=args,
                    mediation=common_pb2.MEDIATION_CONTROLLER_MEDIATED,
                    idempotency_key=f"{start.execution_id}/effect",
                )
            )
            if job.get("stop_after_effect"):
                await _stop(Path(str(job["dir"])), name)
        await sink.output(f"done {name}")


async def _stop(control: Path, name: str) -> None:
    """Wait (bounded) for ``control/release``, announcing the stop as a line in ``control/stopped``."""
    if (control / RELEASE).exists():
        return
    with (control / STOPPED).open("a") as stops:
        stops.write(name + "\n")
    async with asyncio.timeout(HOLD_LIMIT_S):
        # Polled: the release marker comes from another process.
        while not (control / RELEASE).exists():  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)
