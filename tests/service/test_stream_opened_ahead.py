"""A new turn's Connect stream opened ahead of its first commit (``controller.harnesses.open_ahead``).

On a host running nothing else, the harness takes the stream's call while EXECUTION_START and the
INPUTs are committed; the Start frame goes once they are durable, and never when they are not
(the reference's rule: a first append that fails never runs the harness). A host already running
other turns opens nothing ahead. Each test holds the first append until it has seen what the
harness saw at that moment, so what they check is the order, not a race.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc import aio

from agentsessions.host import harnesslink
from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.host.journal.store import JournalStore
from agentsessions.sdk.harness import Start
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.support.harnesses import GateHarness
from tests.support.host import running_host, text_input
from tests.support.processes import harness_process, serve_argv, stop
from tests.support.raw_harness import RawHarnessServicer, serve_harness

K = common_pb2.EventKind


class RecordingHarness(RawHarnessServicer):
    """Ends each execution COMPLETED at once, and notes each stream: opened, its Start, or cut
    before a Start came."""

    def __init__(self) -> None:
        super().__init__("recording")
        self.opened = 0
        self.open = asyncio.Event()  # a stream reached the harness
        self.starts: list[harness_pb2.ControllerFrame] = []
        self.cut = asyncio.Event()  # a stream ended before its Start

    async def Connect(
        self, request_iterator: AsyncIterator[harness_pb2.ControllerFrame], context: aio.ServicerContext
    ) -> AsyncIterator[common_pb2.Event]:
        self.opened += 1
        self.open.set()
        try:
            start = await anext(aiter(request_iterator))
        except (StopAsyncIteration, asyncio.CancelledError):
            self.cut.set()
            raise
        self.starts.append(start)
        yield common_pb2.Event(
            execution_id=start.execution_id, kind=K.EVENT_END, end=common_pb2.HarnessEnd(state="COMPLETED")
        )


class HeldFirstAppend:
    """The journal store, with each execution's first append (the one that mints its fence) held
    until ``seen`` says what the harness had seen by then."""

    def __init__(self, store: JournalStore, harness: RecordingHarness, wait_for_open: bool) -> None:
        self._store = store
        self._harness = harness
        self._wait_for_open = wait_for_open
        self.opened_before_commit: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def append(
        self, uid: str, events: Sequence[common_pb2.Event], **how: Any
    ) -> list[common_pb2.LogRecord]:
        if how.get("mint_fence") and any(e.kind == K.EVENT_EXECUTION_START for e in events):
            if self._wait_for_open:
                async with asyncio.timeout(10):  # the stream opened ahead reaches the harness
                    await self._harness.open.wait()
                self._harness.open.clear()
            self.opened_before_commit.append(self._harness.opened)
            execution = events[0].execution_id
            assert all(s.execution_id != execution for s in self._harness.starts), (
                "a Start went before the execution's first records were durable"
            )
        records: list[common_pb2.LogRecord] = await self._store.append(uid, events, **how)
        return records


@dataclass
class Ahead:
    """What the host's harness link opened ahead: each stream's session, and the executions whose
    stream was cut unstarted."""

    opened: list[str] = field(default_factory=list)
    abandoned: list[str] = field(default_factory=list)


@pytest.fixture
def ahead(monkeypatch: pytest.MonkeyPatch) -> Ahead:
    seen = Ahead()
    open_ahead = RemoteHarness.open_ahead

    async def watched(self: RemoteHarness, start: Start, session_mode: str) -> Callable[[], None]:
        seen.opened.append(start.session)
        abandon = await open_ahead(self, start, session_mode)

        def noted() -> None:
            if self._ahead.get(start.execution_id) is not None:
                seen.abandoned.append(start.execution_id)
            abandon()

        return noted

    monkeypatch.setattr(RemoteHarness, "open_ahead", watched)
    return seen


def say(session: str, text: str, **kw: Any) -> session_pb2.ExecRequest:
    return session_pb2.ExecRequest(session=session, inputs=[text_input(text)], **kw)


async def new_session(host: Any, harness: str) -> str:
    created = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(harness=harness))
    )
    return str(created.metadata.uid)


async def test_an_idle_hosts_turn_opens_the_stream_while_its_first_records_commit(
    store: JournalStore,
) -> None:
    harness = RecordingHarness()
    held = HeldFirstAppend(store, harness, wait_for_open=True)
    async with serve_harness(harness) as address, running_host(held, remote={"rec": address}) as host:
        uid = await new_session(host, "rec")
        for turn in range(2):
            updates = await host.exec(say(uid, f"turn {turn}"))
            journaled = [u.record for u in updates if u.WhichOneof("update") == "record"]
            assert [K.Name(r.event.kind) for r in journaled] == [
                "EVENT_EXECUTION_START",
                "EVENT_INPUT",
                "EVENT_END",
            ]
            assert harness.starts[-1].execution_id == journaled[0].event.execution_id
    assert held.opened_before_commit == [1, 2]  # each turn's stream was open before its commit
    assert len(harness.starts) == 2 and not harness.cut.is_set()


async def test_a_first_append_that_fails_cuts_the_stream_opened_ahead_unstarted(store: JournalStore) -> None:
    harness = RecordingHarness()
    held = HeldFirstAppend(store, harness, wait_for_open=True)
    async with serve_harness(harness) as address, running_host(held, remote={"rec": address}) as host:
        uid = await new_session(host, "rec")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(say(uid, "stale", expected_last_seq=7))
        assert err.value.code() == grpc.StatusCode.ABORTED
        async with asyncio.timeout(10):
            await harness.cut.wait()
        assert harness.opened == 1 and harness.starts == []  # opened ahead, never started
        assert (await store.head(uid)).seq == 0
        # The session's next turn runs as ever (its history goes whole: what the harness holds is unknown).
        updates = await host.exec(say(uid, "again"))
        assert updates[-1].record.event.kind == K.EVENT_END
        assert len(harness.starts) == 1


async def test_a_host_running_another_turn_opens_nothing_ahead(store: JournalStore, ahead: Ahead) -> None:
    harness = RecordingHarness()
    gate = GateHarness()
    held = HeldFirstAppend(store, harness, wait_for_open=False)
    async with (
        serve_harness(harness) as address,
        running_host(held, remote={"rec": address}, local={"gate": gate}) as host,
    ):
        busy = await new_session(host, "gate")
        uid = await new_session(host, "rec")
        running = asyncio.create_task(host.exec(say(busy, "hold")))
        async with asyncio.timeout(10):
            await gate.entered.wait()
        updates = await host.exec(say(uid, "meanwhile"))
        assert updates[-1].record.event.kind == K.EVENT_END
        assert ahead.opened == []  # the gate's turn was running: nothing opened ahead
        gate.release.set()
        await running
        await host.exec(say(uid, "alone"))
    assert ahead.opened == [uid]  # alone on the host, its turn's stream opened ahead
    assert held.opened_before_commit[:2] == [0, 0]
    assert harness.opened == 2 and len(harness.starts) == 2


async def test_the_sdks_harness_takes_a_stream_cut_before_its_start_as_nothing_to_run(
    store: JournalStore, ahead: Ahead
) -> None:
    async with harness_process(serve_argv("agentsessions.harnesses.echo:EchoHarness")) as harness:
        async with running_host(store, remote={"echo-process": harness.address}) as host:
            uid = await new_session(host, "echo-process")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await host.exec(say(uid, "stale", expected_last_seq=3))
            assert err.value.code() == grpc.StatusCode.ABORTED
            assert ahead.opened == [uid] and len(ahead.abandoned) == 1  # opened ahead, cut unstarted
            updates = await host.exec(say(uid, "hello"))
            assert updates[-2].record.event.message.parts[0].text.text == "echo:hello"
        assert await stop(harness) == 0
        assert harness.process.stderr is not None
        logged = (await harness.process.stderr.read()).decode()
    assert "Traceback" not in logged and "ERROR" not in logged, logged


async def test_a_stream_that_cannot_be_opened_ahead_is_opened_when_the_harness_runs(
    store: JournalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    connect = harnesslink._Bridge._connect
    refused: list[int] = []

    def first_refused(self: harnesslink._Bridge, opening: Any, base: Any) -> None:
        if not refused:
            refused.append(1)
            raise harnesslink.HarnessProtocolError("no stream for you, this once")
        connect(self, opening, base)

    monkeypatch.setattr(harnesslink._Bridge, "_connect", first_refused)
    harness = RecordingHarness()
    async with serve_harness(harness) as address, running_host(store, remote={"rec": address}) as host:
        uid = await new_session(host, "rec")
        updates = await host.exec(say(uid, "still"))
    assert refused == [1]  # the opening ahead failed; the run opened the stream itself
    assert [K.Name(u.record.event.kind) for u in updates[1:]] == [
        "EVENT_EXECUTION_START",
        "EVENT_INPUT",
        "EVENT_END",
    ]
    assert harness.opened == 1 and len(harness.starts) == 1
