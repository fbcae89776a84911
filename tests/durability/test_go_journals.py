"""Journals the Go reference host wrote (v0.1.2 writer and its successor; spec 4.9).

Every fixture imports through ``agentsessions journal import`` with its hashes intact; completed
journals replay with zero model calls; interrupted ones resume the way the legacy writer would
have finished them (id-less records, the Go hash of the completing END); the shapes a legacy
turn cannot resume from are refused without writing anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from agentsessions.host import cli
from agentsessions.host.journal.store import JournalStore
from agentsessions.sdk.harness import message_text
from agentsessions.v1 import common_pb2, session_pb2
from tests.durability.commands import Command
from tests.durability.harnesses import StartRecorder, served
from tests.durability.models import CountingModel
from tests.durability.wire import K, append_raw, chain, journal_at, kinds, new_session, records, say, text_of
from tests.fixtures import GO_JOURNALS
from tests.support.host import HostUnderTest, running_host, text_input

FIXTURES = GO_JOURNALS
# The model-input hash (I0) of the echo harness's request for "hello", as the Go writer recorded it.
HELLO_INPUT_HASH = "2611c24a1a665deca46265ed96d1e1efc699260c9cba9c07f22cda7939232c30"


def fixture_names() -> list[str]:
    names = sorted(p.stem for p in FIXTURES.glob("*.json"))
    assert len(names) == 10, f"expected the ten Go journals under {FIXTURES}"
    return names


def dumped(name: str) -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = json.loads((FIXTURES / f"{name}.json").read_text())
    return loaded


def uid_of(name: str) -> str:
    return "sess-" + name


async def import_fixtures(db: Path, *names: str) -> None:
    """``agentsessions journal import`` of each fixture into ``db``, as session ``sess-<name>``."""
    for name in names:
        argv = ["journal", "import", "--journal", str(db), str(FIXTURES / f"{name}.json")]
        argv += ["--session", uid_of(name), "--harness", "wire-echo"]
        assert await asyncio.to_thread(cli.main, argv) == 0, name


@contextlib.asynccontextmanager
async def go_host(
    tmp_path: Path, model: CountingModel, wire_echo: str, *names: str
) -> AsyncIterator[HostUnderTest]:
    db = tmp_path / "go.db"
    await import_fixtures(db, *names)
    async with (
        journal_at(db) as store,
        running_host(store, remote={"wire-echo": wire_echo}, model=model) as host,
    ):
        yield host


async def resume(host: HostUnderTest, name: str = "", *, session: str = "") -> session_pb2.Session:
    request = session_pb2.ResumeRequest(session=session or uid_of(name))
    resumed: session_pb2.Session = await host.sessions.Resume(request)
    return resumed


async def test_every_fixture_imports_with_identical_hashes(tmp_path: Path) -> None:
    names = fixture_names()
    db = tmp_path / "go.db"
    await import_fixtures(db, *names)
    async with journal_at(db) as store:
        for name in names:
            stored = await store.read(uid_of(name))
            expected = [(r["Seq"], r["PrevHash"], r["Hash"], r["Fence"]) for r in dumped(name)]
            assert [(r.seq, r.prev_hash, r.content_hash, r.fence) for r in stored] == expected, name
            assert await store.verify(uid_of(name)) == len(expected)


@pytest.mark.parametrize(
    ("name", "outputs"),
    [
        ("completed", ["echo:hello"]),
        ("multi-turn", ["echo:first", "echo:second"]),
        ("upgraded-resume", ["echo:hello"]),
        ("mixed-completed", ["echo:hello", "echo:new"]),
    ],
)
async def test_completed_journals_replay_with_zero_model_calls(
    tmp_path: Path, model: CountingModel, wire_echo: str, name: str, outputs: list[str]
) -> None:
    async with go_host(tmp_path, model, wire_echo, name) as host:
        before = await chain(host.store, uid_of(name))
        report = await host.controller.replay(uid_of(name))
        assert report.outputs == outputs
        assert report.executions == len(outputs) and report.model_calls == 0
        assert model.calls == []
        assert await chain(host.store, uid_of(name)) == before


async def test_crashed_input_resumes_with_one_call_and_id_less_records(
    tmp_path: Path, model: CountingModel, wire_echo: str
) -> None:
    async with go_host(tmp_path, model, wire_echo, "crashed-input") as host:
        await resume(host, "crashed-input")
        recs = await host.store.read(uid_of("crashed-input"))
        assert kinds(recs[1:]) == [
            "EVENT_MODEL_CALL",
            "EVENT_OUTPUT",
            "EVENT_END",
            "EVENT_LIFECYCLE:LIFECYCLE_RESUME",
        ]
        assert all(r.event.execution_id == "" for r in recs), "a legacy turn stays id-less"
        assert recs[1].event.model.input_hash == HELLO_INPUT_HASH
        assert text_of(recs[2]) == "echo:hello"
        assert len(model.calls) == 1
        assert await host.store.verify(uid_of("crashed-input")) == 5


async def test_crashed_output_resume_writes_the_go_hash_of_the_completing_end(
    tmp_path: Path, model: CountingModel, wire_echo: str
) -> None:
    async with go_host(tmp_path, model, wire_echo, "crashed-output") as host:
        await resume(host, "crashed-output")
        recs = await host.store.read(uid_of("crashed-output"))
        assert kinds(recs[3:]) == ["EVENT_END", "EVENT_LIFECYCLE:LIFECYCLE_RESUME"]
        upgraded = dumped("upgraded-resume")[3]
        assert (recs[3].seq, recs[3].prev_hash, recs[3].content_hash) == (
            upgraded["Seq"],
            upgraded["PrevHash"],
            upgraded["Hash"],
        )
        assert model.calls == []

        # The upgraded session takes a new turn from the newer writer, and replays whole.
        turn = records(await host.exec(say(uid_of("crashed-output"), "new")))
        assert turn[0].event.kind == K.EVENT_EXECUTION_START and text_of(turn[3]) == "echo:new"
        report = await host.controller.replay(uid_of("crashed-output"))
        assert report.outputs == ["echo:hello", "echo:new"] and report.model_calls == 0
        assert len(model.calls) == 1


async def test_multi_turn_crashed_output_finishes_the_last_legacy_turn(
    tmp_path: Path, model: CountingModel, wire_echo: str
) -> None:
    async with go_host(tmp_path, model, wire_echo, "multi-turn-crashed-output") as host:
        await resume(host, "multi-turn-crashed-output")
        recs = await host.store.read(uid_of("multi-turn-crashed-output"))
        assert kinds(recs[7:]) == ["EVENT_END", "EVENT_LIFECYCLE:LIFECYCLE_RESUME"]
        assert recs[7].event.execution_id == ""
        assert model.calls == []


async def test_crashed_model_refuses_to_resume_and_writes_nothing(
    tmp_path: Path, model: CountingModel, wire_echo: str
) -> None:
    async with go_host(tmp_path, model, wire_echo, "crashed-model") as host:
        before = await chain(host.store, uid_of("crashed-model"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await resume(host, "crashed-model")
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "recorded completion missing" in (err.value.details() or "")
        assert await chain(host.store, uid_of("crashed-model")) == before
        assert model.calls == []


async def test_model_error_resume_does_not_redrive(
    tmp_path: Path, model: CountingModel, wire_echo: str
) -> None:
    async with go_host(tmp_path, model, wire_echo, "model-error") as host:
        resumed = await resume(host, "model-error")
        assert resumed.compute_state == session_pb2.COMPUTE_LIVE
        recs = await host.store.read(uid_of("model-error"))
        assert kinds(recs[3:]) == ["EVENT_LIFECYCLE:LIFECYCLE_RESUME"]
        assert model.calls == []


async def test_mixed_interrupted_resume_completes_the_modern_execution(
    tmp_path: Path, model: CountingModel, wire_echo: str
) -> None:
    async with go_host(tmp_path, model, wire_echo, "mixed-interrupted") as host:
        modern = dumped("mixed-interrupted")[4]["Event"]["ExecutionID"]
        await resume(host, "mixed-interrupted")
        recs = await host.store.read(uid_of("mixed-interrupted"))
        assert kinds(recs[8:]) == ["EVENT_END", "EVENT_LIFECYCLE:LIFECYCLE_RESUME"]
        assert recs[8].event.execution_id == modern and recs[8].event.end.state == "COMPLETED"
        assert model.calls == []
        report = await host.controller.replay(uid_of("mixed-interrupted"))
        assert report.outputs == ["echo:hello", "echo:new"] and report.model_calls == 0
        assert await host.store.verify(uid_of("mixed-interrupted")) == 10


async def test_a_new_exec_supersedes_an_abandoned_legacy_tail(
    tmp_path: Path, model: CountingModel, wire_echo: str
) -> None:
    async with go_host(tmp_path, model, wire_echo, "crashed-model") as host:
        uid = uid_of("crashed-model")
        turn = records(await host.exec(say(uid, "new")))
        assert turn[0].seq == 3 and text_of(turn[3]) == "echo:new"
        report = await host.controller.replay(uid)
        assert report.outputs == ["echo:new"] and report.model_calls == 0
        await resume(host, session=uid)
        assert kinds((await host.store.read(uid))[7:]) == ["EVENT_LIFECYCLE:LIFECYCLE_RESUME"]
        assert len(model.calls) == 1, "the abandoned legacy turn is not re-driven"


async def test_legacy_resume_runs_the_last_input_under_a_transport_only_id(
    store: JournalStore, model: CountingModel
) -> None:
    recorder = StartRecorder()
    async with (
        served(recorder) as address,
        running_host(store, remote={"recorder": address}, model=model) as host,
    ):
        uid = await new_session(host, "recorder")
        id_less = [common_pb2.Event(kind=K.EVENT_INPUT, message=text_input(t)) for t in ("first", "second")]
        await append_raw(store, uid, id_less)
        await resume(host, session=uid)
        (start,) = recorder.starts
        assert [message_text(m) for m in start.inputs] == ["second"]
        assert start.execution_id.startswith("legacy-") and len(start.execution_id) == len("legacy-") + 64
        recs = await store.read(uid)
        assert kinds(recs[2:]) == [
            "EVENT_OUTPUT",
            "EVENT_MODEL_CALL",
            "EVENT_OUTPUT",
            "EVENT_END",
            "EVENT_LIFECYCLE:LIFECYCLE_RESUME",
        ]
        assert all(r.event.execution_id == "" for r in recs), "the transport id is never journaled"
        assert text_of(recs[4]) == "echo:second"


async def test_the_replay_command_on_a_go_journal(tmp_path: Path, command: Command) -> None:
    db = tmp_path / "go.db"
    imported = await command("journal", "import", "--journal", db, FIXTURES / "mixed-completed.json")
    assert imported.code == 0, imported.err
    uid = imported.out.split("into session ")[1].split()[0]
    run = await command("replay", "--journal", db, "--session", uid)
    assert run.code == 0, run.err
    served = "2 model calls served from the journal, 0 sent to the provider; 9 records verified"
    assert f"2 executions, 2 outputs; {served}" in run.out
    assert 'output 1: "echo:hello"' in run.out and 'output 2: "echo:new"' in run.out
