"""Streamed model text as Delta frames (issue #15 item 3): batched by size and time, a reply that
arrived whole is one ``done`` frame, a big output costs a frame per KiB, and one session's long
stream does not hold up another session's turn."""

from __future__ import annotations

import asyncio
import math

from agentsessions.host.controller.deltas import DeltaBatching, DeltaStream
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.echo import EchoModel
from agentsessions.host.models.provider import DeltaCallback
from agentsessions.sdk.harness import message_text, text_message
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.support.host import HostUnderTest, running_host, text_input

LIMIT_S = 30.0
# Time never makes a frame due in the tests that count frames: only size does.
SIZE_ONLY = DeltaBatching(max_bytes=1024, max_delay_s=3600)


def say(uid: str, text: str) -> session_pb2.ExecRequest:
    return session_pb2.ExecRequest(session=uid, inputs=[text_input(text)])


async def new_uid(host: HostUnderTest) -> str:
    created = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="echo"))
    )
    return str(created.metadata.uid)


def deltas(updates: list[session_pb2.ExecUpdate]) -> list[session_pb2.Delta]:
    return [u.delta for u in updates if u.WhichOneof("update") == "delta"]


def output_text(updates: list[session_pb2.ExecUpdate]) -> str:
    (out,) = [u.record for u in updates if u.record.event.kind == common_pb2.EVENT_OUTPUT]
    return message_text(out.event.message)


async def frames_of(chunks: list[str], batching: DeltaBatching) -> list[session_pb2.Delta]:
    sent: list[session_pb2.Delta] = []

    async def emit(delta: session_pb2.Delta) -> None:
        sent.append(delta)

    stream = DeltaStream("ex", emit, batching)
    for chunk in chunks:
        await stream.push(chunk)
    await stream.finish()
    return sent


async def test_a_reply_within_one_batch_is_a_single_done_frame() -> None:
    sent = await frames_of(["echo:", "hi"], SIZE_ONLY)
    assert sent == [session_pb2.Delta(execution_id="ex", done=True)]


async def test_frames_carry_at_most_max_bytes_and_the_whole_text_in_order() -> None:
    text = "".join(f"{i:05d}" for i in range(1000))  # 5,000 ASCII bytes
    sent = await frames_of([text[i : i + 7] for i in range(0, len(text), 7)], SIZE_ONLY)
    *chunks, done = sent
    assert done == session_pb2.Delta(execution_id="ex", done=True)
    assert "".join(d.chunk for d in chunks) == text
    assert [len(d.chunk) for d in chunks] == [1024, 1024, 1024, 1024, 904]


async def test_a_chunk_past_the_limit_is_cut_on_character_boundaries() -> None:
    text = "é" * 1500 + "x" * 10  # 3,010 bytes of UTF-8
    *chunks, _ = await frames_of([text], SIZE_ONLY)
    assert "".join(d.chunk for d in chunks) == text
    assert all(len(d.chunk.encode()) <= 1024 for d in chunks) and len(chunks) == 3


class Trickle:
    """Streams "a", then waits for the test to say the client saw it as a frame, then "b"."""

    def __init__(self) -> None:
        self.seen = asyncio.Event()

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        assert on_delta is not None
        await on_delta("a")
        async with asyncio.timeout(LIMIT_S):
            await self.seen.wait()
        await on_delta("b")
        return harness_pb2.ModelResult(message=text_message("assistant", "ab"))


async def test_text_waiting_past_the_delay_goes_out_before_the_reply_is_complete(store: JournalStore) -> None:
    model = Trickle()
    async with running_host(store, model=model, delta_batching=DeltaBatching(max_delay_s=0.01)) as host:
        uid = await new_uid(host)
        frames: list[session_pb2.Delta] = []
        async with asyncio.timeout(LIMIT_S):
            async for update in host.sessions.Exec(say(uid, "x")):
                if update.WhichOneof("update") == "delta":
                    frames.append(update.delta)
                    if update.delta.chunk == "a":
                        model.seen.set()
    assert [(d.chunk, d.done) for d in frames] == [("a", False), ("b", False), ("", True)]


async def test_an_echo_turn_streams_one_delta_frame(store: JournalStore) -> None:
    async with running_host(store) as host:
        uid = await new_uid(host)
        updates = await host.exec(say(uid, "hello"))
    assert deltas(updates) == [session_pb2.Delta(execution_id=deltas(updates)[0].execution_id, done=True)]
    assert output_text(updates) == "echo:hello"


async def test_a_big_output_costs_a_frame_per_kib(store: JournalStore) -> None:
    text = "0123456789abcdef" * 8192  # 128 KiB, streamed by the echo model 8 characters at a time
    async with running_host(store, model=EchoModel(chunk_size=8), delta_batching=SIZE_ONLY) as host:
        uid = await new_uid(host)
        updates = await host.exec(say(uid, text))
    *chunks, done = deltas(updates)
    assert done.done and done.chunk == ""
    assert len(chunks) == math.ceil(len("echo:" + text) / 1024)
    assert "".join(d.chunk for d in chunks) == output_text(updates) == "echo:" + text


class BigStream:
    """For the input "big": streams 8-character pieces, yielding between them, until ``stop`` is set
    (past ``MAX_PIECES`` it waits for ``stop``), so it ends only after the test let it; anything
    else is echoed."""

    MAX_PIECES = 200_000

    def __init__(self) -> None:
        self.streaming = asyncio.Event()  # the big answer has started
        self.stop = asyncio.Event()
        self.finished = asyncio.Event()
        self.pieces = 0

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        if message_text(call.messages[-1]) != "big":
            return await EchoModel().complete(call, on_delta)
        assert on_delta is not None
        while not self.stop.is_set() and self.pieces < self.MAX_PIECES:
            await on_delta("01234567")
            self.pieces += 1
            if self.pieces == 1024:
                self.streaming.set()
            await asyncio.sleep(0)
        async with asyncio.timeout(LIMIT_S):
            await self.stop.wait()
        self.finished.set()
        return harness_pb2.ModelResult(message=text_message("assistant", "01234567" * self.pieces))


async def test_a_big_stream_does_not_hold_up_small_sessions(store: JournalStore) -> None:
    model = BigStream()
    async with running_host(store, model=model, delta_batching=SIZE_ONLY) as host:
        big_uid, small_uids = await new_uid(host), [await new_uid(host) for _ in range(3)]
        big = asyncio.create_task(host.exec(say(big_uid, "big")))
        try:
            async with asyncio.timeout(LIMIT_S):
                await model.streaming.wait()
                small = await asyncio.gather(*(host.exec(say(uid, "hi")) for uid in small_uids))
            # Every small turn completed while the big answer was still being streamed.
            assert not model.finished.is_set()
            for updates in small:
                assert output_text(updates) == "echo:hi"
                assert [
                    r.record.event.end.state for r in updates if r.record.event.kind == common_pb2.EVENT_END
                ] == ["COMPLETED"]
        finally:
            model.stop.set()
            async with asyncio.timeout(LIMIT_S):
                updates = await big
    *chunks, done = deltas(updates)
    total = 8 * model.pieces
    assert done.done and len(chunks) == math.ceil(total / 1024)
    assert "".join(d.chunk for d in chunks) == output_text(updates)


async def test_a_wide_character_at_the_edge_of_a_frame_starts_the_next_one() -> None:
    sent = await frames_of(["x" * 1023, "é", "y"], SIZE_ONLY)
    *chunks, _ = sent
    assert [d.chunk for d in chunks] == ["x" * 1023, "éy"]
