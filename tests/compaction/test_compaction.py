"""Compaction over real gRPC: ``SessionCompaction.Compact``, ``--compact-above-events`` and
``--compact-above-bytes`` write a
LIFECYCLE_BASELINE carrying the summarizer's answer (a host model call to a scripted
chat-completions endpoint on loopback, journaled like any model call); later turns' Start.history
begins at it; nothing is deleted, the chain verifies, and replay (zero model calls) and fork work
from any seq, before the baseline too. A held history base (history by reference) does not
survive a compaction."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from agentsessions.ext.v1 import compaction_pb2, compaction_pb2_grpc
from agentsessions.host.auth.interceptor import required_role
from agentsessions.host.auth.principals import ADMIN, WRITER
from agentsessions.host.config import ConfigError, HostConfig, add_arguments
from agentsessions.host.controller.compaction import COMPACTOR, INSTRUCTION, CompactionSettings
from agentsessions.host.harnesslink import HISTORY_BY_REFERENCE_MIN_BYTES
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.openai import OpenAIModel
from agentsessions.host.service.compaction import SessionCompactionServicer
from agentsessions.sdk import EventSink, Start
from agentsessions.sdk.extensions import COMPACTION_PRINCIPAL, SUMMARY_PREFIX
from agentsessions.sdk.harness import message_text, text_message
from agentsessions.sdk.servicer import HarnessServicer, add_to_server
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2
from tests.support.host import HostUnderTest, running_host, text_input
from tests.support.scripted_endpoint import Reply, ScriptedEndpoint, scripted_endpoint

K = common_pb2.EventKind
LK = common_pb2.Lifecycle


@pytest.fixture
def endpoint() -> Iterator[ScriptedEndpoint]:
    with scripted_endpoint() as served:
        yield served


@contextlib.asynccontextmanager
async def compaction_stub(host: HostUnderTest) -> AsyncIterator[compaction_pb2_grpc.SessionCompactionStub]:
    """The SessionCompaction service over the host's controller, on a loopback port of its own."""
    server = aio.server()
    compaction_pb2_grpc.add_SessionCompactionServicer_to_server(
        SessionCompactionServicer(host.controller), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield compaction_pb2_grpc.SessionCompactionStub(channel)
    finally:
        await channel.close()
        await server.stop(None)


async def chat_turn(host: HostUnderTest, uid: str, text: str) -> list[common_pb2.LogRecord]:
    updates = await host.exec(session_pb2.ExecRequest(session=uid, inputs=[text_input(text)]))
    return [u.record for u in updates if u.HasField("record")]


async def new_session(host: HostUnderTest, harness: str = "chat") -> str:
    created = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=session_pb2.Session(harness=harness))
    )
    return str(created.metadata.uid)


