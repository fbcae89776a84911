"""Harnesses for durability tests, each served over a real ``Harness.Connect`` stream on loopback
by ``served`` (the SDK's harness server, in this process, so a test can change a harness between
a live run and its replay, and see every Start it was given)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from google.protobuf import struct_pb2

from agentsessions.sdk import EventSink, Start, text_message
from agentsessions.sdk.harness import Harness, message_text
from agentsessions.sdk.server import start_server
from agentsessions.v1 import common_pb2, harness_pb2

K = common_pb2.EventKind


def descriptor(harness_id: str) -> harness_pb2.HarnessDescriptor:
    return harness_pb2.HarnessDescriptor(
        id=harness_id,
        version="1",
        capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
    )


@contextlib.asynccontextmanager
async def served(harness: Harness) -> AsyncIterator[str]:
    """Serve ``harness`` on a loopback port; yields its address."""
    server = await start_server(harness, "127.0.0.1:0")
    try:
        yield server.address
    finally:
        await server.stop(None)


def conversation(start: Start) -> list[common_pb2.Message]:
    """Every INPUT and OUTPUT message of the history, then this execution's inputs."""
    kinds = (K.EVENT_INPUT, K.EVENT_OUTPUT)
    past = [e.message for e in start.history if e.kind in kinds and e.HasField("message")]
    return [*past, *start.inputs]


class TwoCallChat:
    """Asks the model twice a turn: the conversation, then the conversation plus the first answer.

    The second request carries the first completion, so on replay it only hashes to the recorded
    input (I0) if the first completion came back byte for byte. ``received`` keeps the serialized
    message of every completion the harness was handed, live and on replay.
    """

    def __init__(self) -> None:
        self.received: list[bytes] = []

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor("two-call-chat")

    async def run(self, start: Start, sink: EventSink) -> None:
        messages = conversation(start)
        first = await sink.model(common_pb2.ModelCall(messages=messages))
        self.received.append(first.message.SerializeToString(deterministic=True))
        again = [*messages, first.message, text_message("user", "once more")]
        second = await sink.model(common_pb2.ModelCall(messages=again))
        self.received.append(second.message.SerializeToString(deterministic=True))


class TunableHarness:
    """Writes ``outputs`` directly, then (if ``call_model``) asks the model to echo the last input
    plus ``prompt_suffix``. A test changes these between the live run and the replay."""

    def __init__(self) -> None:
        self.outputs = ["first", "second"]
        self.call_model = True
        self.prompt_suffix = ""

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor("tunable")

    async def run(self, start: Start, sink: EventSink) -> None:
        for text in self.outputs:
            await sink.output(text)
        if self.call_model:
            prompt = text_message("user", start.last_input_text() + self.prompt_suffix)
            await sink.model(common_pb2.ModelCall(model="echo", messages=[prompt]))


class HarnessFailure(RuntimeError):
    """Raised by a harness a test told to fail."""


class StartRecorder:
    """Keeps every Start it is given, writes the inputs it saw, then asks the model to echo the
    last input. With ``fail_next`` the next run fails between the two (the turn is interrupted)."""

    def __init__(self) -> None:
        self.starts: list[Start] = []
        self.fail_next = False

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor("start-recorder")

    async def run(self, start: Start, sink: EventSink) -> None:
        self.starts.append(start)
        await sink.output("saw: " + ", ".join(message_text(m) for m in start.inputs))
        if self.fail_next:
            self.fail_next = False
            raise HarnessFailure("told to fail mid-turn")
        prompt = text_message("user", start.last_input_text())
        await sink.model(common_pb2.ModelCall(model="echo", messages=[prompt]))


def lookup_call() -> common_pb2.ToolCall:
    """The one host-run tool call ``ToolCaller`` makes."""
    args = struct_pb2.Struct()
    args.update({"q": "weather"})
    return common_pb2.ToolCall(
        id="call-1",
        tool="lookup",
        args=args,
        mediation=common_pb2.MEDIATION_CONTROLLER_MEDIATED,
        idempotency_key="lookup-key-1",
    )


class ToolCaller:
    """Asks the host to run ``lookup_call()``, then writes what came back."""

    def __init__(self) -> None:
        self.results: list[common_pb2.ToolResult] = []

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return descriptor("tool-caller")

    async def run(self, start: Start, sink: EventSink) -> None:
        result = await sink.tool_call(lookup_call())
        self.results.append(result)
        await sink.output("tool said: " + "".join(p.text.text for p in result.content))
