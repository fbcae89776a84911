"""The Sessions service end to end (spec 6.4), Fork (spec 1.1) and Suspend/Resume against the
listing, over gRPC on loopback with the echo harness reached over Harness.Connect."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.durability.models import CountingModel
from tests.durability.wire import LK, K, get, kinds, new_session, records, say, text_of
from tests.support.host import HostUnderTest, running_host
from tests.support.processes import HarnessProcess, harness_process, serve_argv


@pytest.fixture
async def echo_process() -> AsyncIterator[HarnessProcess]:
    async with harness_process(serve_argv("agentsessions.harnesses.echo:EchoHarness")) as proc:
        yield proc


class TestSessionsServiceEndToEnd:
    async def test_create_exec_replay_fork_suspend_resume_continue(
        self, store: JournalStore, model: CountingModel, echo_process: HarnessProcess
    ) -> None:
        async with running_host(store, remote={"remote-echo": echo_process.address}, model=model) as host:
            created = await host.sessions.CreateSession(
                session_pb2.CreateSessionRequest(session=session_pb2.Session(harness="remote-echo"))
            )
            uid = created.metadata.uid
            assert created.exec_state == session_pb2.EXEC_PENDING and created.last_seq == 0
            assert created.compute_state == session_pb2.COMPUTE_NONE

            first = records(await host.exec(say(uid, "hi")))
            assert text_of(first[3]) == "echo:hi"

            replayed = [r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid))]
            assert len(replayed) == 5 and all(len(r.content_hash) == 64 for r in replayed)
            assert replayed == first

            forked = await host.sessions.Fork(session_pb2.ForkRequest(session=uid, at_seq=0))
            (child,) = forked.children
            assert child.parent_uid == uid and child.fork_seq == 5 and child.last_seq == 6

            suspended = await host.sessions.Suspend(session_pb2.SuspendRequest(session=uid))
            assert suspended.compute_state == session_pb2.COMPUTE_COLD
            resumed = await host.sessions.Resume(session_pb2.ResumeRequest(session=uid))
            assert resumed.compute_state == session_pb2.COMPUTE_LIVE

            second = records(await host.exec(say(uid, "bye", expected_last_seq=resumed.last_seq)))
            assert second[0].seq == resumed.last_seq + 1
            assert text_of(second[3]) == "echo:bye"
            head = second[-1].seq

            with pytest.raises(grpc.aio.AioRpcError) as err:
                await host.exec(say(uid, "stale", expected_last_seq=0))
            assert err.value.code() == grpc.StatusCode.ABORTED
            assert (await get(host, uid)).last_seq == head
            assert await store.verify(uid) == head
            assert len(model.calls) == 2


@pytest.fixture
async def parent(host: HostUnderTest) -> str:
    """A session with two finished echo turns (records 1..10)."""
    uid = await new_session(host, "wire-echo")
    for text in ("one", "two"):
        await host.exec(say(uid, text))
    return uid


async def fork(host: HostUnderTest, uid: str, **fields: object) -> list[session_pb2.Session]:
    response = await host.sessions.Fork(session_pb2.ForkRequest(session=uid, **fields))  # type: ignore[arg-type]
    return list(response.children)


async def refused(host: HostUnderTest, uid: str, **fields: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await fork(host, uid, **fields)
    return err.value


class TestFork:
    async def test_at_seq_zero_or_below_forks_at_the_head(self, host: HostUnderTest, parent: str) -> None:
        for at_seq in (0, -3):
            (child,) = await fork(host, parent, at_seq=at_seq)
            assert child.fork_seq == 10 and child.last_seq == 11

    async def test_count_is_at_most_128(self, host: HostUnderTest, parent: str) -> None:
        err = await refused(host, parent, count=129)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "count" in (err.details() or "")
        children = await fork(host, parent, count=128)
        assert len({c.metadata.uid for c in children}) == 128
        assert all(c.parent_uid == parent and c.fork_seq == 10 for c in children)
        assert len(await fork(host, parent, count=0)) == 1

    async def test_child_names_must_match_the_count(self, host: HostUnderTest, parent: str) -> None:
        for fields in ({"count": 2, "child_names": ["a"]}, {"child_names": ["a", "b"]}):
            err = await refused(host, parent, **fields)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "child_names" in (err.details() or "")
        named = await fork(host, parent, count=2, child_names=["left", "right"])
        assert [c.metadata.name for c in named] == ["left", "right"]

    async def test_identity_is_refused_even_when_empty(self, host: HostUnderTest, parent: str) -> None:
        for identity in (common_pb2.IdentityRef(), common_pb2.IdentityRef(principal="user:bob")):
            err = await refused(host, parent, identity=identity)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "identity" in (err.details() or "")

    async def test_children_inherit_metadata_but_not_labels_name_or_identity(
        self, host: HostUnderTest
    ) -> None:
        meta = session_pb2.Session(
            harness="wire-echo",
            model="model-1",
            labels={"team": "a"},
            annotations={"note": "kept"},
            origin=common_pb2.Origin(source="github", subject="issue/7", uri="https://example.invalid/7"),
            identity=common_pb2.IdentityRef(principal="user:alice", issuer="test"),
        )
        meta.metadata.project = "proj-fork"
        meta.metadata.name = "parent-name"
        made = await host.sessions.CreateSession(session_pb2.CreateSessionRequest(session=meta))
        uid = made.metadata.uid
        await host.exec(say(uid, "hi"))

        children = await fork(host, uid, count=2, labels={"branch": "b"})
        listed = await host.sessions.ListSessions(session_pb2.ListSessionsRequest(project="proj-fork"))
        by_uid = {s.metadata.uid: s for s in listed.sessions}
        assert set(by_uid) == {uid, *(c.metadata.uid for c in children)}
        for child in [*children, *(by_uid[c.metadata.uid] for c in children)]:
            assert dict(child.labels) == {"branch": "b"}
            assert dict(child.annotations) == {"note": "kept"}
            assert child.origin == meta.origin
            assert child.metadata.project == "proj-fork"
            assert child.model == "model-1" and child.harness == "wire-echo"
            assert child.metadata.name == ""
            assert not child.HasField("identity")
            assert child.parent_uid == uid and child.fork_seq == 5

    async def test_child_shares_the_prefix_then_a_fork_marker(self, host: HostUnderTest, parent: str) -> None:
        (child,) = await fork(host, parent, at_seq=5)
        uid = child.metadata.uid
        assert child.compute_state == session_pb2.COMPUTE_COLD
        theirs = await host.store.read(parent)
        ours = await host.store.read(uid)
        assert len(ours) == 6
        for mine, original in zip(ours[:5], theirs[:5], strict=True):
            assert (mine.seq, mine.prev_hash, mine.content_hash, mine.event) == (
                original.seq,
                original.prev_hash,
                original.content_hash,
                original.event,
            )
        marker = ours[5]
        assert marker.seq == 6 and marker.prev_hash == theirs[4].content_hash
        assert marker.event.kind == K.EVENT_LIFECYCLE and not marker.event.execution_id
        assert marker.event.lifecycle.kind == LK.LIFECYCLE_FORK
        assert marker.event.lifecycle.detail == "parent@5"
        assert await host.store.verify(uid) == 6

        diverged = records(await host.exec(say(uid, "elsewhere")))
        assert diverged[0].seq == 7 and diverged[0].prev_hash == marker.content_hash
        assert text_of(diverged[3]) == "echo:elsewhere"
        assert (await host.store.head(parent)).seq == 10

    async def test_a_session_with_no_events_forks_at_zero(self, host: HostUnderTest) -> None:
        uid = await new_session(host, "wire-echo")
        (child,) = await fork(host, uid)
        assert child.fork_seq == 0 and child.last_seq == 1
        (marker,) = await host.store.read(child.metadata.uid)
        assert marker.prev_hash == "" and marker.event.lifecycle.detail == "parent@0"
        assert text_of(records(await host.exec(say(child.metadata.uid, "first")))[3]) == "echo:first"

    async def test_an_unknown_parent_is_not_found(self, host: HostUnderTest) -> None:
        before = await host.store.session_uids()
        err = await refused(host, "sess-nobody")
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert await host.store.session_uids() == before

    async def test_refused_forks_leave_no_sessions(self, host: HostUnderTest, parent: str) -> None:
        before = await host.store.session_uids()
        listed = await host.sessions.ListSessions(session_pb2.ListSessionsRequest())
        for fields in (
            {"count": 129},
            {"count": 3, "child_names": ["x", "y"]},
            {"identity": common_pb2.IdentityRef()},
            {"at_seq": 11},
        ):
            err = await refused(host, parent, **fields)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, fields
        assert await host.store.session_uids() == before
        again = await host.sessions.ListSessions(session_pb2.ListSessionsRequest())
        assert again == listed

    async def test_children_resume_and_run_new_turns(
        self, host: HostUnderTest, parent: str, model: CountingModel
    ) -> None:
        first, second = (c.metadata.uid for c in await fork(host, parent, count=2))
        calls = len(model.calls)
        resumed = await host.sessions.Resume(session_pb2.ResumeRequest(session=first))
        assert resumed.compute_state == session_pb2.COMPUTE_LIVE and resumed.last_seq == 12
        assert len(model.calls) == calls, "the copied turns are complete: nothing to re-drive"
        assert text_of(records(await host.exec(say(first, "child turn")))[3]) == "echo:child turn"
        assert text_of(records(await host.exec(say(second, "other child")))[3]) == "echo:other child"
        assert (await host.store.head(parent)).seq == 10
        report = await host.controller.replay(first)
        assert report.outputs == ["echo:one", "echo:two", "echo:child turn"] and report.model_calls == 0

    async def test_a_child_forked_at_a_model_call_costs_one_call_on_resume(
        self, host: HostUnderTest, parent: str, model: CountingModel
    ) -> None:
        (child,) = await fork(host, parent, at_seq=3)
        uid = child.metadata.uid
        turn = (await host.store.read(parent))[0].event.execution_id
        calls = len(model.calls)
        await host.sessions.Resume(session_pb2.ResumeRequest(session=uid))
        assert len(model.calls) == calls + 1
        recs = await host.store.read(uid)
        assert kinds(recs[3:]) == [
            "EVENT_LIFECYCLE:LIFECYCLE_FORK",
            "EVENT_OUTPUT",
            "EVENT_END",
            "EVENT_LIFECYCLE:LIFECYCLE_RESUME",
        ]
        assert [r.event.execution_id for r in recs[4:6]] == [turn, turn]
        assert text_of(recs[4]) == "echo:one"
        assert await host.store.verify(uid) == 7


class TestSuspendResumeAgreeWithListing:
    async def test_a_session_with_no_events(self, host: HostUnderTest) -> None:
        meta = session_pb2.Session(harness="wire-echo")
        meta.metadata.project = "listing"
        made = await host.sessions.CreateSession(session_pb2.CreateSessionRequest(session=meta))
        uid = made.metadata.uid
        assert made.compute_state == session_pb2.COMPUTE_NONE

        async def listed() -> session_pb2.Session:
            page: session_pb2.ListSessionsResponse = await host.sessions.ListSessions(
                session_pb2.ListSessionsRequest(project="listing")
            )
            (only,) = page.sessions
            return only

        suspended = await host.sessions.Suspend(session_pb2.SuspendRequest(session=uid))
        for seen in (suspended, await get(host, uid), await listed()):
            assert seen.compute_state == session_pb2.COMPUTE_COLD and seen.last_seq == 1
        resumed = await host.sessions.Resume(session_pb2.ResumeRequest(session=uid))
        for seen in (resumed, await get(host, uid), await listed()):
            assert seen.compute_state == session_pb2.COMPUTE_LIVE and seen.last_seq == 2
        assert kinds(await host.store.read(uid)) == [
            "EVENT_LIFECYCLE:LIFECYCLE_SUSPEND",
            "EVENT_LIFECYCLE:LIFECYCLE_RESUME",
        ]

    async def test_unknown_and_empty_sessions(self, host: HostUnderTest) -> None:
        for uid, code in (
            ("sess-unknown", grpc.StatusCode.NOT_FOUND),
            ("", grpc.StatusCode.INVALID_ARGUMENT),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await host.sessions.Suspend(session_pb2.SuspendRequest(session=uid))
            assert err.value.code() == code
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await host.sessions.Resume(session_pb2.ResumeRequest(session=uid))
            assert err.value.code() == code
