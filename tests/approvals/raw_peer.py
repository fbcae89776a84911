"""A raw Harness peer that converses frame by frame, to check the host's side of Connect.

The script gets a :class:`Conversation`: the Start frame, ``recv()`` for the next host frame
(None at the host's half-close) and ``send(event)``. Every frame the host sent is kept in
``frames`` so a test can assert the exact exchange (park frame, approval then tool frame, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from grpc import aio

from agentsessions.v1 import common_pb2, harness_pb2
from tests.support.raw_harness import RawHarnessServicer, serve_harness

RECV_LIMIT_S = 30.0


class Conversation:
    def __init__(
        self, start: harness_pb2.ControllerFrame, frames: AsyncIterator[harness_pb2.ControllerFrame]
    ):
        self.start = start
        self.execution_id = start.execution_id
        self._frames = frames
        self.received: list[harness_pb2.ControllerFrame] = []
        self.outbox: asyncio.Queue[common_pb2.Event | None] = asyncio.Queue()

    async def recv(self) -> harness_pb2.ControllerFrame | None:
        async with asyncio.timeout(RECV_LIMIT_S):
            frame = await anext(self._frames, None)
        if frame is not None:
            self.received.append(frame)
        return frame

    def send(self, event: common_pb2.Event) -> None:
        if not event.execution_id:
            event.execution_id = self.execution_id
        self.outbox.put_nowait(event)


Script = Callable[[Conversation], Coroutine[Any, Any, None]]


class RawPeer(RawHarnessServicer):
    def __init__(self, script: Script, harness_id: str = "raw") -> None:
        super().__init__(harness_id)
        self.script = script
        self.conversations: list[Conversation] = []

    async def Connect(
        self, request_iterator: AsyncIterator[harness_pb2.ControllerFrame], context: aio.ServicerContext
    ) -> AsyncIterator[common_pb2.Event]:
        frames = aiter(request_iterator)
        start = await anext(frames)
        conversation = Conversation(start, frames)
        self.conversations.append(conversation)
        task = asyncio.create_task(self.script(conversation))
        task.add_done_callback(lambda _: conversation.outbox.put_nowait(None))
        try:
            while (event := await conversation.outbox.get()) is not None:
                yield event
            await task
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


@contextlib.asynccontextmanager
async def raw_peer(script: Script, harness_id: str = "raw") -> AsyncIterator[tuple[str, RawPeer]]:
    """Serve a scripted peer on a loopback port; yields (address, servicer)."""
    servicer = RawPeer(script, harness_id)
    async with serve_harness(servicer) as address:
        yield address, servicer


def tool_call_event(call: common_pb2.ToolCall) -> common_pb2.Event:
    return common_pb2.Event(kind=common_pb2.EVENT_TOOL_CALL, tool=call)


def parked_event(ref: common_pb2.ApprovalRef) -> common_pb2.Event:
    return common_pb2.Event(kind=common_pb2.EVENT_PARKED, parked=ref)


def end_event(state: str = "COMPLETED") -> common_pb2.Event:
    return common_pb2.Event(kind=common_pb2.EVENT_END, end=common_pb2.HarnessEnd(state=state))
