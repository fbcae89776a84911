"""LiveSessions.Watch on an in-process host: every record with seq > after_seq exactly once and in
order, then live records, state changes and deltas; a slow watcher catches up from the journal;
a deleted session ends its watches; bad requests answer before anything streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

import grpc
import pytest

from agentsessions.ext.v1 import live_pb2
from agentsessions.host.controller.state import SessionView
from agentsessions.host.journal.feed import JournalFeed
from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.v1 import common_pb2, session_pb2
from tests.live.world import WAIT_S, LiveHost, exec_request, live_host

K = common_pb2.EventKind


async def run_turn(host: LiveHost, uid: str, text: str) -> list[common_pb2.LogRecord]:
    return [u.record async for u in host.client.exec(uid, text) if u.WhichOneof("update") == "record"]


async def test_watch_without_follow_is_every_record_after_the_offset(host: LiveHost) -> None:
    uid = await host.create("echo")
    await run_turn(host, uid, "one")
    await run_turn(host, uid, "two")
    journal = await host.records(uid)
    for after in (0, 3, 9, 10, 50):
        updates = [u async for u in host.client.watch(uid, after_seq=after, follow=False)]
        assert updates[0].WhichOneof("update") == "session"
        assert updates[0].session.last_seq == 10
        records = [u.record for u in updates[1:]]
        assert all(u.WhichOneof("update") == "record" for u in updates[1:])
        assert records == journal[after:]


async def test_watch_follows_a_turn_live_with_state_changes_and_deltas(host: LiveHost) -> None:
    uid = await host.create()
    watched: list[live_pb2.WatchUpdate] = []
    ended = asyncio.Event()
    running = asyncio.Event()
    following = asyncio.Event()

    async def follow() -> None:
        async for update in host.client.watch(uid, include_deltas=True):
            watched.append(update)
            following.set()
            if update.HasField("session") and update.session.exec_state == session_pb2.EXEC_RUNNING:
                running.set()
            if update.HasField("session") and update.session.exec_state == session_pb2.EXEC_COMPLETED:
                ended.set()
                return

    watcher = asyncio.create_task(follow())
    # The turn starts once the watcher has the session as it stood (else, under load, its first
    # item is the turn already running).
    async with asyncio.timeout(WAIT_S):
        await following.wait()
    exec_call = host.client.exec(uid, "hi")
    first = await anext(exec_call)
    assert first.WhichOneof("update") == "session"
    assert await host.harness.next_started() == "hi"
    # Held until the watcher saw it running: one behind a fast turn may not (docs/live.md).
    async with asyncio.timeout(WAIT_S):
        await running.wait()
    host.harness.open("hi")
    exec_updates = [u async for u in exec_call]
    streamed = [u.record for u in exec_updates if u.WhichOneof("update") == "record"]
    async with asyncio.timeout(WAIT_S):
        await ended.wait()
    await watcher
    kinds = [u.WhichOneof("update") for u in watched]
    assert kinds[0] == "session" and watched[0].session.exec_state == session_pb2.EXEC_PENDING
    records = [u.record for u in watched if u.HasField("record")]
    assert records == streamed == await host.records(uid)
    states = [u.session.exec_state for u in watched if u.HasField("session")]
    assert states == [session_pb2.EXEC_PENDING, session_pb2.EXEC_RUNNING, session_pb2.EXEC_COMPLETED]
    deltas = [u.delta for u in watched if u.HasField("delta")]
    assert "".join(d.chunk for d in deltas) == "echo:hi"
    assert deltas[-1].done
    # Each delta comes after its call's MODEL_CALL and before the OUTPUT it streams, on the Exec
    # stream as for the watcher (the echo model streams before its MODEL_CALL is durable: the
    # host orders the record without waiting for it, and holds the frames until it has gone out).
    updates: list[live_pb2.WatchUpdate] | list[session_pb2.ExecUpdate]
    for updates in (watched, exec_updates):
        kinds_at = [u.record.event.kind if u.WhichOneof("update") == "record" else None for u in updates]
        delta_at = [i for i, u in enumerate(updates) if u.WhichOneof("update") == "delta"]
        assert len(delta_at) == len(deltas)
        model_call_at, output_at = kinds_at.index(K.EVENT_MODEL_CALL), kinds_at.index(K.EVENT_OUTPUT)
        assert all(model_call_at < i < output_at for i in delta_at), updates


async def test_many_watchers_see_the_same_records_once(host: LiveHost) -> None:
    uid = await host.create("echo")
    done = [asyncio.Event() for _ in range(10)]
    seen: list[list[common_pb2.LogRecord]] = [[] for _ in range(10)]

    async def follow(i: int) -> None:
        async for update in host.client.watch(uid):
            if update.HasField("record"):
                seen[i].append(update.record)
                if len(seen[i]) == 15:
                    done[i].set()
                    return

    watchers = [asyncio.create_task(follow(i)) for i in range(10)]
    for text in ("a", "b", "c"):
        await run_turn(host, uid, text)
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(*(d.wait() for d in done))
    await asyncio.gather(*watchers)
    journal = await host.records(uid)
    assert all(records == journal for records in seen)


async def test_a_slow_watcher_catches_up_from_the_journal(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "journal.db")
    store.feed = JournalFeed(inbox_limit=4)  # any burst overflows the inbox
    try:
        async with live_host(store) as host:
            uid = await host.create("echo")
            assert host.controller.live is not None
            watch = host.controller.live.watch(
                uid, 0, host.controller.live.settings.host_call, follow=True, include_deltas=True
            )
            first = await anext(watch)
            assert isinstance(first, SessionView) and first.row.uid == uid  # then the watcher stops reading
            for n in range(8):
                await run_turn(host, uid, f"turn {n}")
            assert store.feed.watched(uid) == 1
            journal = await host.records(uid)
            records: list[common_pb2.LogRecord] = []
            async with asyncio.timeout(WAIT_S):
                async for item in watch:
                    if isinstance(item, common_pb2.LogRecord):
                        records.append(item)
                        if len(records) == len(journal):
                            break
            assert isinstance(watch, AsyncGenerator)
            await watch.aclose()
            assert records == journal
            assert store.feed.watched(uid) == 0
    finally:
        await store.close()


async def test_deleting_a_session_ends_its_watches(host: LiveHost) -> None:
    uid = await host.create("echo")
    await run_turn(host, uid, "hi")
    caught_up = asyncio.Event()

    async def follow() -> None:
        async for update in host.client.watch(uid):
            if update.HasField("record") and update.record.seq == 5:
                caught_up.set()

    watcher = asyncio.create_task(follow())
    async with asyncio.timeout(WAIT_S):
        await caught_up.wait()
    await host.client.delete_session(uid)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with asyncio.timeout(WAIT_S):
            await watcher
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "deleted" in (err.value.details() or "")


@pytest.mark.parametrize(
    ("request_", "code", "names"),
    [
        (live_pb2.WatchRequest(), grpc.StatusCode.INVALID_ARGUMENT, "session"),
        (
            live_pb2.WatchRequest(session="sess-x", after_seq=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "after_seq",
        ),
        (
            live_pb2.WatchRequest(session="sess-000000000000000000000000"),
            grpc.StatusCode.NOT_FOUND,
            "not found",
        ),
    ],
)
async def test_bad_watch_requests_answer_before_anything_streams(
    host: LiveHost, request_: live_pb2.WatchRequest, code: grpc.StatusCode, names: str
) -> None:
    call = host.live.Watch(request_)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call.read()
    assert err.value.code() == code
    assert names in (err.value.details() or "")


async def test_a_watch_sees_a_turn_submitted_by_another_client_from_its_start(host: LiveHost) -> None:
    uid = await host.create("echo")
    await run_turn(host, uid, "before")
    response = await host.live.Submit(live_pb2.SubmitRequest(exec=exec_request(uid, "detached")))
    records = await host.wait_for(uid, lambda rs: len(rs) == 10, "the submitted turn's END")
    assert records[response.start_seq - 1].event.execution_id == response.execution_id
    assert records[-1].event.kind == K.EVENT_END
