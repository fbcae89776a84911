"""The stream-backed sink on its own: serialization and unsolicited replies, without a network."""

from __future__ import annotations

import asyncio

import pytest

from agentsessions.sdk import ProtocolError, text_message
from agentsessions.sdk.server import StreamSink
from agentsessions.v1 import common_pb2, harness_pb2

EXECUTION = "0123456789abcdef"


WAIT_S = 10


def reply_to(event: common_pb2.Event, text: str) -> harness_pb2.ControllerFrame:
    return harness_pb2.ControllerFrame(
        session="s",
        execution_id=EXECUTION,
        model=harness_pb2.ModelResult(model_call_id=event.model.id, message=text_message("assistant", text)),
    )


async def next_event(sink: StreamSink) -> common_pb2.Event:
    """The next event the sink hands to the stream, as soon as it is there."""
    async with asyncio.timeout(WAIT_S):
        item = await sink.outbox.get()
    assert item is not None
    return item[0]


async def test_one_request_is_outstanding_at_a_time() -> None:
    sink = StreamSink("s", EXECUTION, reply_timeout=10)
    first = asyncio.create_task(sink.model(common_pb2.ModelCall(model="a")))
    event = await next_event(sink)
    assert event.model.model == "a"

    entered = asyncio.Event()

    async def second_call() -> harness_pb2.ModelResult:
        entered.set()
        # Runs on without yielding until the sink makes it wait: when the test wakes, it is blocked.
        return await sink.model(common_pb2.ModelCall(model="b"))

    second = asyncio.create_task(second_call())
    await entered.wait()
    assert sink.outbox.empty()  # the second call waits for the first reply
    sink.deliver(reply_to(event, "to a"))
    async with asyncio.timeout(WAIT_S):
        assert (await first).message == text_message("assistant", "to a")
    event = await next_event(sink)
    assert event.model.model == "b" and event.model.id != ""
    sink.deliver(reply_to(event, "to b"))
    async with asyncio.timeout(WAIT_S):
        assert (await second).message == text_message("assistant", "to b")


async def test_unsolicited_reply_fails_the_next_call() -> None:
    sink = StreamSink("s", EXECUTION, reply_timeout=10)
    sink.deliver(harness_pb2.ControllerFrame(execution_id=EXECUTION, tool=common_pb2.ToolResult(id="x")))
    with pytest.raises(ProtocolError, match="unsolicited tool frame"):
        await sink.output("anything")


async def test_abandoned_call_makes_the_stream_unusable() -> None:
    sink = StreamSink("s", EXECUTION, reply_timeout=10)
    call = asyncio.create_task(sink.model(common_pb2.ModelCall(model="a")))
    await next_event(sink)  # the call is waiting for its reply
    call.cancel()
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(call, return_exceptions=True)
    with pytest.raises(ProtocolError, match="abandoned"):
        await sink.usage(common_pb2.Usage())
