"""Controller replay (spec 4.3; invariants I0, I1, I2, I5) over a real Harness.Connect stream.

Completed executions re-run against their recorded effects: a real HTTP provider answering random
text receives no request, the harness is handed back byte for byte what it was handed live, the
journal is untouched, and any departure from the record (a changed model request, a changed
output, an effect left unconsumed) is a divergence that the operator command names.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest

from agentsessions.harnesses.echo import EchoHarness
from agentsessions.host.controller.errors import FailedPreconditionError, ReplayDivergedError
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.echo import EchoModel
from agentsessions.host.models.openai import OpenAIModel
from agentsessions.sdk.harness import message_text
from agentsessions.v1 import common_pb2
from tests.durability.commands import Command, agentsessions
from tests.durability.harnesses import StartRecorder, TunableHarness, TwoCallChat, served
from tests.durability.models import CountingModel, RandomModelServer
from tests.durability.wire import K, append_raw, chain, journal_at, kinds, new_session, records, say, text_of
from tests.support.host import HostUnderTest, running_host, text_input


class TestReplayReconstructsNondeterministicOutput:
    async def test_random_completions_come_back_byte_identical(self, store: JournalStore) -> None:
        harness = TwoCallChat()
        with RandomModelServer() as provider:
            model = OpenAIModel("random-model", base_url=provider.base_url)
            async with (
                served(harness) as address,
                running_host(store, remote={"chat2": address}, model=model) as host,
            ):
                uid = await new_session(host, "chat2")
                live_outputs: list[str] = []
                for text in ("hi", "tell me more"):
                    recs = records(await host.exec(say(uid, text)))
                    live_outputs += [text_of(r) for r in recs if r.event.kind == K.EVENT_OUTPUT]
                assert provider.count == 4
                live = list(harness.received)
                assert len(set(live)) == 4, "the provider should answer differently every time"
                for raw in live:
                    parts = common_pb2.Message.FromString(raw).parts
                    assert [p.WhichOneof("part") for p in parts] == ["reasoning", "text"]
                before = await chain(store, uid)

                for _ in range(2):
                    report = await host.controller.replay(uid)
                    assert report.executions == 2 and report.model_calls == 0
                    assert report.outputs == live_outputs
                assert harness.received[4:] == live + live
                assert provider.count == 4
                assert await chain(store, uid) == before
                assert await store.verify(uid) == len(before)
            await model.aclose()


class TestReplayNeverReachesTheProvider:
    async def test_one_request_live_none_from_the_replay_command(self, tmp_path: Path) -> None:
        db = tmp_path / "journal.db"
        with RandomModelServer() as provider:
            async with served(EchoHarness()) as address:
                model = OpenAIModel("random-model", base_url=provider.base_url)
                async with journal_at(db) as store:
                    async with running_host(store, remote={"wire-echo": address}, model=model) as host:
                        uid = await new_session(host, "wire-echo")
                        live = records(await host.exec(say(uid, "hi")))
                        assert provider.count == 1
                        in_process = await host.controller.replay(uid)
                        assert in_process.model_calls == 0 and provider.count == 1
                    before = await chain(store, uid)
                await model.aclose()
                answer = text_of(live[3])
                assert answer.startswith("random:") and in_process.outputs == [answer]

                run = await agentsessions(
                    "replay",
                    "--journal",
                    db,
                    "--session",
                    uid,
                    "--harness",
                    f"wire-echo={address}",
                    "--model",
                    "random-model",
                    "--model-base-url",
                    provider.base_url,
                )
            assert run.code == 0, run.err
            assert provider.count == 1
            from_journal = "1 model calls served from the journal, 0 sent to the provider"
            assert f"1 executions, 1 outputs; {from_journal}" in run.out
            assert f"output 1: {json.dumps(answer)}" in run.out
        async with journal_at(db) as store:
            assert await chain(store, uid) == before


@pytest.fixture
def tunable() -> TunableHarness:
    return TunableHarness()


@pytest.fixture
async def tunable_host(
    store: JournalStore, tunable: TunableHarness, model: CountingModel
) -> AsyncIterator[HostUnderTest]:
    async with served(tunable) as address, running_host(store, remote={"tunable": address}, model=model) as h:
        yield h


async def completed_turn(host: HostUnderTest) -> str:
    uid = await new_session(host, "tunable")
    recs = records(await host.exec(say(uid, "hi")))
    assert kinds(recs) == [
        "EVENT_EXECUTION_START",
        "EVENT_INPUT",
        "EVENT_OUTPUT",
        "EVENT_OUTPUT",
        "EVENT_MODEL_CALL",
        "EVENT_OUTPUT",
        "EVENT_END",
    ]
    report = await host.controller.replay(uid)
    assert report.outputs == ["first", "second", "echo:hi"]
    return uid


class TestReplayI0Mismatch:
    async def test_changed_request_diverges_without_a_provider_call(
        self, tmp_path: Path, tunable: TunableHarness, command: Command
    ) -> None:
        db = tmp_path / "journal.db"
        model = CountingModel(EchoModel())
        async with served(tunable) as address:
            async with (
                journal_at(db) as store,
                running_host(store, remote={"tunable": address}, model=model) as host,
            ):
                uid = await completed_turn(host)
                before = await chain(store, uid)
                tunable.prompt_suffix = " (reworded)"
                with pytest.raises(ReplayDivergedError, match=r"model input hash mismatch.*\(I0\)"):
                    await host.controller.replay(uid)
                assert len(model.calls) == 1
                assert await chain(store, uid) == before

            run = await command(
                "replay", "--journal", db, "--session", uid, "--harness", f"tunable={address}"
            )
        assert run.code == 1
        assert "DIVERGED" in run.err and "model input hash mismatch" in run.err and uid in run.err
        assert run.out == ""
        async with journal_at(db) as store:
            assert await chain(store, uid) == before


def _skip_the_model(tunable: TunableHarness) -> None:
    tunable.call_model = False


def _other_second_output(tunable: TunableHarness) -> None:
    tunable.outputs = ["first", "something else"]


def _a_third_output(tunable: TunableHarness) -> None:
    tunable.outputs = ["first", "second", "third"]


class TestReplayDivergenceDetected:
    @pytest.mark.parametrize(
        ("change", "match"),
        [
            (_skip_the_model, "1 recorded effects unconsumed"),
            (_other_second_output, "output mismatch"),
            (_a_third_output, "asked for output where the journal recorded model"),
        ],
        ids=["under_consumption", "output_divergence", "an_unrecorded_request_diverges"],
    )
    async def test_a_changed_harness_diverges_and_writes_nothing(
        self,
        tunable_host: HostUnderTest,
        tunable: TunableHarness,
        model: CountingModel,
        change: Callable[[TunableHarness], None],
        match: str,
    ) -> None:
        uid = await completed_turn(tunable_host)
        before = await chain(tunable_host.store, uid)
        change(tunable)
        with pytest.raises(ReplayDivergedError, match=match):
            await tunable_host.controller.replay(uid)
        assert len(model.calls) == 1
        assert await chain(tunable_host.store, uid) == before


class TestReplayPreflightsEveryCompletedExecution:
    @pytest.fixture
    async def recorded(
        self, store: JournalStore, model: CountingModel
    ) -> AsyncIterator[tuple[HostUnderTest, StartRecorder, str]]:
        """A host serving the recorder harness, and a session that completed one turn ("one")."""
        recorder = StartRecorder()
        async with (
            served(recorder) as address,
            running_host(store, remote={"recorder": address}, model=model) as host,
        ):
            uid = await new_session(host, "recorder")
            await host.exec(say(uid, "one"))
            yield host, recorder, uid

    async def test_an_unserved_later_harness_stops_replay_before_the_first_run(
        self, store: JournalStore, recorded: tuple[HostUnderTest, StartRecorder, str]
    ) -> None:
        host, recorder, uid = recorded
        later = "00000000000000f2"
        start = common_pb2.ExecutionStart(input_count=1, harness="retired-harness", harness_version="1")
        await append_raw(
            store,
            uid,
            [
                common_pb2.Event(execution_id=later, kind=K.EVENT_EXECUTION_START, execution_start=start),
                common_pb2.Event(execution_id=later, kind=K.EVENT_INPUT, message=text_input("two")),
                common_pb2.Event(
                    execution_id=later, kind=K.EVENT_END, end=common_pb2.HarnessEnd(state="COMPLETED")
                ),
            ],
        )
        recorder.starts.clear()
        with pytest.raises(FailedPreconditionError, match="retired-harness"):
            await host.controller.replay(uid)
        assert recorder.starts == [], "no execution runs before every one is preflighted"

    async def test_an_incomplete_trailing_execution_is_skipped(
        self, recorded: tuple[HostUnderTest, StartRecorder, str]
    ) -> None:
        host, recorder, uid = recorded
        recorder.fail_next = True
        with pytest.raises(grpc.aio.AioRpcError):
            await host.exec(say(uid, "two"))
        recorder.starts.clear()
        report = await host.controller.replay(uid)
        assert report.executions == 1 and report.outputs == ["saw: one", "echo:one"]
        assert [[message_text(m) for m in s.inputs] for s in recorder.starts] == [["one"]]
