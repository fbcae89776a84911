"""History by reference (agentsessions.sdk.extensions): once a session's history passes
``HISTORY_BY_REFERENCE_MIN_BYTES``, an SDK-served harness keeps it between turns, so the host's
Start frames carry only the events since the last one, and the harness still sees the whole
history; a harness that lost what it held (evicted, restarted) gets the whole history again, and
a v1 harness always does. Inputs of a few KB make the histories pass the threshold in a few turns."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from agentsessions.host import harnesslink
from agentsessions.host.harnesslink import HISTORY_BY_REFERENCE_MIN_BYTES
from agentsessions.host.journal.store import JournalStore
from agentsessions.sdk import EventSink, Start
from agentsessions.sdk.extensions import HISTORY_HELD
from agentsessions.sdk.harness import message_text, text_message
from agentsessions.sdk.servicer import HarnessServicer, add_to_server
from agentsessions.v1 import common_pb2, harness_pb2, harness_pb2_grpc, session_pb2
from tests.support.host import HostUnderTest, running_host, text_input

CONNECT = "/agentsessions.v1.Harness/Connect"
# A turn of this input adds ~8 KB to the history (its INPUT and its echoed OUTPUT).
TEXT = "x" * 4000


class HistoryHarness:
    """Keeps every Start's history (serialized), asks the model once, and ends."""

    def __init__(self) -> None:
        self.histories: dict[str, list[bytes]] = {}

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id="history",
            version="1",
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        self.histories[start.execution_id] = [event.SerializeToString() for event in start.history]
        await sink.model(
            common_pb2.ModelCall(model="echo", messages=[text_message("user", start.last_input_text())])
        )


class StartFrames(aio.ServerInterceptor):  # type: ignore[misc]
    """Records each Connect call's first frame: (execution id, events in its Start.history, bytes)."""

    def __init__(self) -> None:
        self.frames: list[tuple[str, int, int]] = []

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if details.method != CONNECT:
            return handler
        first = True

        def read(data: bytes) -> Any:
            nonlocal first
            if first:
                first = False
                frame = harness_pb2.ControllerFrame.FromString(data)
                self.frames.append((frame.execution_id, len(frame.start.history), len(data)))
            return handler.request_deserializer(data)

        return grpc.stream_stream_rpc_method_handler(
            handler.stream_stream, request_deserializer=read, response_serializer=handler.response_serializer
        )


@contextlib.asynccontextmanager
async def serving(address: str, register: Callable[[aio.Server], None]) -> AsyncIterator[StartFrames]:
    """A harness process at ``address``, its services added by ``register``; its Start frames."""
    frames = StartFrames()
    server = aio.server(interceptors=[frames])
    register(server)
    server.add_insecure_port(address)
    await server.start()
    try:
        yield frames
    finally:
        await server.stop(None)


def harness_server(
    address: str, harness: HistoryHarness, *, v1: bool = False, **options: Any
) -> contextlib.AbstractAsyncContextManager[StartFrames]:
    servicer = HarnessServicer(harness, **options)
    # v1: frames parsed whole, as a generated servicer registration does
    register = harness_pb2_grpc.add_HarnessServicer_to_server if v1 else add_to_server
    return serving(address, lambda server: register(servicer, server))


def connect_server(
    address: str, describe: Any, connect: Any
) -> contextlib.AbstractAsyncContextManager[StartFrames]:
    """A harness process whose Connect handler is ``connect(requests, context)`` itself."""
    handlers = {
        "Describe": grpc.unary_unary_rpc_method_handler(
            describe,
            request_deserializer=harness_pb2.DescribeRequest.FromString,
            response_serializer=harness_pb2.HarnessDescriptor.SerializeToString,
        ),
        "Connect": grpc.stream_stream_rpc_method_handler(
            connect, request_deserializer=bytes, response_serializer=common_pb2.Event.SerializeToString
        ),
    }
    generic = grpc.method_handlers_generic_handler("agentsessions.v1.Harness", handlers)
    return serving(address, lambda server: server.add_generic_rpc_handlers((generic,)))


async def turn(host: HostUnderTest, uid: str, text: str) -> str:
    """One turn; its execution id."""
    updates = await host.exec(session_pb2.ExecRequest(session=uid, inputs=[text_input(text)]))
    (start,) = [u.record for u in updates if u.record.event.kind == common_pb2.EVENT_EXECUTION_START]
    (output,) = [u.record for u in updates if u.record.event.kind == common_pb2.EVENT_OUTPUT]
    assert message_text(output.event.message) == "echo:" + text
    return start.event.execution_id