def sent(endpoint: ScriptedEndpoint, n: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = endpoint.received[n].body["messages"]
    return messages


def contents(messages: list[dict[str, Any]]) -> list[str]:
    return [str(m["content"]) for m in messages]


async def test_compact_writes_a_baseline_and_later_turns_start_from_the_summary(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        Reply.completion("Paris is the capital."),
        Reply.completion("About 2.1 million."),
        Reply.completion("They asked about Paris: capital, 2.1 million people.", usage={"prompt_tokens": 9}),
        Reply.completion("Paris again."),
    )
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url, stream=False)
    async with running_host(store, model=model) as host, compaction_stub(host) as compaction:
        uid = await new_session(host)
        await chat_turn(host, uid, "Capital of France?")
        await chat_turn(host, uid, "Population?")
        before = await store.read(uid)
        answer = await compaction.Compact(compaction_pb2.CompactRequest(session=uid))
        records = list(await store.read(uid))

        # Nothing deleted: the old records are there byte for byte, then the compaction, then the baseline.
        assert records[: len(before)] == list(before)
        added = [r.event for r in records[len(before) :]]
        assert [e.kind for e in added] == [
            K.EVENT_EXECUTION_START, K.EVENT_MODEL_CALL, K.EVENT_OUTPUT, K.EVENT_USAGE, K.EVENT_END,
            K.EVENT_LIFECYCLE,
        ]  # fmt: skip
        assert (
            added[0].execution_start.harness == COMPACTOR and added[2].actor.principal == COMPACTION_PRINCIPAL
        )
        baseline = added[-1]
        assert baseline.lifecycle.kind == LK.LIFECYCLE_BASELINE
        assert baseline.lifecycle.detail == "They asked about Paris: capital, 2.1 million people."
        assert answer.baseline.seq == records[-1].seq and answer.baseline.event == baseline
        assert answer.summarized_records == len(before)
        assert answer.session.last_seq == records[-1].seq
        assert await store.verify(uid) == len(records)
        # The summarizer saw its instruction, the whole conversation, and the request to summarize.
        summarizer = sent(endpoint, 2)
        assert summarizer[0] == {"role": "system", "content": INSTRUCTION}
        assert contents(summarizer[1:5]) == [
            "Capital of France?", "Paris is the capital.", "Population?", "About 2.1 million.",
        ]  # fmt: skip

        # The next turn's history begins at the baseline: the summary first, none of the old turns.
        await chat_turn(host, uid, "And Lyon?")
        assert sent(endpoint, 3) == [
            {"role": "user", "content": SUMMARY_PREFIX + baseline.lifecycle.detail},
            {"role": "user", "content": "And Lyon?"},
        ]
        assert len(endpoint.received) == 4

        # Replay re-runs every turn (the compaction is checked, not re-run): zero model calls.
        report = await host.controller.replay(uid)
        assert report.executions == 3 and report.model_calls == 0 and report.served_model_calls == 3
        assert len(endpoint.received) == 4
        replayed = [r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid))]
        assert replayed == list(await store.read(uid))


async def test_fork_before_the_baseline_sees_the_whole_history_and_after_it_the_summary(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        Reply.completion("A1"),
        Reply.completion("SUMMARY"),
        Reply.completion("before"),
        Reply.completion("after"),
    )
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url, stream=False)
    async with running_host(store, model=model) as host:
        uid = await new_session(host)
        first = await chat_turn(host, uid, "Q1")
        done = await host.controller.compact(uid)
        early, late = [
            (await host.sessions.Fork(session_pb2.ForkRequest(session=uid, at_seq=at)))
            .children[0]
            .metadata.uid
            for at in (first[-1].seq, done.baseline.seq)
        ]
        await chat_turn(host, early, "Q2")
        await chat_turn(host, late, "Q2")
        assert contents(sent(endpoint, 2)) == ["Q1", "A1", "Q2"]
        assert contents(sent(endpoint, 3)) == [SUMMARY_PREFIX + "SUMMARY", "Q2"]
        for child in (early, late):
            report = await host.controller.replay(child)
            assert report.model_calls == 0
            assert await store.verify(child) > 0
        assert len(endpoint.received) == 4


async def test_compaction_above_a_number_of_events_keeps_every_history_bounded(store: JournalStore) -> None:
    # The echo model summarizes too: its "summary" echoes the summarizer's request.
    async with running_host(store, compaction=CompactionSettings(above_events=12)) as host:
        uid = await new_session(host)
        histories = []
        for i in range(12):
            records = await chat_turn(host, uid, f"turn {i}")
            histories.append(records)
        events = [r.event for r in await store.read(uid)]
        baselines = [i for i, e in enumerate(events) if e.kind == K.EVENT_LIFECYCLE]
        assert len(baselines) >= 3
        # Every turn's history (from the latest baseline before it) stays within the policy.
        starts = [i for i, e in enumerate(events) if e.kind == K.EVENT_EXECUTION_START]
        turns = [i for i in starts if events[i].execution_start.harness != COMPACTOR]
        for index in turns:
            begin = max([b for b in baselines if b < index], default=0)
            assert index - begin <= 12 + 6  # at most the policy plus one compaction's records
        report = await host.controller.replay(uid)
        assert report.executions == 12 and report.model_calls == 0


BIG = 12_000  # characters in one input: its INPUT and the echoed OUTPUT are each over that in bytes


def compactions(events: list[common_pb2.Event]) -> list[int]:
    """Where the compactions' EXECUTION_STARTs are."""
    return [
        i
        for i, e in enumerate(events)
        if e.kind == K.EVENT_EXECUTION_START and e.execution_start.harness == COMPACTOR
    ]


