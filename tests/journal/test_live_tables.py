"""The live tables beside the journal (leases, idempotency keys, queued turns), one suite run
against every dialect: the admission program writes EXECUTION_START with its lease, key and queue
entry in one transaction or writes nothing; claims and key reservations have exactly one winner;
the tables survive a reopen; the journal feed announces what this process made durable."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path

import pytest

from agentsessions.host.journal import ConflictError, JournalStore, SessionRow, open_store
from agentsessions.host.journal.feed import DeltaGate, FeedItem, JournalFeed, SessionDeleted
from agentsessions.host.journal.live import (
    DONE,
    PARKED,
    PENDING,
    RETRY,
    RUNNING,
    IdempotencyKeyTaken,
    KeyRecord,
    Lease,
    LiveStore,
    QueuedTurnGone,
)
from agentsessions.v1 import common_pb2, session_pb2
from tests.journal.conftest import StoreFactory

K = common_pb2.EventKind
FAR = 2**62


def live_of(store: JournalStore) -> LiveStore:
    live = LiveStore.of(store)
    assert live is not None
    return live


def start_events(execution_id: str) -> list[common_pb2.Event]:
    return [
        common_pb2.Event(
            execution_id=execution_id,
            kind=K.EVENT_EXECUTION_START,
            execution_start=common_pb2.ExecutionStart(input_count=1, harness="echo"),
        ),
        common_pb2.Event(
            execution_id=execution_id,
            kind=K.EVENT_INPUT,
            message=common_pb2.Message(
                role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text="x"))]
            ),
        ),
    ]


def key(name: str, digest: str = "d", **fields: object) -> KeyRecord:
    now = time.time_ns()
    return dataclasses.replace(
        KeyRecord("user:a", name, "Exec", digest, created_at_ns=now, expires_at_ns=FAR),
        **fields,  # type: ignore[arg-type]
    )


async def new_session(store: JournalStore, uid: str) -> None:
    await store.create_session(SessionRow(uid=uid, project="p", harness="echo"))


async def test_admission_writes_the_start_with_its_lease_and_key_in_one_transaction(
    store: JournalStore,
) -> None:
    live = live_of(store)
    await new_session(store, "s1")
    lease = Lease("s1", "e1", RUNNING, "host-a", FAR)
    reserved = key("k1", execution_id="e1", session="s1")
    await live.reserve_key(reserved)
    records = await live.admit("s1", start_events("e1"), 0, lease, key=reserved)
    assert [r.seq for r in records] == [1, 2]
    assert records[0].fence == 1  # minted in the same transaction
    assert await store.read("s1") == records
    assert await live.lease("s1", "e1") == lease
    held = await live.key("user:a", "k1")
    assert held is not None and held.state == DONE
    assert (held.session, held.execution_id, held.value()["start_seq"]) == ("s1", "e1", 1)
    assert await store.verify("s1") == 2


async def test_a_refused_admission_writes_nothing(store: JournalStore) -> None:
    live = live_of(store)
    await new_session(store, "s1")
    fresh = key("k1")
    with pytest.raises(ConflictError):
        await live.admit("s1", start_events("e1"), 5, Lease("s1", "e1", RUNNING, "a", FAR), key=fresh)
    assert await store.read("s1") == []
    assert await live.lease("s1", "e1") is None
    assert await live.key("user:a", "k1") is None  # the key the refused write added is gone too
    await live.admit("s1", start_events("e1"), 0, Lease("s1", "e1", RUNNING, "a", FAR), key=fresh)
    with pytest.raises(IdempotencyKeyTaken) as taken:
        await live.admit("s1", start_events("e2"), 2, Lease("s1", "e2", RUNNING, "a", FAR), key=key("k1"))
    assert taken.value.existing.execution_id == "e1"
    assert len(await store.read("s1")) == 2
    with pytest.raises(QueuedTurnGone):
        await live.admit("s1", start_events("e3"), 2, Lease("s1", "e3", RUNNING, "a", FAR), queued="nope")
    assert len(await store.read("s1")) == 2


async def test_of_concurrent_claims_and_reservations_exactly_one_wins(store: JournalStore) -> None:
    live = live_of(store)
    expired = Lease("s1", "e1", RUNNING, "dead", 1)
    assert await live.claim(None, expired)
    claims = await asyncio.gather(
        *(live.claim(expired, Lease("s1", "e1", RUNNING, f"host-{i}", FAR, attempts=1)) for i in range(5))
    )
    assert claims.count(True) == 1
    winner = await live.lease("s1", "e1")
    assert winner is not None and winner.owner == f"host-{claims.index(True)}"
    reservations = await asyncio.gather(*(live.reserve_key(key("k", session=f"s{i}")) for i in range(5)))
    assert len({r.session for r in reservations}) == 1
    assert not await live.claim(None, Lease("s1", "e1", RUNNING, "late", FAR))


async def test_leases_renew_release_and_are_found_when_due(store: JournalStore) -> None:
    live = live_of(store)
    await new_session(store, "s1")
    await new_session(store, "s2")
    now = time.time_ns()
    await live.put_lease(Lease("s1", "run", RUNNING, "me/x/1/a", now + 10**12))
    await live.put_lease(Lease("s1", "gone", RUNNING, "other", 1))
    await live.put_lease(Lease("s2", "later", RETRY, "", 0, attempts=1, next_at_ns=now + 10**12))
    await live.put_lease(Lease("s2", "due", RETRY, "", 0, attempts=1, next_at_ns=1))
    await live.put_lease(Lease("s2", "parked", PARKED, "", 0, seen_seq=0))
    renewed = await live.renew("me/x/1/a", 10**12)
    assert [(lease.execution_id, lease.expires_at_ns > now + 10**12) for lease in renewed] == [("run", True)]
    due = {lease.execution_id for lease in await live.candidates("other-machine/")}
    assert due == {"gone", "due"}  # the parked one has not moved since it was seen
    assert "run" in {lease.execution_id for lease in await live.candidates("me/x/")}  # this machine's
    await store.append("s2", start_events("e"), expected_head=0, fence=0, mint_fence=True)
    assert "parked" in {lease.execution_id for lease in await live.candidates("other-machine/")}
    assert not await live.release(Lease("s1", "run", RETRY), "someone-else")
    assert await live.release(Lease("s1", "run", RETRY, next_at_ns=1), "me/x/1/a")
    assert await live.drop_lease("s1", "run")
    assert await live.lease("s1", "run") is None


async def test_cancel_requests_reach_the_owner(store: JournalStore) -> None:
    live = live_of(store)
    await live.put_lease(Lease("s1", "e1", RUNNING, "owner", FAR))
    asked = await live.request_cancel("s1", "e1", "stop it")
    assert asked is not None and asked.cancel_reason == "stop it"
    (renewed,) = await live.renew("owner", 10**9)
    assert renewed.cancel_reason == "stop it"


async def test_queued_turns_keep_their_order_and_leave_with_their_start(store: JournalStore) -> None:
    live = live_of(store)
    await new_session(store, "s1")
    for n in range(3):
        await live.enqueue("s1", f"q{n}", f"request {n}".encode(), "user:a")
    queue = await live.queue("s1")
    assert [q.execution_id for q in queue] == ["q0", "q1", "q2"]
    assert [q.request for q in queue] == [b"request 0", b"request 1", b"request 2"]
    assert queue[0].position < queue[1].position < queue[2].position
    assert await live.idle_queues() == ["s1"]
    with pytest.raises(QueuedTurnGone):  # only the head may start
        await live.admit("s1", start_events("q1"), 0, Lease("s1", "q1", RUNNING, "a", FAR), queued="q1")
    await live.admit("s1", start_events("q0"), 0, Lease("s1", "q0", RUNNING, "a", FAR), queued="q0")
    assert [q.execution_id for q in await live.queue("s1")] == ["q1", "q2"]
    assert await live.idle_queues() == []  # the started turn's lease says it is busy
    assert await live.dequeue("s1", "q2")
    assert [q.execution_id for q in await live.queue("s1")] == ["q1"]


async def test_a_queued_submit_records_its_key(store: JournalStore) -> None:
    live = live_of(store)
    await new_session(store, "s1")
    reserved = key("sub", execution_id="q1", session="s1", method="Submit")
    await live.reserve_key(reserved)
    await live.enqueue("s1", "q1", b"r", "user:a", key=reserved)
    held = await live.key("user:a", "sub")
    assert held is not None and held.state == "queued"
    with pytest.raises(IdempotencyKeyTaken):
        await live.enqueue("s1", "q2", b"r", "user:a", key=key("sub", method="Submit"))


async def test_expired_keys_are_new_again_and_purged(store: JournalStore) -> None:
    live = live_of(store)
    old = key("k", expires_at_ns=time.time_ns() - 1)
    await live.put_key(old)
    assert await live.key("user:a", "k") is None
    fresh = await live.reserve_key(key("k", digest="other"))
    assert fresh.digest == "other" and fresh.state == PENDING
    await live.put_key(key("stale", expires_at_ns=1))
    assert await live.purge_keys() == 1


async def test_the_live_tables_survive_a_reopen(store_factory: StoreFactory) -> None:
    if not store_factory.shared:
        pytest.skip("the memory store keeps nothing across opens")
    store = await store_factory()
    live = live_of(store)
    await live.put_lease(Lease("s1", "e1", RETRY, "", 0, attempts=2, last_error="boom"))
    await live.reserve_key(key("k"))
    await live.enqueue("s1", "q", b"r", "")
    await store.close()
    again = live_of(await store_factory())
    lease = await again.lease("s1", "e1")
    assert lease is not None and (lease.attempts, lease.last_error) == (2, "boom")
    assert await again.key("user:a", "k") is not None
    assert [q.execution_id for q in await again.queue("s1")] == ["q"]


async def test_the_feed_announces_appends_and_deletions_of_this_process(store: JournalStore) -> None:
    live = live_of(store)
    await new_session(store, "s1")
    with live.feed.subscribe("s1") as sub:
        records = await store.append("s1", start_events("e1"), expected_head=0, fence=0, mint_fence=True)
        await store.delete_session("s1", purge=False)
        items = await sub.next(5.0)
    assert items is not None
    assert items[:2] == records
    assert isinstance(items[2], SessionDeleted)


async def test_a_subscription_never_holds_more_than_its_limit() -> None:
    feed = JournalFeed(inbox_limit=3)
    with feed.subscribe("s") as sub:
        for seq in range(1, 3):
            feed.appended("s", [common_pb2.LogRecord(seq=seq)])
        items = await sub.next(1.0)
        assert not sub.take_overflow()
        assert [i.seq for i in items or [] if isinstance(i, common_pb2.LogRecord)] == [1, 2]
        for seq in range(3, 100):
            feed.appended("s", [common_pb2.LogRecord(seq=seq)])
        assert await sub.next(1.0) == []
        assert sub.take_overflow()  # the follower must read what it missed from the journal
        assert await sub.next(0.01) is None
    assert feed.watched("s") == 0


def _record(seq: int, kind: common_pb2.EventKind.ValueType, model_call: str = "") -> common_pb2.LogRecord:
    event = common_pb2.Event(kind=kind)
    if model_call:
        event.model.id = model_call
    return common_pb2.LogRecord(seq=seq, event=event)


def _kinds(items: list[FeedItem] | None) -> list[str]:
    """Each item as ``seq`` for a record, ``chunk`` for a delta."""
    out: list[str] = []
    for item in items or []:
        if isinstance(item, common_pb2.LogRecord):
            out.append(str(item.seq))
        elif isinstance(item, session_pb2.Delta):
            out.append(item.chunk)
    return out


async def test_held_deltas_reach_followers_right_after_their_model_call() -> None:
    """A MODEL_CALL the host ordered without waiting for it: its deltas wait for the record and
    go right after it, in one announcement with the records that follow."""
    feed = JournalFeed()
    K = common_pb2
    with feed.subscribe("s") as sub, feed.subscribe("s") as other:
        feed.appended("s", [_record(1, K.EVENT_INPUT)])
        feed.hold_deltas("s", "m1")
        feed.delta("s", session_pb2.Delta(chunk="a"))
        feed.delta("s", session_pb2.Delta(chunk="b"))
        feed.appended("s", [_record(2, K.EVENT_MODEL_CALL, "m0")])  # another call's: still held
        feed.appended("s", [_record(3, K.EVENT_MODEL_CALL, "m1"), _record(4, K.EVENT_OUTPUT)])
        feed.delta("s", session_pb2.Delta(chunk="c"))  # after the record: straight through
        assert _kinds(await sub.next(1.0)) == ["1", "2", "3", "a", "b", "4", "c"]
        assert _kinds(await other.next(1.0)) == ["1", "2", "3", "a", "b", "4", "c"]
        # A hold whose record never comes is released by the turn that made it.
        feed.hold_deltas("s", "m2")
        feed.delta("s", session_pb2.Delta(chunk="d"))
        assert await sub.next(0.01) is None
        feed.release_deltas("s")
        feed.delta("s", session_pb2.Delta(chunk="e"))
        assert _kinds(await sub.next(1.0)) == ["d", "e"]


def test_a_delta_gate_holds_frames_until_its_model_call_goes_out() -> None:
    out: list[str] = []
    gate = DeltaGate(lambda d: out.append(d.chunk))
    gate.delta(session_pb2.Delta(chunk="x"))
    gate.hold("m1")
    gate.delta(session_pb2.Delta(chunk="y"))
    gate.seen(_record(5, common_pb2.EVENT_OUTPUT))
    assert (out, gate.holding) == (["x"], True)
    gate.hold("m2")  # a new hold lets the earlier one's frames go first
    assert out == ["x", "y"]
    gate.delta(session_pb2.Delta(chunk="z"))
    gate.seen(_record(6, common_pb2.EVENT_MODEL_CALL, "m2"))
    assert (out, gate.holding) == (["x", "y", "z"], False)


async def _cancelled_while_queued(work: Awaitable[list[common_pb2.LogRecord]]) -> None:
    """Start ``work`` and cancel its caller once its write is queued, before the writer commits it."""
    task = asyncio.ensure_future(work)
    await asyncio.sleep(0)  # the caller queues its write and waits on it; the batch has not run
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()  # the caller left before its write's outcome


async def test_an_append_is_announced_at_commit_even_if_its_caller_left(tmp_path: Path) -> None:
    """The writer commits what was queued whatever became of the caller; a watcher of the session
    must still hear of those records (before, the caller's continuation announced them, so a
    cancelled caller left every follower of the session stalled until the next append)."""
    store = await open_store(str(tmp_path / "journal.db"))
    try:
        live = live_of(store)
        await new_session(store, "s1")
        with live.feed.subscribe("s1") as sub:
            await _cancelled_while_queued(
                store.append("s1", start_events("e1"), expected_head=0, fence=0, mint_fence=True)
            )
            items = await sub.next(5.0)
        assert items is not None
        assert [r.seq for r in items if isinstance(r, common_pb2.LogRecord)] == [1, 2]
        assert (await store.head("s1")).seq == 2
    finally:
        await store.close()


async def test_an_admission_is_announced_at_commit_even_if_its_caller_left(tmp_path: Path) -> None:
    store = await open_store(str(tmp_path / "journal.db"))
    try:
        live = live_of(store)
        await new_session(store, "s1")
        lease = Lease("s1", "e1", RUNNING, "host-a", FAR)
        with live.feed.subscribe("s1") as sub:
            await _cancelled_while_queued(live.admit("s1", start_events("e1"), 0, lease))
            items = await sub.next(5.0)
        assert items is not None
        assert [r.seq for r in items if isinstance(r, common_pb2.LogRecord)] == [1, 2]
    finally:
        await store.close()


async def test_an_announcement_that_fails_fails_only_its_own_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What announces a write runs in the writer's settling of the whole batch: if it raised there,
    the batch's other writes must still be settled and the writer keep writing."""
    store = await open_store(str(tmp_path / "journal.db"))
    try:
        live = live_of(store)
        await new_session(store, "s1")
        await new_session(store, "s2")
        announce = live.feed.appended

        def appended(uid: str, records: Sequence[common_pb2.LogRecord]) -> None:
            if uid == "s1":
                raise RuntimeError("a follower's inbox broke")
            announce(uid, records)

        monkeypatch.setattr(live.feed, "appended", appended)
        both = await asyncio.gather(
            store.append("s1", start_events("e1"), expected_head=0, fence=0, mint_fence=True),
            store.append("s2", start_events("e2"), expected_head=0, fence=0, mint_fence=True),
            return_exceptions=True,
        )
        assert isinstance(both[0], RuntimeError)  # durable, but its caller hears what failed
        assert not isinstance(both[1], BaseException) and [r.seq for r in both[1]] == [1, 2]
        assert (await store.head("s1")).seq == 2
        monkeypatch.undo()
        more = await store.append("s2", start_events("e3"), expected_head=2, fence=0, mint_fence=True)
        assert [r.seq for r in more] == [3, 4]
    finally:
        await store.close()