async def journal_before(store: JournalStore, uid: str, execution_id: str) -> list[bytes]:
    """The session's events before the execution's EXECUTION_START, serialized."""
    events = [r.event for r in await store.read(uid)]
    (first,) = [
        i
        for i, e in enumerate(events)
        if e.kind == common_pb2.EVENT_EXECUTION_START and e.execution_id == execution_id
    ]
    return [e.SerializeToString() for e in events[:first]]


async def new_session(host: HostUnderTest) -> str:
    created = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="history"))
    )
    return str(created.metadata.uid)


async def test_starts_carry_only_new_events_and_the_harness_sees_the_whole_history(
    store: JournalStore, tmp_path: Path
) -> None:
    address = f"unix:{tmp_path}/h.sock"
    harness = HistoryHarness()
    async with (
        harness_server(address, harness) as frames,
        running_host(store, remote={"history": address}) as host,
    ):
        uid = await new_session(host)
        executions = [await turn(host, uid, f"{TEXT} {i}") for i in range(30)]
        for execution_id in executions:
            assert harness.histories[execution_id] == await journal_before(store, uid, execution_id)
    sent = {execution_id: (events, size) for execution_id, events, size in frames.frames}
    assert len(frames.frames) == 30  # no Start was refused and sent again
    assert 4 * 8_000 < HISTORY_BY_REFERENCE_MIN_BYTES < 10 * 8_000
    turn_records = len(harness.histories[executions[1]])
    # Short histories go whole; past the threshold each Start carries the previous turn's records.
    for execution_id in executions[:4]:
        assert sent[execution_id][0] == len(harness.histories[execution_id])
    for execution_id in executions[11:]:
        assert sent[execution_id][0] == turn_records
    assert sent[executions[-1]][1] < 2 * sent[executions[11]][1]
    assert len(harness.histories[executions[-1]]) == 29 * turn_records


async def test_a_harness_that_dropped_the_history_gets_it_whole_again(
    store: JournalStore, tmp_path: Path
) -> None:
    address = f"unix:{tmp_path}/h.sock"
    harness = HistoryHarness()
    big = "x" * 30_000  # a turn of this input leaves ~60 KB of history: two sessions' do not fit
    async with (
        harness_server(address, harness, held_history_bytes=100_000) as frames,
        running_host(store, remote={"history": address}) as host,
    ):
        a, b = await new_session(host), await new_session(host)
        await turn(host, a, big)
        await turn(host, a, "small")  # the harness now holds a's history
        await turn(host, b, big)
        await turn(host, b, "small")  # holding b's too passes the budget: a's is dropped
        last = await turn(host, a, "again")
        assert harness.histories[last] == await journal_before(store, a, last)
    attempts = [(events, size) for execution_id, events, size in frames.frames if execution_id == last]
    # Sent by reference first, refused, then sent whole.
    assert len(attempts) == 2 and attempts[0][0] < attempts[1][0] == len(harness.histories[last])


async def test_a_restarted_harness_process_gets_the_whole_history(
    store: JournalStore, tmp_path: Path
) -> None:
    address = f"unix:{tmp_path}/h.sock"
    harness = HistoryHarness()
    async with running_host(store, remote={"history": address}) as host:
        async with harness_server(address, harness):
            uid = await new_session(host)
            for i in range(8):
                await turn(host, uid, f"{TEXT} {i}")
        async with harness_server(address, harness) as frames:
            last = await turn(host, uid, "after the restart")
        assert harness.histories[last] == await journal_before(store, uid, last)
    ((_, events, _),) = frames.frames
    assert events == len(harness.histories[last])


async def test_a_v1_harness_always_gets_the_whole_history(store: JournalStore, tmp_path: Path) -> None:
    address = f"unix:{tmp_path}/h.sock"
    harness = HistoryHarness()
    async with (
        harness_server(address, harness, v1=True) as frames,
        running_host(store, remote={"history": address}) as host,
    ):
        uid = await new_session(host)
        executions = [await turn(host, uid, f"{TEXT} {i}") for i in range(8)]
        for execution_id in executions:
            assert harness.histories[execution_id] == await journal_before(store, uid, execution_id)
    assert [events for _, events, _ in frames.frames] == [len(harness.histories[e]) for e in executions]


