"""A model call is answered while its OUTPUT is flushed (ExecutionWriter.append_soon): the record
is ordered at once, relayed only once durable, and the execution's next record waits for it (or,
when it comes within the linger, shares its commit); its failure is raised to whoever appends next
and stays; a record the journal refuses on sight is refused before anything is scheduled. The
MODEL_CALL intent is ordered the same way, unless the host is told to make it durable first
(``--write-ahead-model-calls``).

The journal is a real SQLite store whose append of an OUTPUT can be held at a gate (so each step
is event-gated, never timed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from agentsessions.host.controller.errors import ConcurrencyError, RecordTooLargeError
from agentsessions.host.controller.journal_cache import JournalCache
from agentsessions.host.controller.sink import ExecutionSink
from agentsessions.host.controller.writer import ExecutionWriter, JournalWriter
from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.host.journal.store import SessionRow
from agentsessions.host.models.echo import EchoModel
from agentsessions.host.models.provider import DeltaCallback
from agentsessions.v1 import common_pb2, harness_pb2

K = common_pb2
EXECUTION = "00000000000000e1"


class HeldSqliteStore(SqliteStore):
    """A SQLite journal whose appends of OUTPUT records wait at ``gate`` while ``hold`` is set."""

    hold = False
    reached: asyncio.Event
    gate: asyncio.Event
    kinds: list[int]
    appends: list[list[int]]  # the kinds of each append call, in order

    async def append(
        self,
        uid: str,
        events: Sequence[common_pb2.Event],
        *,
        expected_head: int,
        fence: int,
        mint_fence: bool = False,
        normalized: bool = False,
    ) -> list[common_pb2.LogRecord]:
        self.kinds.extend(e.kind for e in events)
        self.appends.append([e.kind for e in events])
        if self.hold and any(e.kind == K.EVENT_OUTPUT for e in events):
            self.reached.set()
            await self.gate.wait()
        return await super().append(
            uid,
            events,
            expected_head=expected_head,
            fence=fence,
            mint_fence=mint_fence,
            normalized=normalized,
        )


async def _store(tmp_path: Path) -> HeldSqliteStore:
    store = await HeldSqliteStore.open(tmp_path / "journal.db")
    assert isinstance(store, HeldSqliteStore)
    store.reached, store.gate, store.kinds, store.appends = asyncio.Event(), asyncio.Event(), [], []
    await store.create_session(SessionRow(uid="s-1", project="p"))
    return store


class Execution:
    def __init__(self, store: HeldSqliteStore, max_record_bytes: int = 1 << 20) -> None:
        self.store = store
        self.journal = JournalWriter(store, JournalCache(store), max_record_bytes)
        self.relayed: list[int] = []
        self.relay_seen = asyncio.Event()  # set at each relayed record
        self.writer: ExecutionWriter | None = None

    async def start(self) -> ExecutionWriter:
        fence = await self.journal.mint("s-1", 0)

        async def relay(rec: common_pb2.LogRecord) -> None:
            self.relayed.append(rec.seq)
            self.relay_seen.set()

        self.writer = ExecutionWriter(self.journal, "s-1", fence, 0, relay)
        await self.writer.append(
            K.Event(
                execution_id=EXECUTION,
                kind=K.EVENT_EXECUTION_START,
                execution_start=K.ExecutionStart(input_count=1, harness="echo"),
            )
        )
        return self.writer

    async def with_output(self, *, held: bool) -> ExecutionWriter:
        """The started execution with an OUTPUT ordered after its EXECUTION_START (``held``: the
        store holds every append of an OUTPUT at its gate)."""
        writer = await self.start()
        self.store.hold = held
        writer.append_soon(_output("echo:hi"))
        return writer


@pytest.fixture
async def execution(tmp_path: Path) -> AsyncIterator[Execution]:
    store = await _store(tmp_path)
    try:
        yield Execution(store)
    finally:
        store.gate.set()
        await store.close()


def _output(text: str) -> common_pb2.Event:
    message = K.Message(role="assistant", parts=[K.Part(text=K.TextPart(text=text))])
    return K.Event(execution_id=EXECUTION, kind=K.EVENT_OUTPUT, message=message)


def _end() -> common_pb2.Event:
    return K.Event(execution_id=EXECUTION, kind=K.EVENT_END, end=K.HarnessEnd(state="COMPLETED"))


async def test_the_next_record_waits_for_the_flush_and_records_are_relayed_in_order(
    execution: Execution,
) -> None:
    store = execution.store
    writer = await execution.start()
    store.hold = True

    writer.append_soon(_output("echo:hi"))
    assert writer.head == 2  # ordered at once
    await store.reached.wait()
    end = asyncio.create_task(writer.append(_end()))
    await asyncio.sleep(0)  # the END's task runs to its first suspension
    assert store.kinds == [K.EVENT_EXECUTION_START, K.EVENT_OUTPUT]  # END waits for the OUTPUT
    assert execution.relayed == [1]  # nothing relayed before it is durable
    assert (await store.head("s-1")).seq == 1

    store.gate.set()
    rec = await end
    assert rec.seq == 3
    assert execution.relayed == [1, 2, 3]
    assert [r.event.kind for r in await store.read("s-1")] == [
        K.EVENT_EXECUTION_START,
        K.EVENT_OUTPUT,
        K.EVENT_END,
    ]
    assert await store.verify("s-1") == 3


async def test_a_flush_that_fails_is_raised_to_the_next_append_and_stays(execution: Execution) -> None:
    store = execution.store
    writer = await execution.with_output(held=True)
    await store.reached.wait()
    # Another writer takes the head the OUTPUT was ordered after.
    lifecycle = K.Event(kind=K.EVENT_LIFECYCLE, lifecycle=K.Lifecycle(kind=K.Lifecycle.LIFECYCLE_CANCEL))
    await store.append("s-1", [lifecycle], expected_head=1, fence=writer.fence)
    store.gate.set()

    with pytest.raises(ConcurrencyError):
        await writer.append(_end())
    with pytest.raises(ConcurrencyError):
        await writer.flushed()
    with pytest.raises(ConcurrencyError):
        await writer.append(_end())
    assert [r.event.kind for r in await store.read("s-1")] == [K.EVENT_EXECUTION_START, K.EVENT_LIFECYCLE]
    assert execution.relayed == [1]


async def test_a_record_the_journal_refuses_on_sight_is_refused_before_anything_is_ordered(
    tmp_path: Path,
) -> None:
    store = await _store(tmp_path)
    try:
        execution = Execution(store, max_record_bytes=200)
        writer = await execution.start()
        with pytest.raises(RecordTooLargeError, match="record size limit"):
            writer.append_soon(_output("x" * 1000))
        assert writer.head == 1
        rec = await writer.append(_end())
        assert rec.seq == 2
        await writer.flushed()
    finally:
        await store.close()


@pytest.mark.parametrize("intent_soon", [True, False], ids=["intent-ordered", "write-ahead"])
async def test_the_harness_gets_the_answer_while_its_output_is_flushed(
    execution: Execution, intent_soon: bool
) -> None:
    store = execution.store
    writer = await execution.start()
    sink = ExecutionSink(
        session="s-1",
        execution_id=EXECUTION,
        append=writer.append,
        append_soon=writer.append_soon,
        model=EchoModel(),
        tools=None,
        model_intent_soon=intent_soon,
    )
    store.hold = True
    user = K.Message(role="user", parts=[K.Part(text=K.TextPart(text="hi"))])
    async with asyncio.timeout(30):  # answered before the held OUTPUT is durable, or never
        reply = await sink.model(K.ModelCall(model="echo", id="call-1", messages=[user]))

    assert reply.message.parts[0].text.text == "echo:hi"
    assert reply.model_call_id == "call-1"
    await store.reached.wait()  # the OUTPUT is on its way, held
    if intent_soon:  # the MODEL_CALL travels with its OUTPUT: neither is durable or relayed yet
        assert store.appends[1:] == [[K.EVENT_MODEL_CALL, K.EVENT_OUTPUT]]
        assert (await store.head("s-1")).seq == 1
        assert execution.relayed == [1]
    else:  # the MODEL_CALL intent was durable before the model ran
        assert store.appends[1:] == [[K.EVENT_MODEL_CALL], [K.EVENT_OUTPUT]]
        assert (await store.head("s-1")).seq == 2
        assert execution.relayed == [1, 2]

    store.gate.set()
    await writer.flushed()
    records = await store.read("s-1")
    assert [r.event.kind for r in records] == [K.EVENT_EXECUTION_START, K.EVENT_MODEL_CALL, K.EVENT_OUTPUT]
    assert records[2].event.message.parts[0].text.text == "echo:hi"
    assert execution.relayed == [1, 2, 3]


async def test_the_next_append_within_the_linger_shares_the_ordered_records_commit(
    execution: Execution,
) -> None:
    store = execution.store
    writer = await execution.with_output(held=False)
    rec = await writer.append(_end())  # at once: well within SOON_LINGER_S

    assert rec.seq == 3
    assert store.appends[1:] == [[K.EVENT_OUTPUT, K.EVENT_END]]  # one append, one commit
    assert execution.relayed == [1, 2, 3]
    assert [r.event.kind for r in await store.read("s-1")] == [
        K.EVENT_EXECUTION_START,
        K.EVENT_OUTPUT,
        K.EVENT_END,
    ]


async def test_an_ordered_record_no_append_follows_is_written_alone_after_the_linger(
    execution: Execution,
) -> None:
    store = execution.store
    writer = await execution.with_output(held=False)
    assert writer.ordered()[0].kind == K.EVENT_OUTPUT  # ordered, not yet handed to the store
    assert store.appends[1:] == []

    async with asyncio.timeout(30):  # the linger's timer writes it; no append asks for it
        while execution.relayed[-1] < 2:
            execution.relay_seen.clear()
            await execution.relay_seen.wait()
    assert store.appends[1:] == [[K.EVENT_OUTPUT]]
    assert writer.ordered() == []
    assert [r.event.kind for r in await store.read("s-1")] == [K.EVENT_EXECUTION_START, K.EVENT_OUTPUT]


@pytest.mark.parametrize("write_ahead", [False, True], ids=["default", "write-ahead-model-calls"])
async def test_an_echo_turn_ends_in_the_commit_of_its_models_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_ahead: bool
) -> None:
    """On a real host: EXECUTION_START with its INPUT, then the MODEL_CALL, the OUTPUT and the END
    in one commit (the turn's settling reads the ordered records instead of forcing them out
    alone); with write-ahead model calls the MODEL_CALL is a commit of its own before them."""
    from agentsessions.host.controller import writer
    from agentsessions.v1 import session_pb2
    from tests.support.host import running_host, text_input

    monkeypatch.setattr(writer, "SOON_LINGER_S", 60.0)  # only the END may take the OUTPUT out
    store = await HeldSqliteStore.open(tmp_path / "journal.db")
    assert isinstance(store, HeldSqliteStore)
    store.reached, store.gate, store.kinds, store.appends = asyncio.Event(), asyncio.Event(), [], []
    try:
        async with running_host(store, write_ahead_model_calls=write_ahead) as host:
            created = await host.sessions.CreateSession(
                session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="echo"))
            )
            await host.exec(session_pb2.ExecRequest(session=created.metadata.uid, inputs=[text_input("hi")]))
        start = [K.EVENT_EXECUTION_START, K.EVENT_INPUT]
        if write_ahead:
            assert store.appends == [start, [K.EVENT_MODEL_CALL], [K.EVENT_OUTPUT, K.EVENT_END]]
        else:
            assert store.appends == [start, [K.EVENT_MODEL_CALL, K.EVENT_OUTPUT, K.EVENT_END]]
    finally:
        await store.close()


async def test_a_cancelled_caller_leaves_the_write_of_ordered_records_running(execution: Execution) -> None:
    """The OUTPUT ordered with append_soon travels with the END; the END's caller is cancelled
    while that write is on its way: both records become durable and are relayed, and the
    execution's next append lands after them (the head is known, nothing stays failed)."""
    store = execution.store
    writer = await execution.with_output(held=True)
    end = asyncio.create_task(writer.append(_end()))
    await store.reached.wait()  # the OUTPUT and the END are being written, held
    end.cancel()
    with pytest.raises(asyncio.CancelledError):
        await end
    store.gate.set()

    error = K.Event(execution_id=EXECUTION, kind=K.EVENT_ERROR, error=K.Error(code=1, description="gone"))
    rec = await writer.append(error)
    assert rec.seq == 4
    assert execution.relayed == [1, 2, 3, 4]
    assert [r.event.kind for r in await store.read("s-1")] == [
        K.EVENT_EXECUTION_START,
        K.EVENT_OUTPUT,
        K.EVENT_END,
        K.EVENT_ERROR,
    ]


