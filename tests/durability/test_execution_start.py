"""EXECUTION_START carries an execution's config, cursor and input count (spec 4.2): they must
survive a SQLite reopen and reach the harness, over Harness.Connect, whenever the execution runs
again: on controller replay, on Resume, and on Resume of a fork child."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from agentsessions.host.journal.store import JournalStore
from agentsessions.sdk.harness import Start, message_text
from agentsessions.v1 import session_pb2
from tests.durability.harnesses import StartRecorder, served
from tests.durability.models import CountingModel
from tests.durability.wire import K, journal_at, kinds, new_session, records, say, text_of
from tests.support.host import running_host

FIRST_CONFIG = bytes([0x00, 0xFF, 0x20, 0x0A, 0x09])
SECOND_CONFIG = b'{"mode": "second"}'


def seen(start: Start) -> tuple[bytes, int, list[str]]:
    return start.config, start.resume_from_seq, [message_text(m) for m in start.inputs]


async def resumed_tail(store: JournalStore, uid: str, after: int) -> list[str]:
    return kinds((await store.read(uid))[after:])


class TestWireExecutionStartReopenResumeReplayAndFork:
    async def test_config_and_cursor_survive_a_reopen(self, tmp_path: Path, model: CountingModel) -> None:
        db = tmp_path / "journal.db"
        recorder = StartRecorder()
        async with served(recorder) as address:
            async with (
                journal_at(db) as store,
                running_host(store, remote={"recorder": address}, model=model) as host,
            ):
                uid = await new_session(host, "recorder")
                done = records(await host.exec(say(uid, "one", config=FIRST_CONFIG, resume_from_seq=7)))
                assert kinds(done)[-1] == "EVENT_END"
                recorder.fail_next = True
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await host.exec(say(uid, "two", "three", config=SECOND_CONFIG, resume_from_seq=11))
                assert err.value.code() == grpc.StatusCode.INTERNAL
                interrupted = (await store.read(uid))[6:]
                assert kinds(interrupted) == [
                    "EVENT_EXECUTION_START",
                    "EVENT_INPUT",
                    "EVENT_INPUT",
                    "EVENT_OUTPUT",
                    "EVENT_ERROR",
                ]
            first_id, second_id = done[0].event.execution_id, interrupted[0].event.execution_id
            assert [seen(s) for s in recorder.starts] == [
                (FIRST_CONFIG, 7, ["one"]),
                (SECOND_CONFIG, 11, ["two", "three"]),
            ]
            recorder.starts.clear()

            # A new store on the same file and a new host: nothing is remembered but the journal.
            async with (
                journal_at(db) as store,
                running_host(store, remote={"recorder": address}, model=model) as host,
            ):
                start = (await store.read(uid, 7, 7))[0].event.execution_start
                assert (start.config, start.resume_from_seq, start.input_count) == (SECOND_CONFIG, 11, 2)

                report = await host.controller.replay(uid)
                assert report.executions == 1, "the interrupted turn is not replayed"
                (replayed,) = recorder.starts
                assert seen(replayed) == (FIRST_CONFIG, 7, ["one"])
                assert (replayed.session, replayed.execution_id, list(replayed.history)) == (
                    uid,
                    first_id,
                    [],
                )

                (child,) = (await host.sessions.Fork(session_pb2.ForkRequest(session=uid))).children
                child_uid = child.metadata.uid
                for session in (child_uid, uid):
                    await host.sessions.Resume(session_pb2.ResumeRequest(session=session))
                _, for_child, for_parent = recorder.starts
                for again, session in ((for_child, child_uid), (for_parent, uid)):
                    assert seen(again) == (SECOND_CONFIG, 11, ["two", "three"])
                    assert (again.session, again.execution_id) == (session, second_id)
                    assert len(again.history) == len(done) == 6
                    assert again.history[0].execution_start.config == FIRST_CONFIG

                assert await resumed_tail(store, uid, 11) == [
                    "EVENT_MODEL_CALL",
                    "EVENT_OUTPUT",
                    "EVENT_END",
                    "EVENT_LIFECYCLE:LIFECYCLE_RESUME",
                ]
                assert await resumed_tail(store, child_uid, 12) == [
                    "EVENT_MODEL_CALL",
                    "EVENT_OUTPUT",
                    "EVENT_END",
                    "EVENT_LIFECYCLE:LIFECYCLE_RESUME",
                ]
                for session in (uid, child_uid):
                    recs = await store.read(session)
                    outputs = [
                        text_of(r)
                        for r in recs
                        if r.event.kind == K.EVENT_OUTPUT and r.event.execution_id == second_id
                    ]
                    assert outputs == ["saw: two, three", "echo:three"], (
                        "the recorded output is not rewritten"
                    )
                    assert await store.verify(session) == len(recs)
                    assert recs[-2].event.kind == K.EVENT_END and recs[-2].event.execution_id == second_id

                recorder.starts.clear()
                report = await host.controller.replay(uid)
                assert report.executions == 2 and report.model_calls == 0
                assert [seen(s) for s in recorder.starts] == [
                    (FIRST_CONFIG, 7, ["one"]),
                    (SECOND_CONFIG, 11, ["two", "three"]),
                ]