async def test_compaction_above_a_number_of_bytes_compacts_a_history_of_few_big_events(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(
        Reply.completion("x" * BIG),
        Reply.completion("The user sent a long text; the assistant answered at length."),
        Reply.completion("ok"),
    )
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url, stream=False)
    # The events threshold alone would never trigger here (a chat turn is 6 records): the bytes do.
    settings = CompactionSettings(above_events=1000, above_bytes=20_000)
    async with running_host(store, model=model, compaction=settings) as host:
        uid = await new_session(host)
        await chat_turn(host, uid, "y" * BIG)
        first = [r.event for r in await store.read(uid)]
        assert compactions(first) == [] and sum(e.ByteSize() for e in first) > 20_000 and len(first) < 10
        await chat_turn(host, uid, "short")
        events = await _events(store, uid)
        # Compacted before the second turn: the compaction, its baseline, then the turn.
        (at,) = compactions(events)
        assert at == len(first)
        assert [e.kind for e in events[at:]] == [
            K.EVENT_EXECUTION_START, K.EVENT_MODEL_CALL, K.EVENT_OUTPUT, K.EVENT_END, K.EVENT_LIFECYCLE,
            K.EVENT_EXECUTION_START, K.EVENT_INPUT, K.EVENT_MODEL_CALL, K.EVENT_OUTPUT, K.EVENT_END,
        ]  # fmt: skip
        baseline = events[at + 4]
        assert baseline.lifecycle.kind == LK.LIFECYCLE_BASELINE
        assert baseline.lifecycle.detail == "The user sent a long text; the assistant answered at length."
        # The second turn's model request starts from the summary, none of the big texts.
        assert sent(endpoint, 2) == [
            {"role": "user", "content": SUMMARY_PREFIX + baseline.lifecycle.detail},
            {"role": "user", "content": "short"},
        ]
        assert await store.verify(uid) == len(events)


async def test_below_the_bytes_threshold_nothing_is_compacted(
    store: JournalStore, endpoint: ScriptedEndpoint
) -> None:
    endpoint.script(*(Reply.completion(f"answer {i}") for i in range(4)))
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url, stream=False)
    async with running_host(store, model=model, compaction=CompactionSettings(above_bytes=20_000)) as host:
        uid = await new_session(host)
        for i in range(4):
            await chat_turn(host, uid, f"question {i}")
        events = await _events(store, uid)
        assert sum(e.ByteSize() for e in events) < 20_000
        assert compactions(events) == []
        assert not any(e.kind == K.EVENT_LIFECYCLE for e in events)
        assert len(endpoint.received) == 4  # no summarizer call


def resolve(argv: list[str], environ: dict[str, str] | None = None) -> HostConfig:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return HostConfig.from_sources(parser.parse_args(argv), environ or {})


