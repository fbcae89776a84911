"""The stream-backed sink on its own, over an in-memory stream: serialization, sealing, stale
replies and the watcher that lets a cancel hook hear a Cancel, without a network."""

from __future__ import annotations

import asyncio

import pytest

from agentsessions.sdk import ExecutionCancelledError, ProtocolError, text_message
from agentsessions.sdk.extensions import ConnectExtensions
from agentsessions.sdk.sink import FrameWatcher, StreamSink
from agentsessions.v1 import common_pb2, harness_pb2

EXECUTION = "0123456789abcdef"
WAIT_S = 10


class MemoryStream:
    """Both directions of one Connect stream: events the sink wrote, frames the host will send."""

    def __init__(self) -> None:
        self.events: asyncio.Queue[common_pb2.Event] = asyncio.Queue()
        self.frames: asyncio.Queue[harness_pb2.ControllerFrame | None] = asyncio.Queue()

    async def write(self, event: common_pb2.Event) -> None:
        self.events.put_nowait(event)

    async def read(self) -> harness_pb2.ControllerFrame | None:
        return await self.frames.get()

    async def next_event(self) -> common_pb2.Event:
        async with asyncio.timeout(WAIT_S):
            return await self.events.get()

    def sink(self, **extensions: object) -> StreamSink:
        return StreamSink(
            "s",
            EXECUTION,
            write=self.write,
            read=self.read,
            reply_timeout=WAIT_S,
            extensions=ConnectExtensions(**extensions),  # type: ignore[arg-type]
        )


def reply_to(event: common_pb2.Event, text: str) -> harness_pb2.ControllerFrame:
    return harness_pb2.ControllerFrame(
        session="s",
        execution_id=EXECUTION,
        model=harness_pb2.ModelResult(model_call_id=event.model.id, message=text_message("assistant", text)),
    )


async def test_one_request_is_outstanding_at_a_time() -> None:
    stream = MemoryStream()
    sink = stream.sink()
    first = asyncio.create_task(sink.model(common_pb2.ModelCall(model="a")))
    event = await stream.next_event()
    assert event.model.model == "a"

    entered = asyncio.Event()

    async def second_call() -> harness_pb2.ModelResult:
        entered.set()
        return await sink.model(common_pb2.ModelCall(model="b"))

    second = asyncio.create_task(second_call())
    await entered.wait()
    await asyncio.sleep(0)  # give the second call every chance to write (it must not)
    assert stream.events.empty()  # the second call waits for the first reply
    stream.frames.put_nowait(reply_to(event, "to a"))
    async with asyncio.timeout(WAIT_S):
        assert (await first).message == text_message("assistant", "to a")
    event = await stream.next_event()
    assert event.model.model == "b" and event.model.id != ""
    stream.frames.put_nowait(reply_to(event, "to b"))
    async with asyncio.timeout(WAIT_S):
        assert (await second).message == text_message("assistant", "to b")


async def test_a_stale_reply_fails_the_call_that_reads_it_and_seals_the_sink() -> None:
    stream = MemoryStream()
    sink = stream.sink()
    stream.frames.put_nowait(
        harness_pb2.ControllerFrame(execution_id=EXECUTION, tool=common_pb2.ToolResult(id="x"))
    )
    with pytest.raises(ProtocolError, match="expected a ModelResult frame, got tool frame"):
        await sink.model(common_pb2.ModelCall(model="a"))
    with pytest.raises(ProtocolError, match="expected a ModelResult frame"):
        await sink.output("anything")


async def test_abandoned_call_makes_the_stream_unusable() -> None:
    stream = MemoryStream()
    sink = stream.sink()
    call = asyncio.create_task(sink.model(common_pb2.ModelCall(model="a")))
    await stream.next_event()  # the call is waiting for its reply
    call.cancel()
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(call, return_exceptions=True)
    with pytest.raises(ProtocolError, match="abandoned"):
        await sink.usage(common_pb2.Usage())


async def test_the_host_closing_its_side_fails_a_waiting_call() -> None:
    stream = MemoryStream()
    sink = stream.sink()
    stream.frames.put_nowait(None)
    with pytest.raises(ProtocolError, match="host closed the Connect stream before replying"):
        await sink.model(common_pb2.ModelCall(model="a"))


async def test_a_cancel_read_in_place_of_a_reply_seals_the_sink_and_tells_the_servicer() -> None:
    stream = MemoryStream()
    sink = stream.sink()
    told: list[str] = []
    sink.on_cancel = told.append
    stream.frames.put_nowait(
        harness_pb2.ControllerFrame(execution_id=EXECUTION, cancel=harness_pb2.Cancel(reason="stop"))
    )
    with pytest.raises(ExecutionCancelledError, match="stop"):
        await sink.model(common_pb2.ModelCall(model="a"))
    with pytest.raises(ExecutionCancelledError):
        await sink.output("after")
    assert told == ["stop"] and sink.cancel_reason == "stop"


async def test_the_watcher_hands_replies_over_and_refuses_unsolicited_ones() -> None:
    stream = MemoryStream()
    sink = stream.sink()
    cancels: list[str] = []

    async def on_cancel(reason: str) -> None:
        cancels.append(reason)

    watcher = FrameWatcher(EXECUTION, on_cancel)
    sink.reader = watcher.read
    watching = asyncio.create_task(watcher.watch(sink, stream.read))
    try:
        call = asyncio.create_task(sink.model(common_pb2.ModelCall(model="a")))
        event = await stream.next_event()
        stream.frames.put_nowait(reply_to(event, "hello"))
        async with asyncio.timeout(WAIT_S):
            assert (await call).message.parts[0].text.text == "hello"
        # Nobody asked for this one: the watcher sees it arrive outside a call.
        stream.frames.put_nowait(reply_to(event, "again"))
        stream.frames.put_nowait(
            harness_pb2.ControllerFrame(execution_id=EXECUTION, cancel=harness_pb2.Cancel(reason="late"))
        )
        stream.frames.put_nowait(None)
        async with asyncio.timeout(WAIT_S):
            await watching
        with pytest.raises(ProtocolError, match="unsolicited model frame"):
            await sink.output("x")
        assert cancels == ["late"]
    finally:
        watching.cancel()
