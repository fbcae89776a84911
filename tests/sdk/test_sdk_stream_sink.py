"""The stream-backed sink on its own: serialization and unsolicited replies, without a network."""

from __future__ import annotations

import asyncio

import pytest

from agentsessions.sdk import ProtocolError, text_message
from agentsessions.sdk.server import StreamSink
from agentsessions.v1 import common_pb2, harness_pb2

EXECUTION = "0123456789abcdef"


async def settle() -> None:
    """Let every ready task run until it blocks."""
    for _ in range(10):
        await asyncio.sleep(0)


def reply_to(event: common_pb2.Event, text: str) -> harness_pb2.ControllerFrame:
    return harness_pb2.ControllerFrame(
        session="s",
        execution_id=EXECUTION,
        model=harness_pb2.ModelResult(model_call_id=event.model.id, message=text_message("assistant", text)),
    )


async def next_event(sink: StreamSink) -> common_pb2.Event:
    item = sink.outbox.get_nowait()
    assert item is not None
    return item[0]


async def test_one_request_is_outstanding_at_a_time() -> None:
    sink = StreamSink("s", EXECUTION, reply_timeout=10)
    first = asyncio.create_task(sink.model(common_pb2.ModelCall(model="a")))
    second = asyncio.create_task(sink.model(common_pb2.ModelCall(model="b")))
    await settle()
    assert sink.outbox.qsize() == 1  # the second call waits for the first reply
    event = await next_event(sink)
    assert event.model.model == "a"
    sink.deliver(reply_to(event, "to a"))
    await settle()
    assert first.done() and first.result().message == text_message("assistant", "to a")
    event = await next_event(sink)
    assert event.model.model == "b" and event.model.id != ""
    sink.deliver(reply_to(event, "to b"))
    async with asyncio.timeout(10):
        assert (await second).message == text_message("assistant", "to b")


async def test_unsolicited_reply_fails_the_next_call() -> None:
    sink = StreamSink("s", EXECUTION, reply_timeout=10)
    sink.deliver(harness_pb2.ControllerFrame(execution_id=EXECUTION, tool=common_pb2.ToolResult(id="x")))
    with pytest.raises(ProtocolError, match="unsolicited tool frame"):
        await sink.output("anything")


async def test_abandoned_call_makes_the_stream_unusable() -> None:
    sink = StreamSink("s", EXECUTION, reply_timeout=10)
    call = asyncio.create_task(sink.model(common_pb2.ModelCall(model="a")))
    await settle()
    call.cancel()
    await settle()
    with pytest.raises(ProtocolError, match="abandoned"):
        await sink.usage(common_pb2.Usage())