async def test_ordered_records_on_their_way_to_the_store_are_still_ordered(execution: Execution) -> None:
    """A turn's settling reads the execution's records from the journal cache plus ``ordered()``:
    an OUTPUT whose write the linger started, and which the cache does not hold yet, is in the
    second (a loaded host once settled a turn on neither, and judged its answer missing)."""
    store = execution.store
    writer = await execution.with_output(held=True)
    await store.reached.wait()  # the linger's write took the OUTPUT and is held at the store
    assert [e.kind for e in writer.ordered()] == [K.EVENT_OUTPUT]
    store.gate.set()
    await writer.flushed()
    assert writer.ordered() == []
    assert execution.relayed == [1, 2]


async def test_records_ordered_while_a_write_is_on_its_way_follow_it(execution: Execution) -> None:
    """The linger's write of an OUTPUT is held at the store when the harness's next model call
    orders its MODEL_CALL: that record follows the write (the writer's head counts it), and the
    next append lands after both (the head was once reset to the write's last record, and the
    MODEL_CALL's flush then failed its compare-and-set)."""
    store = execution.store
    writer = await execution.with_output(held=True)
    await store.reached.wait()  # the linger took the OUTPUT; its write is held
    call = K.ModelCall(model="echo", id="m2")
    writer.append_soon(K.Event(execution_id=EXECUTION, kind=K.EVENT_MODEL_CALL, model=call))
    assert writer.head == 3
    store.gate.set()
    await writer.flushed()
    assert writer.head == 3
    rec = await writer.append(_end())
    assert rec.seq == 4
    assert execution.relayed == [1, 2, 3, 4]
    assert [r.event.kind for r in await store.read("s-1")] == [
        K.EVENT_EXECUTION_START,
        K.EVENT_OUTPUT,
        K.EVENT_MODEL_CALL,
        K.EVENT_END,
    ]
    assert await store.verify("s-1") == 4