class _AnswersUpFront:
    """A Connect context as earlier versions of the SDK answered with: ``agentsessions-history-held``
    in the initial metadata, sent before the first event, instead of with the status."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self._held: Any = None

    def set_trailing_metadata(self, metadata: Any) -> None:
        if any(key == HISTORY_HELD and value for key, value in metadata):
            self._held = metadata
        else:
            self._context.set_trailing_metadata(metadata)

    async def write(self, message: Any) -> None:
        held, self._held = self._held, None
        if held is not None:
            await self._context.send_initial_metadata(held)
        await self._context.write(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


async def test_a_harness_answering_in_its_initial_metadata_is_still_understood(
    store: JournalStore, tmp_path: Path
) -> None:
    address = f"unix:{tmp_path}/h.sock"
    harness = HistoryHarness()
    servicer = HarnessServicer(harness)
    answered_up_front: list[str] = []

    async def connect(requests: Any, context: Any) -> None:
        proxy = _AnswersUpFront(context)
        await servicer.Connect(requests, proxy)
        answered_up_front.append("held" if proxy._held is None else "")

    async with (
        connect_server(address, servicer.Describe, connect) as frames,
        running_host(store, remote={"history": address}) as host,
    ):
        uid = await new_session(host)
        executions = [await turn(host, uid, f"{TEXT} {i}") for i in range(16)]
        for execution_id in executions:
            assert harness.histories[execution_id] == await journal_before(store, uid, execution_id)
    sent = {execution_id: events for execution_id, events, _ in frames.frames}
    assert len(frames.frames) == 16
    assert answered_up_front.count("held") >= 12  # the answers went in the initial metadata
    turn_records = len(harness.histories[executions[1]])
    for execution_id in executions[11:]:
        assert sent[execution_id] == turn_records  # by reference: the initial metadata was read


@pytest.mark.parametrize("cut_by", ["the grace", "the next Start"])
async def test_a_harness_that_leaves_its_side_open_after_end_is_cut_and_gets_the_whole_history(
    store: JournalStore, tmp_path: Path, monkeypatch: Any, cut_by: str
) -> None:
    """The answer comes with the stream's status, so the host lets a stream end by itself after
    END; one the harness leaves open is cut after END_STATUS_GRACE_S, or when the session's next
    Start comes first, and the turn never waits for it."""
    monkeypatch.setattr(harnesslink, "END_STATUS_GRACE_S", 0.05 if cut_by == "the grace" else 3600.0)
    address = f"unix:{tmp_path}/h.sock"
    cuts: list[asyncio.Event] = []
    histories: list[int] = []

    async def connect(requests: Any, context: Any) -> None:
        cut = asyncio.Event()
        cuts.append(cut)
        start = harness_pb2.ControllerFrame.FromString(await context.read())
        histories.append(len(start.start.history))
        execution_id = start.execution_id
        prompt = text_message("user", message_text(start.start.inputs[-1]))
        await context.write(
            common_pb2.Event(
                execution_id=execution_id,
                kind=common_pb2.EVENT_MODEL_CALL,
                model=common_pb2.ModelCall(model="echo", id="m1", messages=[prompt]),
            )
        )
        await context.read()  # the ModelResult
        # Says it holds the history (as the SDK does), ends the execution, and then stays open.
        context.set_trailing_metadata(((HISTORY_HELD, execution_id),))
        await context.write(
            common_pb2.Event(
                execution_id=execution_id,
                kind=common_pb2.EVENT_END,
                end=common_pb2.HarnessEnd(state="COMPLETED"),
            )
        )
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cut.set()
            raise

    async with (
        connect_server(address, HarnessServicer(HistoryHarness()).Describe, connect),
        running_host(store, remote={"history": address}) as host,
    ):
        uid = await new_session(host)
        for i in range(8):
            await turn(host, uid, f"{TEXT} {i}")
            # Each stream left open is cut: by the grace, or else by the session's next Start.
            left_open = cuts[i] if cut_by == "the grace" else cuts[i - 1] if i else None
            if left_open is not None:
                await asyncio.wait_for(left_open.wait(), 30)
        if cut_by == "the next Start":
            assert not cuts[-1].is_set()  # nothing came after the last turn's stream
    # Never answered with a status, so never sent by reference: every Start has the whole history.
    assert histories == [i * histories[1] for i in range(8)]
    assert histories[1] > 0