def test_the_compaction_thresholds_as_flags_and_variables() -> None:
    assert (resolve([]).compact_above_events, resolve([]).compact_above_bytes) == (0, 0)
    config = resolve(["--compact-above-bytes", "65536", "--compact-above-events", "50"])
    assert (config.compact_above_events, config.compact_above_bytes) == (50, 65536)
    assert resolve([], {"AGENTSESSIONS_COMPACT_ABOVE_BYTES": "4096"}).compact_above_bytes == 4096
    flag_wins = resolve(["--compact-above-bytes", "10"], {"AGENTSESSIONS_COMPACT_ABOVE_BYTES": "4096"})
    assert flag_wins.compact_above_bytes == 10


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--compact-above-bytes", "-1"], {}, "--compact-above-bytes -1 must be 0 (off) or more"),
        (["--compact-above-events", "-1"], {}, "--compact-above-events -1 must be 0 (off) or more"),
        (["--compact-above-bytes", "1MiB"], {}, "--compact-above-bytes '1MiB' is not an integer"),
        ([], {"AGENTSESSIONS_COMPACT_ABOVE_BYTES": "-5"}, "--compact-above-bytes -5 must be 0 (off) or more"),
    ],
)
def test_a_refused_threshold_names_its_flag_and_rule(
    argv: list[str], environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        resolve(argv, environ)
    assert str(refused.value) == message


async def test_compact_refuses_what_it_cannot_do(store: JournalStore, endpoint: ScriptedEndpoint) -> None:
    endpoint.script(Reply.completion("A1"), Reply.completion("SUMMARY"))
    model = OpenAIModel("gpt-test", base_url=endpoint.base_url, stream=False)
    async with running_host(store, model=model) as host, compaction_stub(host) as compaction:
        uid = await new_session(host)
        cases: list[tuple[compaction_pb2.CompactRequest, grpc.StatusCode, str]] = [
            (
                compaction_pb2.CompactRequest(session=uid),
                grpc.StatusCode.FAILED_PRECONDITION,
                "nothing to compact",
            ),
            (compaction_pb2.CompactRequest(session=""), grpc.StatusCode.INVALID_ARGUMENT, "session"),
            (
                compaction_pb2.CompactRequest(session="sess-" + "0" * 24),
                grpc.StatusCode.NOT_FOUND,
                "not found",
            ),
        ]
        for request, code, words in cases:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await compaction.Compact(request)
            assert refused.value.code() == code and words in (refused.value.details() or "")
        await chat_turn(host, uid, "Q1")
        with pytest.raises(grpc.aio.AioRpcError) as stale:
            await compaction.Compact(compaction_pb2.CompactRequest(session=uid, expected_last_seq=1))
        assert stale.value.code() == grpc.StatusCode.ABORTED
        head = (await store.head(uid)).seq
        await compaction.Compact(compaction_pb2.CompactRequest(session=uid, expected_last_seq=head))
        with pytest.raises(grpc.aio.AioRpcError) as again:
            await compaction.Compact(compaction_pb2.CompactRequest(session=uid))
        assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert len(endpoint.received) == 2  # refusals come before any summarizer call


class HistoryHarness:
    """Keeps each Start's history as the harness received it, and asks the model once."""

    def __init__(self) -> None:
        self.histories: dict[str, list[common_pb2.Event]] = {}

    async def describe(self) -> harness_pb2.HarnessDescriptor:
        return harness_pb2.HarnessDescriptor(
            id="history",
            version="1",
            capabilities=harness_pb2.Capabilities(resumability=harness_pb2.RESUMABILITY_STATELESS_REPLAY),
        )

    async def run(self, start: Start, sink: EventSink) -> None:
        self.histories[start.execution_id] = list(start.history)
        await sink.model(
            common_pb2.ModelCall(model="echo", messages=[text_message("user", start.last_input_text())])
        )


async def test_a_held_history_base_does_not_survive_a_compaction(store: JournalStore, tmp_path: Path) -> None:
    address = f"unix:{tmp_path}/h.sock"
    harness = HistoryHarness()
    server = aio.server()
    add_to_server(HarnessServicer(harness), server)
    server.add_insecure_port(address)
    await server.start()
    try:
        async with running_host(store, remote={"history": address}) as host:
            uid = await new_session(host, "history")
            for i in range(12):  # past the threshold: the harness holds the history from here on
                await chat_turn(host, uid, f"{'x' * 4000} {i}")
            assert (
                sum(len(e.SerializeToString()) for e in await _events(store, uid))
                > HISTORY_BY_REFERENCE_MIN_BYTES
            )
            done = await host.controller.compact(uid)
            after = await chat_turn(host, uid, "after the compaction")
            execution_id = after[0].event.execution_id
            seen = harness.histories[execution_id]
            # Exactly the journal from the baseline on: not the held history with new events behind it.
            events = await _events(store, uid)
            assert seen == events[done.baseline.seq - 1 : after[0].seq - 1]
            assert seen[0].lifecycle.kind == LK.LIFECYCLE_BASELINE
            assert message_text(after[-2].event.message) == "echo:after the compaction"
            more = await chat_turn(host, uid, "once more")
            assert harness.histories[more[0].event.execution_id] == events[done.baseline.seq - 1 :]
    finally:
        await server.stop(None)


async def _events(store: JournalStore, uid: str) -> list[common_pb2.Event]:
    return [r.event for r in await store.read(uid)]


def test_compact_needs_the_writer_role() -> None:
    assert required_role("/agentsessions.ext.v1.SessionCompaction/Compact") == WRITER
    assert required_role("/agentsessions.ext.v1.SessionCompaction/Other") == ADMIN