class HeldModel(EchoModel):
    """The echo model, answering each call only once ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def complete(
        self, call: common_pb2.ModelCall, on_delta: DeltaCallback | None = None
    ) -> harness_pb2.ModelResult:
        self.asked.set()
        await self.release.wait()
        return await super().complete(call, on_delta)


async def test_a_model_call_longer_than_the_linger_has_its_intent_durable_before_it_answers(
    execution: Execution,
) -> None:
    """The MODEL_CALL is ordered as the model is asked; a call that takes longer than the linger
    finds it written alone by the linger's timer (durable, relayed) before its answer comes."""
    store = execution.store
    writer = await execution.start()
    model = HeldModel()
    sink = ExecutionSink(
        session="s-1",
        execution_id=EXECUTION,
        append=writer.append,
        append_soon=writer.append_soon,
        model=model,
        tools=None,
        model_intent_soon=True,
    )
    user = K.Message(role="user", parts=[K.Part(text=K.TextPart(text="hi"))])
    answer = asyncio.create_task(sink.model(K.ModelCall(model="echo", id="call-1", messages=[user])))
    await model.asked.wait()
    async with asyncio.timeout(30):  # the linger's timer writes the intent; nothing else asks
        while execution.relayed[-1] < 2:
            execution.relay_seen.clear()
            await execution.relay_seen.wait()
    assert store.appends[1:] == [[K.EVENT_MODEL_CALL]]
    assert not answer.done()

    model.release.set()
    reply = await answer
    assert reply.message.parts[0].text.text == "echo:hi"
    await writer.flushed()
    kinds = [r.event.kind for r in await store.read("s-1")]
    assert kinds == [K.EVENT_EXECUTION_START, K.EVENT_MODEL_CALL, K.EVENT_OUTPUT]
