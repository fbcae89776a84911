"""Sessions over the real wire: the Exec, Get, List and Replay behaviours of spec 6.4.

The host runs the real controller and servicers on a loopback port; the echo harness of most
tests runs in its own process (``agentsessions-harness serve``) reached over Harness.Connect.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from agentsessions.host.controller.deltas import DeltaBatching
from agentsessions.host.journal import open_store
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.echo import EchoModel
from agentsessions.v1 import common_pb2, session_pb2
from tests.support.harnesses import GateHarness
from tests.support.host import HostUnderTest, counting_ids, running_host, text_input
from tests.support.processes import HarnessProcess, harness_process, serve_argv
from tests.support.raw_harness import scripted_harness

K = common_pb2.EventKind
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
async def echo_process() -> AsyncIterator[HarnessProcess]:
    async with harness_process(serve_argv("agentsessions.harnesses.echo:EchoHarness")) as proc:
        yield proc


@pytest.fixture
async def probe_process() -> AsyncIterator[HarnessProcess]:
    env_path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env_path}" if env_path else str(ROOT)
    try:
        async with harness_process(serve_argv("tests.support.harnesses:ProbeHarness")) as proc:
            yield proc
    finally:
        if env_path:
            os.environ["PYTHONPATH"] = env_path
        else:
            os.environ.pop("PYTHONPATH", None)


@pytest.fixture
async def host(store: JournalStore, echo_process: HarnessProcess) -> AsyncIterator[HostUnderTest]:
    async with running_host(store, remote={"remote-echo": echo_process.address}) as h:
        yield h


def records(updates: list[session_pb2.ExecUpdate]) -> list[common_pb2.LogRecord]:
    return [u.record for u in updates if u.WhichOneof("update") == "record"]


def kinds(recs: list[common_pb2.LogRecord]) -> list[str]:
    return [K.Name(r.event.kind) for r in recs]


def say(session: str, text: str, **kw: object) -> session_pb2.ExecRequest:
    return session_pb2.ExecRequest(session=session, inputs=[text_input(text)], **kw)  # type: ignore[arg-type]


async def new_session(
    host: HostUnderTest, harness: str = "remote-echo", **meta: object
) -> session_pb2.Session:
    s = session_pb2.Session(harness=harness, **meta)  # type: ignore[arg-type]
    created: session_pb2.Session = await host.sessions.CreateSession(
        session_pb2.CreateSessionRequest(session=s)
    )
    return created


async def test_echo_turn_through_a_harness_process(host: HostUnderTest) -> None:
    session = await new_session(host)
    updates = await host.exec(say(session.metadata.uid, "hi"))
    assert updates[0].WhichOneof("update") == "session"
    assert updates[0].session.metadata.uid == session.metadata.uid
    recs = records(updates)
    assert kinds(recs) == [
        "EVENT_EXECUTION_START",
        "EVENT_INPUT",
        "EVENT_MODEL_CALL",
        "EVENT_OUTPUT",
        "EVENT_END",
    ]
    assert [r.seq for r in recs] == [1, 2, 3, 4, 5]
    assert recs[3].event.message.parts[0].text.text == "echo:hi"
    start = recs[0].event.execution_start
    assert start.input_count == 1 and start.harness == "remote-echo" and start.harness_version == "1"
    assert len(recs[0].event.execution_id) == 16
    assert all(r.event.execution_id == recs[0].event.execution_id for r in recs)
    assert recs[0].fence >= 1
    assert await host.store.verify(session.metadata.uid) == 5
    got = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=session.metadata.uid))
    assert got.last_seq == 5 and got.exec_state == session_pb2.EXEC_COMPLETED
    assert got.compute_state == session_pb2.COMPUTE_LIVE


async def test_session_frame_comes_first_and_carries_the_head(host: HostUnderTest) -> None:
    session = await new_session(host)
    await host.exec(say(session.metadata.uid, "one"))
    updates = await host.exec(say(session.metadata.uid, "two"))
    assert updates[0].WhichOneof("update") == "session"
    assert updates[0].session.last_seq == 5
    assert records(updates)[0].seq == 6


async def test_exec_on_unknown_session_is_not_found_on_first_receive(host: HostUnderTest) -> None:
    call = host.sessions.Exec(say("sess-000000000000000000000000", "hi"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_unknown_harness_override_fails_before_any_frame(host: HostUnderTest) -> None:
    session = await new_session(host)
    call = host.sessions.Exec(say(session.metadata.uid, "hi", harness="no-such-harness"))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no-such-harness" in (err.value.details() or "")
    assert (await host.store.head(session.metadata.uid)).seq == 0


async def test_exec_without_a_session_creates_one(host: HostUnderTest) -> None:
    updates = await host.exec(session_pb2.ExecRequest(inputs=[text_input("hi")], harness="remote-echo"))
    created = updates[0].session
    assert created.metadata.uid.startswith("sess-") and len(created.metadata.uid) == 29
    assert created.harness == "remote-echo"
    assert len(records(updates)) == 5
    got = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=created.metadata.uid))
    assert got.last_seq == 5


async def test_three_turns_without_cas_append_at_head(host: HostUnderTest) -> None:
    session = await new_session(host)
    for word in ("a", "b", "c"):
        await host.exec(say(session.metadata.uid, word))
    got = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=session.metadata.uid))
    assert got.last_seq == 15
    assert await host.store.verify(session.metadata.uid) == 15


async def test_expected_last_seq_is_enforced(host: HostUnderTest) -> None:
    uid = (await new_session(host)).metadata.uid
    await host.exec(say(uid, "first", expected_last_seq=0))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.exec(say(uid, "stale", expected_last_seq=0))
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert (await host.store.head(uid)).seq == 5
    updates = await host.exec(say(uid, "bye", expected_last_seq=5))
    assert records(updates)[3].event.message.parts[0].text.text == "echo:bye"


async def test_config_and_cursor_reach_the_harness(
    store: JournalStore, probe_process: HarnessProcess
) -> None:
    config = bytes([0x00, 0xFF, 0x20, 0x0A, 0x09])
    async with running_host(store, remote={"probe": probe_process.address}) as host:
        session = await new_session(host, harness="probe")
        uid = session.metadata.uid
        recs = records(await host.exec(say(uid, "hi", config=config, resume_from_seq=7)))
        assert recs[0].seq == 1 and recs[0].event.kind == K.EVENT_EXECUTION_START
        assert recs[0].event.execution_start.config == config
        assert recs[0].event.execution_start.resume_from_seq == 7
        seen = json.loads(recs[2].event.message.parts[0].text.text)
        assert seen == {
            "config": "00ff200a09",
            "resume_from_seq": 7,
            "history": 0,
            "inputs": ["hi"],
            "session": uid,
        }
        replayed = [r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid, to_seq=1))]
        assert replayed == [recs[0]]


async def test_history_holds_the_prior_turns(store: JournalStore, probe_process: HarnessProcess) -> None:
    async with running_host(store, remote={"probe": probe_process.address}) as host:
        uid = (await new_session(host, harness="probe")).metadata.uid
        first = records(await host.exec(say(uid, "one")))
        second = records(await host.exec(say(uid, "two")))
        assert json.loads(second[2].event.message.parts[0].text.text)["history"] == len(first)


async def test_metadata_is_persisted_and_listed(host: HostUnderTest) -> None:
    meta = session_pb2.Session(
        harness="remote-echo",
        model="gpt-test",
        labels={"team": "a"},
        annotations={"note": "x"},
        origin=common_pb2.Origin(source="github", subject="issue/42", uri="https://example.invalid/42"),
        identity=common_pb2.IdentityRef(principal="user:alice", issuer="test"),
    )
    meta.metadata.name = "named"
    meta.metadata.project = "proj-meta"
    created = await host.sessions.CreateSession(session_pb2.CreateSessionRequest(session=meta))
    assert created.exec_state == session_pb2.EXEC_PENDING
    assert created.compute_state == session_pb2.COMPUTE_NONE
    listed = await host.sessions.ListSessions(session_pb2.ListSessionsRequest(project="proj-meta"))
    (got,) = listed.sessions
    for s in (created, got):
        assert s.metadata.name == "named" and s.model == "gpt-test"
        assert dict(s.labels) == {"team": "a"} and dict(s.annotations) == {"note": "x"}
        assert s.origin.subject == "issue/42" and s.identity.principal == "user:alice"
        assert s.metadata.create_time.seconds > 0


async def test_session_without_metadata_reports_none(host: HostUnderTest) -> None:
    created = await new_session(host)
    assert not created.HasField("origin") and not created.HasField("identity")
    assert created.metadata.project == "default"


async def test_list_pages_through_seven_sessions_by_two(host: HostUnderTest) -> None:
    made = set()
    for i in range(7):
        s = session_pb2.Session(harness="echo")
        s.metadata.project = "paging"
        s.metadata.name = f"s{i}"
        made.add(
            (await host.sessions.CreateSession(session_pb2.CreateSessionRequest(session=s))).metadata.uid
        )
    other = session_pb2.Session(harness="echo")
    other.metadata.project = "elsewhere"
    await host.sessions.CreateSession(session_pb2.CreateSessionRequest(session=other))
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await host.sessions.ListSessions(
            session_pb2.ListSessionsRequest(project="paging", page_size=2, page_token=token)
        )
        pages += 1
        assert len(page.sessions) <= 2
        seen.extend(s.metadata.uid for s in page.sessions)
        token = page.next_page_token
        if not token:
            break
    assert pages == 4 and len(seen) == 7 and set(seen) == made


async def test_bad_page_token_is_invalid_argument(host: HostUnderTest) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.sessions.ListSessions(session_pb2.ListSessionsRequest(page_token="not-a-cursor"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "page_token" in (err.value.details() or "")


async def test_unreachable_harness_is_unavailable_with_nothing_journaled(store: JournalStore) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{probe.getsockname()[1]}"
    async with running_host(store, remote={"gone": dead}) as host:
        uid = (await new_session(host, harness="gone")).metadata.uid
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(say(uid, "hi"))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (await store.head(uid)).seq == 0


def _host_owned(start: object) -> list[common_pb2.Event]:
    assert hasattr(start, "execution_id")
    return [
        common_pb2.Event(
            execution_id=start.execution_id,
            kind=K.EVENT_APPROVAL_RESULT,
            approval_result=common_pb2.ApprovalResult(tool_call_id="x", approved=True),
        )
    ]


def _wrong_execution(start: object) -> list[common_pb2.Event]:
    return [
        common_pb2.Event(
            execution_id="ffffffffffffffff",
            kind=K.EVENT_OUTPUT,
            message=common_pb2.Message(
                role="assistant", parts=[common_pb2.Part(text=common_pb2.TextPart(text="x"))]
            ),
        )
    ]


@pytest.mark.parametrize(
    "script", [_host_owned, _wrong_execution], ids=["host-owned-event", "wrong-execution-id"]
)
async def test_misbehaving_harness_fails_the_turn_with_error_journaled(
    store: JournalStore, script: object
) -> None:
    async with scripted_harness(script) as (address, _), running_host(store, remote={"raw": address}) as host:  # type: ignore[arg-type]
        uid = (await new_session(host, harness="raw")).metadata.uid
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(say(uid, "hi"))
        assert err.value.code() == grpc.StatusCode.INTERNAL
        recs = await store.read(uid)
        assert kinds(recs) == ["EVENT_EXECUTION_START", "EVENT_INPUT", "EVENT_ERROR"]
        assert recs[2].event.error.description
        assert await store.verify(uid) == 3
        got = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
        assert got.exec_state == session_pb2.EXEC_FAILED


async def test_streaming_deltas_do_not_change_the_journal(tmp_path: Path) -> None:
    hashes = []
    deltas = []
    for stream in (True, False):
        store = await open_store(f"{tmp_path}/stream-{stream}.db")
        async with running_host(
            store,
            model=EchoModel(chunk_size=2),
            stream_deltas=stream,
            new_id=counting_ids(),
            # Frames of at most 4 bytes, so this short reply streams in several.
            delta_batching=DeltaBatching(max_bytes=4),
        ) as h:
            uid = (await new_session(h, harness="echo")).metadata.uid
            updates = await h.exec(say(uid, "hello streaming world"))
            deltas.append([u.delta for u in updates if u.WhichOneof("update") == "delta"])
            hashes.append([r.content_hash for r in await store.read(uid)])
        await store.close()
    assert hashes[0] == hashes[1] and len(hashes[0]) == 5
    streamed, plain = deltas
    assert plain == []
    assert "".join(d.chunk for d in streamed) == "echo:hello streaming world"
    assert len(streamed) > 2 and streamed[-1].done and streamed[-1].chunk == ""
    assert all(len(d.chunk) <= 4 for d in streamed)


async def test_overlapping_exec_on_one_session_is_aborted(store: JournalStore) -> None:
    gate = GateHarness()
    async with running_host(store, local={"gate": gate}) as host:
        uid = (await new_session(host, harness="gate")).metadata.uid
        first = asyncio.create_task(host.exec(say(uid, "one")))
        async with asyncio.timeout(10):
            await gate.entered.wait()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(say(uid, "two"))
        assert err.value.code() == grpc.StatusCode.ABORTED
        running = await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=uid))
        assert running.exec_state == session_pb2.EXEC_RUNNING
        assert len(host.controller.guards) == 1  # the running turn's session
        gate.release.set()
        assert kinds(records(await first))[-1] == "EVENT_END"
        assert len(host.controller.guards) == 0


async def test_the_guard_table_holds_only_sessions_in_use(store: JournalStore) -> None:
    """Every operation releases its session's guard entry when it ends, so the table does not
    grow with the sessions a host has served (only DeleteSession used to shrink it)."""
    async with running_host(store) as host:
        uids = [(await new_session(host, harness="echo")).metadata.uid for _ in range(20)]
        for uid in uids:
            await host.exec(say(uid, "hi"))
            await host.sessions.Suspend(session_pb2.SuspendRequest(session=uid))
            await host.sessions.Resume(session_pb2.ResumeRequest(session=uid))
        with pytest.raises(grpc.aio.AioRpcError):
            await host.sessions.Resume(session_pb2.ResumeRequest(session="sess-unknown"))
        assert len(host.controller.guards) == 0


async def test_past_deadline_is_deadline_exceeded(host: HostUnderTest) -> None:
    uid = (await new_session(host)).metadata.uid
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.exec(say(uid, "late", deadline_unix=1))
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert (await host.store.head(uid)).seq == 0


async def test_get_session_errors(host: HostUnderTest) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.sessions.GetSession(session_pb2.GetSessionRequest(uid=""))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "uid" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.sessions.GetSession(session_pb2.GetSessionRequest(uid="sess-unknown"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_bad_exec_fields_name_the_field(host: HostUnderTest) -> None:
    uid = (await new_session(host)).metadata.uid
    bad = [
        (session_pb2.ExecRequest(session=uid, inputs=[common_pb2.Message(role="user")]), "inputs[0].parts"),
        (
            session_pb2.ExecRequest(session=uid, inputs=[common_pb2.Message(parts=text_input("x").parts)]),
            "inputs[0].role",
        ),
        (say(uid, "x", expected_last_seq=-1), "expected_last_seq"),
        (say(uid, "x", resume_from_seq=-3), "resume_from_seq"),
        (say(uid, "x", harness="Bad_Name"), "harness"),
    ]
    for request, field in bad:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await host.exec(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert (err.value.details() or "").startswith(field), err.value.details()
    assert (await host.store.head(uid)).seq == 0


async def test_replay_streams_stored_records_and_is_empty_for_unknown(host: HostUnderTest) -> None:
    uid = (await new_session(host)).metadata.uid
    recs = records(await host.exec(say(uid, "hi")))
    assert [r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid))] == recs
    middle = [
        r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid, from_seq=2, to_seq=3))
    ]
    assert [r.seq for r in middle] == [2, 3]
    assert [r async for r in host.sessions.Replay(session_pb2.ReplayRequest(session="sess-nobody"))] == []


async def test_each_sessions_method_has_a_request_of_its_own_open_for_its_next_call(
    host: HostUnderTest,
) -> None:
    # grpc.aio takes one call a pass for each open request: served through one generic request,
    # a ListSessions under 200 sessions' turns waited ~200 ms behind their Exec calls.
    waiting = [getattr(t.get_coro(), "__qualname__", "") for t in asyncio.all_tasks() if not t.done()]
    registered = sum(name == "AioServer._request_registered_call" for name in waiting)
    assert registered >= len(session_pb2.DESCRIPTOR.services_by_name["Sessions"].methods)
    listed = await host.sessions.ListSessions(session_pb2.ListSessionsRequest(), timeout=30)
    assert list(listed.sessions) == []
