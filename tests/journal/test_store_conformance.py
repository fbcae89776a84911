"""The journal store contract, run against every backend (see conftest.BACKENDS)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Protocol, cast

import pytest
from google.protobuf import json_format

from agentsessions.host.journal import (
    COMPUTE_COLD,
    COMPUTE_LIVE,
    COMPUTE_NONE,
    ConflictError,
    FencedError,
    InvalidPageTokenError,
    JournalStore,
    SessionExistsError,
    SessionNotFoundError,
    SessionRow,
    StoreError,
    TamperedError,
    canon,
    gojson,
)
from agentsessions.v1 import common_pb2, harness_registry_pb2
from tests.fixtures import GO_JOURNALS

if TYPE_CHECKING:
    from tests.journal.conftest import StoreFactory

FIXTURES = GO_JOURNALS


class Importer(Protocol):
    """Every store here can also take records verbatim (``agentsessions journal import``)."""

    async def import_records(
        self, row: SessionRow, records: Sequence[common_pb2.LogRecord]
    ) -> SessionRow: ...


L = common_pb2.Lifecycle


def text_event(kind: common_pb2.EventKind.ValueType, text: str, execution_id: str = "") -> common_pb2.Event:
    ev = common_pb2.Event(kind=kind, execution_id=execution_id)
    ev.message.role = "user" if kind == common_pb2.EVENT_INPUT else "assistant"
    ev.message.parts.add().text.text = text
    return ev


def inp(text: str) -> common_pb2.Event:
    return text_event(common_pb2.EVENT_INPUT, text)


def lifecycle(kind: common_pb2.Lifecycle.Kind.ValueType, detail: str = "") -> common_pb2.Event:
    return common_pb2.Event(
        kind=common_pb2.EVENT_LIFECYCLE, lifecycle=common_pb2.Lifecycle(kind=kind, detail=detail)
    )


async def new_session(
    store: JournalStore, uid: str, project: str = "p", create_time_ns: int = 0
) -> SessionRow:
    return await store.create_session(SessionRow(uid=uid, project=project, create_time_ns=create_time_ns))


def assert_chain(records: list[common_pb2.LogRecord], start_prev: str = "") -> None:
    prev = start_prev
    for rec in records:
        assert rec.prev_hash == prev, f"seq {rec.seq}"
        assert rec.content_hash == canon.content_hash(rec.event, rec.prev_hash, rec.seq), f"seq {rec.seq}"
        prev = rec.content_hash


# -- session rows -----------------------------------------------------------------------------


async def test_create_and_get_round_trip_metadata(store: JournalStore) -> None:
    row = SessionRow(
        uid="sess-a",
        project="p",
        name="first",
        harness="echo",
        model="m",
        labels={"team": "x", "ü": "ß"},
        annotations={"note": "y"},
        origin=common_pb2.Origin(source="cli", attributes={"k": "v"}),
        identity=common_pb2.IdentityRef(principal="alice"),
    )
    created = await store.create_session(row)
    assert created.create_time_ns > 0 and created.update_time_ns >= created.create_time_ns
    assert (created.last_seq, created.compute_state) == (0, COMPUTE_NONE)
    got = await store.get_session("sess-a")
    assert got is not None
    assert (got.uid, got.project, got.name, got.harness, got.model) == ("sess-a", "p", "first", "echo", "m")
    assert dict(got.labels) == {"team": "x", "ü": "ß"} and dict(got.annotations) == {"note": "y"}
    assert got.origin == row.origin and got.identity == row.identity
    assert got.create_time_ns == created.create_time_ns
    assert (got.last_seq, got.compute_state) == (0, COMPUTE_NONE)


async def test_unset_origin_and_identity_stay_unset_and_empty_ones_stay_empty(store: JournalStore) -> None:
    await store.create_session(SessionRow(uid="unset", project="p"))
    await store.create_session(
        SessionRow(uid="empty", project="p", origin=common_pb2.Origin(), identity=common_pb2.IdentityRef())
    )
    unset, empty = await store.get_session("unset"), await store.get_session("empty")
    assert unset is not None and empty is not None
    assert unset.origin is None and unset.identity is None
    assert empty.origin == common_pb2.Origin() and empty.identity == common_pb2.IdentityRef()


async def test_a_listed_row_is_the_row_got(store: JournalStore) -> None:
    # Every column of a row comes back from a page exactly as from a lookup: text that JSON
    # escapes, labels, unset and empty messages, blobs, a projection and a head.
    rows = [
        SessionRow(
            uid="tricky",
            project="p",
            name='quote " back \\ slash, emoji \U0001f600',
            harness="h\u2028",
            model="m",
            labels={"ü": 'a"b', "k": "\\", "ctl": "\t\n\x1f"},  # NUL is refused by the service
            annotations={"{}": "[]"},
            origin=common_pb2.Origin(source="cli", attributes={"k": "\x7f"}),
            identity=common_pb2.IdentityRef(principal="alice", issuer="i", subject="s"),
        ),
        SessionRow(uid="empty", project="p", origin=common_pb2.Origin(), identity=common_pb2.IdentityRef()),
        SessionRow(uid="unset", project="p"),
    ]
    for row in rows:
        await store.create_session(row)
    start = common_pb2.Event(kind=common_pb2.EVENT_EXECUTION_START, execution_id="e1")
    await store.append("tricky", [start, inp("a")], expected_head=0, fence=0)
    listed, _ = await store.list_sessions("p", 10, "")
    assert sorted(r.uid for r in listed) == ["empty", "tricky", "unset"]
    for row in listed:
        assert row == await store.get_session(row.uid)
    (tricky,) = [r for r in listed if r.uid == "tricky"]
    assert tricky.last_seq == 2 and tricky.labels == rows[0].labels and tricky.name == rows[0].name


async def test_create_twice_is_refused_and_unknown_is_none(store: JournalStore) -> None:
    await new_session(store, "sess-a")
    with pytest.raises(SessionExistsError):
        await new_session(store, "sess-a")
    assert await store.get_session("nope") is None


async def test_append_to_unknown_session_is_not_found(store: JournalStore) -> None:
    with pytest.raises(SessionNotFoundError):
        await store.append("ghost", [inp("x")], expected_head=0, fence=0)
    assert await store.read("ghost") == []


# -- CAS ------------------------------------------------------------------------------------


async def test_cas_explicit_zero_on_empty_session_is_accepted(store: JournalStore) -> None:
    await new_session(store, "s")
    records = await store.append("s", [inp("a"), inp("b")], expected_head=0, fence=0)
    assert [r.seq for r in records] == [1, 2]
    assert_chain(records)
    head = await store.head("s")
    assert (head.seq, head.hash) == (2, records[-1].content_hash)


async def test_cas_stale_head_is_rejected_and_nothing_is_written(store: JournalStore) -> None:
    await new_session(store, "s")
    await store.append("s", [inp("a")], expected_head=0, fence=0)
    with pytest.raises(ConflictError):
        await store.append("s", [inp("b")], expected_head=0, fence=0)  # explicit 0 on a used session
    with pytest.raises(ConflictError):
        await store.append("s", [inp("b")], expected_head=5, fence=0)  # ahead of the head
    assert [r.seq for r in await store.read("s")] == [1]
    records = await store.append("s", [inp("b")], expected_head=1, fence=0)
    assert records[0].seq == 2


async def test_empty_append_checks_but_writes_nothing(store: JournalStore) -> None:
    await new_session(store, "s")
    assert await store.append("s", [], expected_head=0, fence=0) == []
    with pytest.raises(ConflictError):
        await store.append("s", [], expected_head=3, fence=0)
    assert (await store.head("s")).seq == 0


# -- fences ---------------------------------------------------------------------------------


async def test_fencing(store: JournalStore) -> None:
    await new_session(store, "s")
    assert await store.new_fence("s") == 1
    assert await store.new_fence("s") == 2
    with pytest.raises(FencedError):
        await store.append("s", [inp("old writer")], expected_head=0, fence=1)
    await store.append("s", [inp("current")], expected_head=0, fence=2)
    await store.append("s", [inp("newer")], expected_head=1, fence=3)  # greater is accepted
    with pytest.raises(FencedError):
        await store.append("s", [inp("old writer")], expected_head=2, fence=1)
    assert [r.fence for r in await store.read("s")] == [2, 3]
    assert await store.new_fence("s") == 3


async def test_fence_minted_only_at_the_expected_head(store: JournalStore) -> None:
    await new_session(store, "s")
    assert await store.new_fence("s", expected_head=0) == 1
    await store.append("s", [inp("a")], expected_head=0, fence=1)
    with pytest.raises(ConflictError):
        await store.new_fence("s", expected_head=0)  # lost the race for head 0: no fence minted
    assert await store.new_fence("s", expected_head=1) == 2
    with pytest.raises(ConflictError):
        await store.new_fence("s", expected_head=5)
    assert await store.new_fence("s") == 3


async def test_an_append_can_mint_its_fence(store: JournalStore) -> None:
    await new_session(store, "s")
    assert await store.new_fence("s") == 1
    first = await store.append("s", [inp("a"), inp("b")], expected_head=0, fence=0, mint_fence=True)
    assert [r.fence for r in first] == [2, 2]
    assert [r.fence for r in await store.read("s")] == [2, 2]
    with pytest.raises(FencedError):  # the minted fence superseded fence 1
        await store.append("s", [inp("old")], expected_head=2, fence=1)
    with pytest.raises(ConflictError):  # a stale head mints nothing
        await store.append("s", [inp("late")], expected_head=0, fence=0, mint_fence=True)
    await store.append("s", [inp("c")], expected_head=2, fence=2)
    assert await store.new_fence("s") == 3
    empty = await store.append("s", [], expected_head=3, fence=0, mint_fence=True)
    assert empty == [] and await store.new_fence("s") == 5


async def test_fences_are_per_session(store: JournalStore) -> None:
    await new_session(store, "a")
    await new_session(store, "b")
    assert await store.new_fence("a") == 1
    assert await store.new_fence("a") == 2
    assert await store.new_fence("b") == 1


# -- hash chain -----------------------------------------------------------------------------


async def test_stored_hashes_match_spec_vectors(store: JournalStore) -> None:
    golden = json_format.Parse(
        '{"actor":{"issuer":"entra","principal":"agent://a","subject":"sub-1"},"execution_id":"exec-1",'
        '"kind":"EVENT_OUTPUT","message":{"parts":[{"text":{"text":"hello"}}],"role":"assistant"},'
        '"schema_version":1,"ts":"2023-11-14T22:13:20Z"}',
        common_pb2.Event(),
    )
    await new_session(store, "golden")
    (rec,) = await store.append("golden", [golden], expected_head=0, fence=0)
    assert rec.content_hash == "551bd146050c8d630b0c3b999a4445f3792a470db9bca443d8d4a67706283fcc"
    await new_session(store, "legacy")
    (rec,) = await store.append("legacy", [inp("hello")], expected_head=0, fence=1)
    assert rec.content_hash == "62daf59c5c1e5062b1b0d47d5665b34aa52bf7ed0ca8a0b016af2c9827b5d8f6"
    (stored,) = await store.read("legacy")
    assert stored == rec


@pytest.mark.parametrize("fixture", ["mixed-completed", "multi-turn"])
async def test_appending_go_journal_events_reproduces_go_hashes(store: JournalStore, fixture: str) -> None:
    go_records = gojson.load_records(FIXTURES / f"{fixture}.json")
    await new_session(store, "go")
    for rec in go_records:
        (stored,) = await store.append("go", [rec.event], expected_head=rec.seq - 1, fence=rec.fence)
        assert (stored.seq, stored.prev_hash, stored.content_hash) == (rec.seq, rec.prev_hash, rec.hash)
    assert await store.verify("go") == len(go_records)


async def test_append_stores_the_normalized_event(store: JournalStore) -> None:
    ev = inp("hi")
    ev.actor.SetInParent()  # all-empty actor: omitted by the reference writer
    await new_session(store, "s")
    (rec,) = await store.append("s", [ev], expected_head=0, fence=0)
    (stored,) = await store.read("s")
    assert not rec.event.HasField("actor") and not stored.event.HasField("actor")
    assert stored.content_hash == canon.content_hash(inp("hi"), "", 1)


async def test_read_ranges(store: JournalStore) -> None:
    await new_session(store, "s")
    await store.append("s", [inp(str(i)) for i in range(1, 6)], expected_head=0, fence=0)
    assert [r.seq for r in await store.read("s")] == [1, 2, 3, 4, 5]
    assert [r.seq for r in await store.read("s", 0)] == [1, 2, 3, 4, 5]
    assert [r.seq for r in await store.read("s", 2, 4)] == [2, 3, 4]
    assert [r.seq for r in await store.read("s", 4, 0)] == [4, 5]
    assert [r.seq for r in await store.read("s", 6)] == []
    assert (await store.read("s", 3, 3))[0].event.message.parts[0].text.text == "3"


# -- tamper detection -----------------------------------------------------------------------


async def _three_records(store: JournalStore) -> list[common_pb2.LogRecord]:
    await new_session(store, "s")
    return await store.append("s", [inp("alpha"), inp("hello"), inp("omega")], expected_head=0, fence=0)


async def test_verify_passes_an_untouched_journal(store: JournalStore) -> None:
    await _three_records(store)
    assert await store.verify("s") == 3
    assert await store.verify("never-written") == 0


async def test_editing_one_byte_of_a_stored_event_is_detected(
    store: JournalStore, store_factory: StoreFactory
) -> None:
    await _three_records(store)
    await store_factory.corrupt(store, "s", 2, event=lambda blob: blob.replace(b"hello", b"hellp"))
    with pytest.raises(TamperedError) as info:
        await store.verify("s")
    assert info.value.seq == 2 and info.value.session == "s"
    assert "seq 2" in str(info.value)


async def test_editing_a_stored_hash_is_detected(store: JournalStore, store_factory: StoreFactory) -> None:
    records = await _three_records(store)
    forged = "0" * 64
    await store_factory.corrupt(store, "s", 3, hash=forged)
    (stored,) = await store.read("s", 3, 3)
    assert stored.content_hash == forged  # reads return stored hashes verbatim
    with pytest.raises(TamperedError) as info:
        await store.verify("s")
    assert info.value.seq == 3
    # Forging a middle hash breaks the next record's link (or the forged record itself).
    await store_factory.corrupt(store, "s", 3, hash=records[2].content_hash)
    await store_factory.corrupt(store, "s", 1, hash=forged)
    with pytest.raises(TamperedError) as info:
        await store.verify("s")
    assert info.value.seq == 1


async def test_deleting_the_newest_records_is_detected(
    store: JournalStore, store_factory: StoreFactory
) -> None:
    await _three_records(store)
    await store_factory.backend.drop_newest(store, "s")  # what is left still links from genesis
    with pytest.raises(TamperedError) as info:
        await store.verify("s")
    assert info.value.seq == 3


async def test_undecodable_event_is_detected(store: JournalStore, store_factory: StoreFactory) -> None:
    await _three_records(store)
    await store_factory.corrupt(store, "s", 1, event=lambda blob: b"\xff\xff\xff" + blob)
    with pytest.raises(TamperedError) as info:
        await store.verify("s")
    assert info.value.seq == 1


# -- isolation and concurrency --------------------------------------------------------------


async def test_sessions_are_isolated(store: JournalStore) -> None:
    await new_session(store, "a")
    await new_session(store, "b")
    await store.new_fence("a")
    await store.new_fence("a")
    for i in range(3):
        await store.append("a", [inp(f"a{i}")], expected_head=i, fence=2)
        await store.append("b", [inp(f"b{i}")], expected_head=i, fence=0)
    a, b = await store.read("a"), await store.read("b")
    assert [r.event.message.parts[0].text.text for r in a] == ["a0", "a1", "a2"]
    assert [r.event.message.parts[0].text.text for r in b] == ["b0", "b1", "b2"]
    assert_chain(a)
    assert_chain(b)
    assert a[0].prev_hash == b[0].prev_hash == ""
    assert await store.verify("a") == await store.verify("b") == 3


async def _race_for_seq_1(stores: list[JournalStore], writers: int) -> list[BaseException | list[object]]:
    async def writer(i: int) -> list[object]:
        store = stores[i % len(stores)]
        fence = await store.new_fence("race")
        return list(await store.append("race", [inp(f"writer {i}")], expected_head=0, fence=fence))

    return list(await asyncio.gather(*(writer(i) for i in range(writers)), return_exceptions=True))


def _exactly_one_winner(outcomes: list[BaseException | list[object]]) -> None:
    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1, outcomes
    for loser in losers:
        assert isinstance(loser, ConflictError | FencedError), repr(loser)


async def test_concurrent_writers_racing_for_the_same_seq(store: JournalStore) -> None:
    await new_session(store, "race")
    _exactly_one_winner(await _race_for_seq_1([store], 16))
    assert (await store.head("race")).seq == 1
    assert await store.verify("race") == 1


async def test_separate_store_instances_racing_for_the_same_seq(store_factory: StoreFactory) -> None:
    if not store_factory.shared:
        pytest.skip(f"{store_factory.name} stores do not share a database")
    stores = [await store_factory() for _ in range(8)]
    await new_session(stores[0], "race")
    _exactly_one_winner(await _race_for_seq_1(stores, 8))
    for s in stores:
        assert (await s.head("race")).seq == 1
    assert await stores[3].verify("race") == 1


async def test_many_concurrent_sessions_all_commit_and_verify(store: JournalStore) -> None:
    uids = [f"s{i:02d}" for i in range(64)]
    for uid in uids:
        await new_session(store, uid)

    async def turn(uid: str) -> None:
        for i in range(5):
            await store.append(uid, [inp(f"{uid}-{i}")], expected_head=i, fence=0)

    await asyncio.gather(*(turn(u) for u in uids))
    for uid in uids:
        assert await store.verify(uid) == 5
        row = await store.get_session(uid)
        assert row is not None and row.last_seq == 5


async def test_a_failed_cas_fails_only_that_append(store: JournalStore) -> None:
    for uid in ("a", "b", "c"):
        await new_session(store, uid)
    outcomes = await asyncio.gather(
        store.append("a", [inp("ok")], expected_head=0, fence=0),
        store.append("b", [inp("stale")], expected_head=7, fence=0),
        store.append("c", [inp("ok")], expected_head=0, fence=0),
        return_exceptions=True,
    )
    assert isinstance(outcomes[1], ConflictError)
    assert not isinstance(outcomes[0], BaseException) and not isinstance(outcomes[2], BaseException)
    assert [(await store.head(u)).seq for u in ("a", "b", "c")] == [1, 0, 1]


async def test_same_session_appends_in_one_flush_chain_in_order(store: JournalStore) -> None:
    await new_session(store, "s")
    outcomes = await asyncio.gather(
        store.append("s", [inp("first")], expected_head=0, fence=0),
        store.append("s", [inp("second")], expected_head=1, fence=0),
        store.append("s", [inp("conflict")], expected_head=1, fence=0),
        return_exceptions=True,
    )
    assert isinstance(outcomes[2], ConflictError)
    records = await store.read("s")
    assert [r.event.message.parts[0].text.text for r in records] == ["first", "second"]
    assert_chain(records)


# -- persistence ----------------------------------------------------------------------------


async def test_everything_survives_reopen(store_factory: StoreFactory) -> None:
    if not store_factory.shared:
        pytest.skip(f"{store_factory.name} stores are not persistent")
    first = await store_factory()
    await first.create_session(SessionRow(uid="s", project="p", labels={"a": "b"}))
    fence = await first.new_fence("s")
    written = await first.append(
        "s", [inp("a"), lifecycle(L.LIFECYCLE_SUSPEND)], expected_head=0, fence=fence
    )
    reg = harness_registry_pb2.HarnessRegistration(metadata=common_pb2.ResourceMetadata(name="h"))
    await first.put_harness(reg)
    await first.put_tool_receipt("s", "k1", common_pb2.ToolResult(id="c1"))
    await first.close()

    second = await store_factory()
    row = await second.get_session("s")
    assert row is not None
    assert (row.last_seq, row.compute_state, dict(row.labels)) == (2, COMPUTE_COLD, {"a": "b"})
    assert await second.read("s") == written
    assert await second.verify("s") == 2
    assert await second.new_fence("s") == fence + 1
    assert await second.get_harness("h") == reg
    assert await second.get_tool_receipt("s", "k1") == common_pb2.ToolResult(id="c1")
    await second.append("s", [inp("b")], expected_head=2, fence=fence + 1)
    assert await second.verify("s") == 3


# -- compute_state projection ---------------------------------------------------------------


async def test_compute_state_projection(store: JournalStore) -> None:
    await new_session(store, "s")
    steps: list[tuple[common_pb2.Event, str]] = [
        (common_pb2.Event(kind=common_pb2.EVENT_APPROVAL_REQUEST), COMPUTE_NONE),
        (inp("go"), COMPUTE_LIVE),
        (lifecycle(L.LIFECYCLE_SUSPEND), COMPUTE_COLD),
        (common_pb2.Event(kind=common_pb2.EVENT_APPROVAL_RESULT), COMPUTE_COLD),
        (lifecycle(L.LIFECYCLE_BASELINE), COMPUTE_COLD),
        (lifecycle(L.LIFECYCLE_RESUME), COMPUTE_LIVE),
        (lifecycle(L.LIFECYCLE_CANCEL), COMPUTE_LIVE),
        (lifecycle(L.LIFECYCLE_FORK), COMPUTE_COLD),
        (common_pb2.Event(kind=common_pb2.EVENT_END), COMPUTE_LIVE),
    ]
    for i, (ev, expected) in enumerate(steps):
        await store.append("s", [ev], expected_head=i, fence=0)
        row = await store.get_session("s")
        assert row is not None and row.compute_state == expected, f"after step {i}"


# -- fork -----------------------------------------------------------------------------------


async def _parent(store: JournalStore, events: int = 5) -> list[common_pb2.LogRecord]:
    await store.create_session(
        SessionRow(uid="parent", project="p", harness="echo", model="m", annotations={"x": "y"})
    )
    fence = await store.new_fence("parent")
    return await store.append("parent", [inp(str(i)) for i in range(events)], expected_head=0, fence=fence)


async def test_fork_copies_the_prefix_verbatim_and_continues_the_chain(store: JournalStore) -> None:
    parent = await _parent(store)
    marker = lifecycle(L.LIFECYCLE_FORK, "parent@3")
    children = await store.fork(
        "parent",
        3,
        [SessionRow(uid="c1", project="p", name="one"), SessionRow(uid="c2", project="p", labels={"l": "1"})],
        marker,
    )
    assert [c.uid for c in children] == ["c1", "c2"]
    for child in children:
        assert (child.parent_uid, child.fork_seq, child.last_seq) == ("parent", 3, 4)
        assert child.compute_state == COMPUTE_COLD
        got = await store.get_session(child.uid)
        assert got is not None
        assert (got.parent_uid, got.fork_seq, got.last_seq, got.compute_state) == (
            "parent",
            3,
            4,
            COMPUTE_COLD,
        )
        records = await store.read(child.uid)
        assert records[:3] == parent[:3]  # identical seqs, hashes, fences and events
        assert records[3].seq == 4
        assert records[3].prev_hash == parent[2].content_hash
        assert records[3].event == marker
        assert records[3].content_hash == canon.content_hash(marker, parent[2].content_hash, 4)
        assert await store.verify(child.uid) == 4
        fence = await store.new_fence(child.uid)
        (cont,) = await store.append(child.uid, [inp("more")], expected_head=4, fence=fence)
        assert cont.prev_hash == records[3].content_hash
    c1, c2 = await store.get_session("c1"), await store.get_session("c2")
    assert c1 is not None and c2 is not None
    assert (c1.name, dict(c1.labels)) == ("one", {})
    assert (c2.name, dict(c2.labels)) == ("", {"l": "1"})
    assert [r.seq for r in await store.read("parent")] == [1, 2, 3, 4, 5]  # parent untouched


async def test_a_row_carries_its_head_hash(store: JournalStore) -> None:
    """get_session's last_seq and last_hash are the head ``head`` reports, through appends, a fork,
    an import and listing (the controller admits a turn on the row alone)."""

    async def same_head(uid: str) -> None:
        row, head = await store.get_session(uid), await store.head(uid)
        assert row is not None
        assert (row.last_seq, row.last_hash) == (head.seq, head.hash)
        (listed,) = [r for r in (await store.list_sessions("p", 100, ""))[0] if r.uid == uid]
        assert (listed.last_seq, listed.last_hash) == (head.seq, head.hash)

    await new_session(store, "s")
    await same_head("s")
    records = await store.append("s", [inp("a"), inp("b")], expected_head=0, fence=0)
    await same_head("s")
    row = await store.get_session("s")
    assert row is not None and row.last_hash == records[-1].content_hash != ""
    await store.fork("s", 1, [SessionRow(uid="child", project="p")], lifecycle(L.LIFECYCLE_FORK, "s@1"))
    await same_head("child")
    await store.append("child", [inp("c")], expected_head=2, fence=0)
    await same_head("child")
    await cast("Importer", store).import_records(SessionRow(uid="copy", project="p"), records)
    await same_head("copy")


async def test_fork_at_zero_starts_from_genesis(store: JournalStore) -> None:
    await _parent(store)
    marker = lifecycle(L.LIFECYCLE_FORK, "parent@0")
    (child,) = await store.fork("parent", 0, [SessionRow(uid="c", project="p")], marker)
    (rec,) = await store.read("c")
    assert (rec.seq, rec.prev_hash) == (1, "")
    assert rec.content_hash == canon.content_hash(marker, "", 1)
    assert child.last_seq == 1


async def test_fork_is_all_or_nothing(store: JournalStore) -> None:
    await _parent(store)
    await new_session(store, "taken")
    marker = lifecycle(L.LIFECYCLE_FORK, "parent@2")
    with pytest.raises(SessionExistsError):
        await store.fork(
            "parent", 2, [SessionRow(uid="fresh", project="p"), SessionRow(uid="taken", project="p")], marker
        )
    assert await store.get_session("fresh") is None
    assert await store.read("fresh") == []
    assert await store.read("taken") == []
    with pytest.raises(ConflictError):
        await store.fork("parent", 9, [SessionRow(uid="fresh", project="p")], marker)
    with pytest.raises(SessionNotFoundError):
        await store.fork("ghost", 0, [SessionRow(uid="fresh", project="p")], marker)
    assert await store.get_session("fresh") is None


# -- listing --------------------------------------------------------------------------------


async def test_pagination_through_seven_sessions_by_two(store: JournalStore) -> None:
    # Two share a create time, so the uid tie-break is exercised.
    times = {"s1": 100, "s2": 200, "s3": 300, "s4": 300, "s5": 500, "s6": 600, "s7": 50}
    for uid, t in times.items():
        await new_session(store, uid, "p", t)
    await new_session(store, "other", "q", 400)
    seen: list[str] = []
    sizes: list[int] = []
    token = ""
    for _ in range(10):
        rows, token = await store.list_sessions("p", 2, token)
        seen += [r.uid for r in rows]
        sizes.append(len(rows))
        if not token:
            break
        # The reference cursor: unpadded base64url of "<created_at_ns>\x00<uid>" of the page's last row.
        assert "=" not in token
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        assert raw == f"{rows[-1].create_time_ns}\x00{rows[-1].uid}"
    assert seen == ["s6", "s5", "s3", "s4", "s2", "s1", "s7"]
    assert sizes == [2, 2, 2, 1]


async def test_a_listing_again_gives_each_row_as_it_is_now(store: JournalStore) -> None:
    # SQL stores keep listed rows decoded by what they read (journal.listed): a row read again
    # unchanged is not decoded again; any change (an append, a new fence, a delete) is seen.
    labels = {"lines": "one\ntwo", "quote": '"\\'}
    for uid, t in (("a", 3), ("b", 2), ("c", 1)):
        await store.create_session(SessionRow(uid=uid, project="p", create_time_ns=t, labels=labels))
    first, _ = await store.list_sessions("p", 10, "")
    assert [r.uid for r in first] == ["a", "b", "c"] and dict(first[0].labels) == labels
    listed = getattr(getattr(store, "_dialect", None), "listed", None)
    decoded = listed.decoded if listed is not None else 0
    again, _ = await store.list_sessions("p", 10, "")
    assert again == first
    if listed is not None:
        assert listed.decoded == decoded and all(x is y for x, y in zip(again, first, strict=True))
    await store.append("a", [inp("x")], expected_head=0, fence=0)
    await store.new_fence("b")
    await store.delete_session("c", purge=False)
    after, _ = await store.list_sessions("p", 10, "")
    assert [r.uid for r in after] == ["a", "b"]
    assert after[0].last_seq == 1 and after[0] == await store.get_session("a")
    assert after[1] == await store.get_session("b")
    if listed is not None:
        assert listed.decoded == decoded + 2
        assert len(listed) <= 3  # one a session however often it changes


async def test_list_filters_by_exact_project_and_includes_empty_sessions(store: JournalStore) -> None:
    await new_session(store, "a", "p")
    await new_session(store, "b", "p2")
    await new_session(store, "c", "P")
    rows, token = await store.list_sessions("p", 0, "")
    assert ([r.uid for r in rows], token) == (["a"], "")
    assert (rows[0].last_seq, rows[0].compute_state) == (0, COMPUTE_NONE)
    assert [r.uid for r in (await store.list_sessions("p2", 10, ""))[0]] == ["b"]
    assert (await store.list_sessions("nobody", 10, "")) == ([], "")


async def test_page_size_defaults_and_clamps(store: JournalStore) -> None:
    for i in range(60):
        await new_session(store, f"s{i:02d}", "p", 1000 + i)
    rows, token = await store.list_sessions("p", 0, "")
    assert len(rows) == 50 and token
    rows, token = await store.list_sessions("p", -3, "")
    assert len(rows) == 50
    rows, token = await store.list_sessions("p", 100_000, "")
    assert len(rows) == 60 and token == ""


@pytest.mark.parametrize("token", ["not-a-cursor", "%%%", "YWJj", "MTAwAA", "eA==", "MTAwAHMx="])
async def test_bad_page_token_is_refused(store: JournalStore, token: str) -> None:
    await new_session(store, "s1", "p", 100)
    with pytest.raises(InvalidPageTokenError):
        await store.list_sessions("p", 2, token)


# -- delete ---------------------------------------------------------------------------------


async def test_deleted_sessions_are_never_listed_or_got(store: JournalStore) -> None:
    await new_session(store, "keep")
    await new_session(store, "gone")
    await store.append("gone", [inp("x")], expected_head=0, fence=0)
    deleted = await store.delete_session("gone", purge=False)
    assert deleted.uid == "gone"
    assert await store.get_session("gone") is None
    assert [r.uid for r in (await store.list_sessions("p", 10, ""))[0]] == ["keep"]
    with pytest.raises(SessionNotFoundError):
        await store.append("gone", [inp("y")], expected_head=1, fence=0)
    with pytest.raises(SessionNotFoundError):
        await store.delete_session("gone", purge=False)
    with pytest.raises(SessionNotFoundError):
        await store.delete_session("never", purge=True)
    with pytest.raises(SessionExistsError):
        await new_session(store, "gone")  # a uid is never reused


async def test_purge_drops_the_events(store: JournalStore) -> None:
    await new_session(store, "gone")
    await store.append("gone", [inp("x"), inp("y")], expected_head=0, fence=0)
    await store.put_tool_receipt("gone", "k", common_pb2.ToolResult(id="c"))
    await store.delete_session("gone", purge=True)
    assert await store.read("gone") == []
    assert (await store.head("gone")).seq == 0
    assert await store.get_tool_receipt("gone", "k") is None


# -- registry, receipts, tooling ------------------------------------------------------------


async def test_harness_registry(store: JournalStore) -> None:
    def reg(name: str, address: str) -> harness_registry_pb2.HarnessRegistration:
        r = harness_registry_pb2.HarnessRegistration(metadata=common_pb2.ResourceMetadata(name=name))
        r.spec.remote.address = address
        return r

    await store.put_harness(reg("zeta", "a:1"))
    await store.put_harness(reg("alpha", "a:2"))
    await store.put_harness(reg("zeta", "a:3"))  # replaces
    assert await store.get_harness("zeta") == reg("zeta", "a:3")
    assert await store.get_harness("missing") is None
    assert [h.metadata.name for h in await store.list_harnesses()] == ["alpha", "zeta"]
    with pytest.raises(StoreError):
        await store.put_harness(harness_registry_pb2.HarnessRegistration())


async def test_tool_receipts_keep_the_first_outcome(store: JournalStore) -> None:
    await new_session(store, "s")
    first = common_pb2.ToolResult(id="c1", is_error=False)
    first.output.update({"n": 1})
    await store.put_tool_receipt("s", "key", first)
    await store.put_tool_receipt("s", "key", common_pb2.ToolResult(id="c1", is_error=True))
    assert await store.get_tool_receipt("s", "key") == first
    assert await store.get_tool_receipt("s", "other") is None
    assert await store.get_tool_receipt("t", "key") is None


async def test_session_uids_lists_every_session(store: JournalStore) -> None:
    await new_session(store, "b")
    await new_session(store, "a")
    await store.append("a", [inp("x")], expected_head=0, fence=0)
    assert {"a", "b"} <= set(await store.session_uids())


# -- every rule, refused identically by every store ---------------------------------------------
#
# Each case below pins the exception type and the whole message, so that the three stores, which
# share agentsessions.host.journal.rules, cannot drift apart again.


async def _refused(call: Awaitable[object]) -> BaseException:
    try:
        await call
    except StoreError as exc:
        return exc
    raise AssertionError("the store accepted what the rule refuses")


def _is(exc: BaseException, kind: type[StoreError], message: str) -> None:
    assert (type(exc), str(exc)) == (kind, message)


async def test_rule_append_cas_on_the_expected_head(store: JournalStore) -> None:
    await new_session(store, "s")
    await store.append("s", [inp("a")], expected_head=0, fence=0)
    exc = await _refused(store.append("s", [inp("b")], expected_head=5, fence=0))
    _is(exc, ConflictError, "expected_last_seq 5 does not match head 1 of session s")
    exc = await _refused(store.append("s", [inp("b")], expected_head=0, fence=0, mint_fence=True))
    _is(exc, ConflictError, "expected_last_seq 0 does not match head 1 of session s")


async def test_rule_a_fence_mint_at_an_expected_head(store: JournalStore) -> None:
    await new_session(store, "s")
    await store.append("s", [inp("a"), inp("b")], expected_head=0, fence=0)
    exc = await _refused(store.new_fence("s", expected_head=1))
    _is(exc, ConflictError, "expected_last_seq 1 does not match head 2 of session s")
    assert await store.new_fence("s", expected_head=2) == 1


async def test_rule_a_superseded_fence_is_refused(store: JournalStore) -> None:
    await new_session(store, "s")
    await store.new_fence("s")
    await store.new_fence("s")
    exc = await _refused(store.append("s", [inp("a")], expected_head=0, fence=1))
    _is(exc, FencedError, "fence 1 is superseded by fence 2 of session s")


async def test_rule_a_fence_mint_creates_a_missing_row(store: JournalStore) -> None:
    assert await store.new_fence("nobody") == 1
    assert await store.new_fence("nobody", expected_head=0) == 2
    row = await store.get_session("nobody")
    assert row is not None and (row.project, row.last_seq) == ("", 0)


async def test_rule_writes_to_a_missing_or_deleted_session(store: JournalStore) -> None:
    exc = await _refused(store.append("ghost", [inp("x")], expected_head=0, fence=0))
    _is(exc, SessionNotFoundError, "session ghost not found")
    await new_session(store, "gone")
    await store.delete_session("gone", purge=False)
    exc = await _refused(store.append("gone", [inp("x")], expected_head=0, fence=0))
    _is(exc, SessionNotFoundError, "session gone not found")
    exc = await _refused(store.delete_session("gone", purge=True))
    _is(exc, SessionNotFoundError, "session gone not found")
    exc = await _refused(
        store.fork("gone", 0, [SessionRow(uid="c", project="p")], lifecycle(L.LIFECYCLE_FORK))
    )
    _is(exc, SessionNotFoundError, "session gone not found")


async def test_rule_a_uid_is_taken_once(store: JournalStore) -> None:
    await new_session(store, "s")
    exc = await _refused(new_session(store, "s"))
    _is(exc, SessionExistsError, "session s already exists")
    await _parent(store)
    marker = lifecycle(L.LIFECYCLE_FORK, "parent@1")
    exc = await _refused(
        store.fork(
            "parent", 1, [SessionRow(uid="new", project="p"), SessionRow(uid="s", project="p")], marker
        )
    )
    _is(exc, SessionExistsError, "session s already exists")
    exc = await _refused(
        store.fork(
            "parent", 1, [SessionRow(uid="twin", project="p"), SessionRow(uid="twin", project="p")], marker
        )
    )
    _is(exc, SessionExistsError, "fork children must have distinct uids")
    assert await store.get_session("new") is None and await store.get_session("twin") is None


async def test_rule_a_fork_point_lies_within_the_head(store: JournalStore) -> None:
    await _parent(store)
    marker = lifecycle(L.LIFECYCLE_FORK)
    for at_seq in (6, -1):
        exc = await _refused(store.fork("parent", at_seq, [SessionRow(uid="c", project="p")], marker))
        _is(exc, ConflictError, f"fork at_seq {at_seq} is not within 0..5, the head of session parent")
    assert await store.get_session("c") is None


async def test_rule_a_fork_continues_from_a_stored_record(
    store: JournalStore, store_factory: StoreFactory
) -> None:
    # The tampered parent: its record 2 is gone. Forking at 2 would chain the child to nothing.
    await _parent(store)
    await store_factory.backend.drop(store, "parent", 2)
    marker = lifecycle(L.LIFECYCLE_FORK, "parent@2")
    exc = await _refused(store.fork("parent", 2, [SessionRow(uid="c", project="p")], marker))
    _is(
        exc,
        TamperedError,
        "session parent: record seq 2 fails verification: "
        "the record at seq 2 a fork continues from is missing",
    )
    assert await store.get_session("c") is None
    assert await store.read("c") == []
    # Before the gap the prefix is whole, and a fork there is fine.
    (child,) = await store.fork("parent", 1, [SessionRow(uid="c", project="p")], marker)
    assert await store.verify(child.uid) == 2


async def test_rule_a_fork_at_the_head_continues_from_the_recorded_head(
    store: JournalStore, store_factory: StoreFactory
) -> None:
    await _parent(store)
    await store_factory.corrupt(store, "parent", 5, hash="f" * 64)
    exc = await _refused(
        store.fork("parent", 5, [SessionRow(uid="c", project="p")], lifecycle(L.LIFECYCLE_FORK))
    )
    _is(
        exc,
        TamperedError,
        "session parent: record seq 5 fails verification: "
        "the newest record is not the head recorded when it was appended",
    )
    assert await store.get_session("c") is None


async def test_rule_verify_a_gap_in_the_chain(store: JournalStore, store_factory: StoreFactory) -> None:
    await _three_records(store)
    await store_factory.backend.drop(store, "s", 2)
    exc = await _refused(store.verify("s"))
    _is(
        exc,
        TamperedError,
        "session s: record seq 2 fails verification: seq 2 is missing (the next stored record is seq 3)",
    )


async def test_rule_verify_each_link_hash_and_event(store: JournalStore, store_factory: StoreFactory) -> None:
    records = await _three_records(store)
    await store_factory.corrupt(store, "s", 1, hash="0" * 64)
    exc = await _refused(store.verify("s"))
    _is(
        exc,
        TamperedError,
        "session s: record seq 1 fails verification: content_hash does not match the recomputed hash",
    )
    await store_factory.corrupt(store, "s", 1, hash=records[0].content_hash)
    await store_factory.corrupt(store, "s", 2, event=lambda blob: b"\xff\xff\xff" + blob)
    exc = await _refused(store.verify("s"))
    _is(exc, TamperedError, "session s: record seq 2 fails verification: stored event does not decode")
    await store_factory.corrupt(store, "s", 2, event=lambda blob: inp("hello").SerializeToString())
    await store_factory.backend.drop(store, "s", 3)
    forged = common_pb2.LogRecord(seq=3, prev_hash="1" * 64, fence=0, event=inp("omega"))
    forged.content_hash = canon.content_hash(forged.event, forged.prev_hash, 3)
    await store_factory.backend.insert(store, "s", forged)
    exc = await _refused(store.verify("s"))
    _is(
        exc,
        TamperedError,
        "session s: record seq 3 fails verification: prev_hash does not link to the previous record",
    )


async def test_rule_verify_the_head_anchor(store: JournalStore, store_factory: StoreFactory) -> None:
    records = await _three_records(store)
    await store_factory.backend.drop_newest(store, "s")
    exc = await _refused(store.verify("s"))
    _is(
        exc,
        TamperedError,
        "session s: record seq 3 fails verification: seq 3 is missing (the session's head is seq 3)",
    )
    await store_factory.backend.insert(store, "s", records[2])
    assert await store.verify("s") == 3
    extra = common_pb2.LogRecord(seq=4, prev_hash=records[2].content_hash, fence=0, event=inp("more"))
    extra.content_hash = canon.content_hash(extra.event, extra.prev_hash, 4)
    await store_factory.backend.insert(store, "s", extra)
    exc = await _refused(store.verify("s"))
    _is(
        exc,
        TamperedError,
        "session s: record seq 4 fails verification: seq 4 is stored beyond the session's head (seq 3)",
    )
    await store_factory.backend.drop(store, "s", 4)
    replaced = common_pb2.LogRecord(seq=3, prev_hash=records[1].content_hash, fence=0, event=inp("other"))
    replaced.content_hash = canon.content_hash(replaced.event, replaced.prev_hash, 3)
    await store_factory.backend.drop(store, "s", 3)
    await store_factory.backend.insert(store, "s", replaced)
    exc = await _refused(store.verify("s"))
    _is(
        exc,
        TamperedError,
        "session s: record seq 3 fails verification: "
        "the newest record is not the head recorded when it was appended",
    )


async def test_rule_imported_records_form_one_chain(store: JournalStore) -> None:
    records = await _three_records(store)
    importer = cast(Importer, store)
    exc = await _refused(
        importer.import_records(SessionRow(uid="copy", project="p"), [records[0], records[2]])
    )
    _is(
        exc,
        TamperedError,
        "session copy: record seq 3 fails verification: records to import do not form a chain from seq 1",
    )
    assert await store.get_session("copy") is None
    exc = await _refused(importer.import_records(SessionRow(uid="s", project="p"), records))
    _is(exc, SessionExistsError, "session s already exists")
    copied = await importer.import_records(SessionRow(uid="copy", project="p"), records)
    assert copied.last_seq == 3
    assert await store.read("copy") == records
    assert await store.verify("copy") == 3
    (more,) = await store.append("copy", [inp("next")], expected_head=3, fence=0)
    assert more.prev_hash == records[2].content_hash


# -- deleting a fork's parent ---------------------------------------------------------------------


@pytest.mark.parametrize("purge", [False, True])
async def test_deleting_a_parent_keeps_its_children_whole(store: JournalStore, purge: bool) -> None:
    await _parent(store, events=8)
    await store.fork(
        "parent", 5, [SessionRow(uid="mid", project="p")], lifecycle(L.LIFECYCLE_FORK, "parent@5")
    )
    await store.append("mid", [inp(f"m{i}") for i in range(4)], expected_head=6, fence=0)
    await store.fork("mid", 9, [SessionRow(uid="leaf", project="p")], lifecycle(L.LIFECYCLE_FORK, "mid@9"))
    await store.fork("mid", 3, [SessionRow(uid="early", project="p")], lifecycle(L.LIFECYCLE_FORK, "mid@3"))
    before = {uid: await store.read(uid) for uid in ("mid", "leaf", "early")}
    await store.delete_session("mid", purge=purge)
    assert await store.read("mid") == ([] if purge else before["mid"])
    await store.delete_session("parent", purge=purge)
    for uid in ("leaf", "early"):
        assert await store.read(uid) == before[uid]
        assert await store.verify(uid) == len(before[uid])
        (rec,) = await store.append(uid, [inp("on")], expected_head=len(before[uid]), fence=0)
        assert rec.prev_hash == before[uid][-1].content_hash
