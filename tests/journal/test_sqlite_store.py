"""SQLite-only behaviour: file format and schema checks, durability settings, group commit."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from agentsessions.host.journal import (
    ConflictError,
    FencedError,
    SchemaError,
    SessionRow,
    StoreError,
    TamperedError,
    execstate,
    open_store,
)
from agentsessions.host.journal import sqlite as sqlite_store
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.journal.sqlite import APPLICATION_ID, SCHEMA_VERSION, SqliteStore
from agentsessions.v1 import common_pb2
from tests.journal.journals import inp, other_process_appends, parked_turn


async def query(path: Path | str, sql: str) -> list[Any]:
    async with aiosqlite.connect(path) as db:
        return list(await db.execute_fetchall(sql))


async def run_sql(path: Path, *statements: str) -> None:
    async with aiosqlite.connect(path, isolation_level=None) as db:
        for statement in statements:
            await db.execute(statement)


@pytest.fixture
def store(sqlite_store: SqliteStore) -> SqliteStore:
    return sqlite_store


# -- file format ------------------------------------------------------------------------------


async def test_events_table_keeps_the_reference_layout(store: SqliteStore) -> None:
    columns = await query(store.path, "PRAGMA table_info(events)")
    # (name, declared type, not null, primary key position)
    assert [(c[1], c[2], c[3], c[5]) for c in columns] == [
        ("session", "TEXT", 1, 1),
        ("seq", "INTEGER", 1, 2),
        ("prev_hash", "TEXT", 1, 0),
        ("hash", "TEXT", 1, 0),
        ("fence", "INTEGER", 1, 0),
        ("event", "BLOB", 1, 0),
    ]


async def test_event_blobs_are_binary_events_readable_by_an_external_verifier(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    written = await store.append("s", [inp("hello")], expected_head=0, fence=3)
    rows = await query(store.path, "SELECT session, seq, prev_hash, hash, fence, event FROM events")
    assert len(rows) == 1
    session, seq, prev, digest, fence, blob = rows[0]
    assert (session, seq, prev, digest, fence) == ("s", 1, "", written[0].content_hash, 3)
    assert common_pb2.Event.FromString(blob) == written[0].event


async def test_schema_version_and_application_id_are_recorded(store: SqliteStore) -> None:
    assert await store.schema_version() == SCHEMA_VERSION
    assert (await query(store.path, "PRAGMA application_id"))[0][0] == APPLICATION_ID
    assert (await query(store.path, "PRAGMA journal_mode"))[0][0] == "wal"


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await (await SqliteStore.open(path)).close()
    await run_sql(path, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(SchemaError, match=rf"unsupported database schema.*version {SCHEMA_VERSION + 1}"):
        await SqliteStore.open(path)


async def test_a_version_1_journal_is_migrated_and_keeps_verifying(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    store = await SqliteStore.open(path)
    await store.create_session(SessionRow(uid="s", project="p"))
    written = await store.append("s", [inp("a"), inp("b")], expected_head=0, fence=0)
    await store.close()
    # Turn it back into what version 1 wrote: no head anchor in the session row.
    await downgrade_to_version_2(path)
    await run_sql(
        path,
        "ALTER TABLE sessions DROP COLUMN last_seq",
        "ALTER TABLE sessions DROP COLUMN last_hash",
        "PRAGMA user_version = 1",
    )
    store = await SqliteStore.open(path)
    try:
        assert await store.schema_version() == SCHEMA_VERSION
        assert await query(path, "SELECT last_seq, last_hash FROM sessions") == [(2, written[1].content_hash)]
        assert await store.verify("s") == 2
        await store.append("s", [inp("c")], expected_head=2, fence=0)
        assert await store.verify("s") == 3
    finally:
        await store.close()


async def downgrade_to_version_3(path: Path) -> None:
    """Turn a journal into what schema version 3 wrote: no execution state in the session rows,
    no health probe table."""
    await run_sql(
        path,
        "DROP TABLE journal_probe",
        "ALTER TABLE sessions DROP COLUMN exec_projection",
        "PRAGMA user_version = 3",
    )


async def downgrade_to_version_2(path: Path) -> None:
    """Turn a journal into what schema version 2 wrote: every fork child holds a full copy of its
    parent's prefix (its records resolved through its bases, stored as its own), no base columns."""
    await downgrade_to_version_3(path)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("BEGIN IMMEDIATE")
        while True:
            based = db.execute(
                "SELECT session, base_uid, base_seq FROM sessions WHERE base_uid <> '' ORDER BY session"
            ).fetchall()
            if not based:
                break
            for uid, base_uid, base_seq in based:
                # Copy what the base stores of the prefix and take over the base's own base.
                own_base, own_seq = db.execute(
                    "SELECT base_uid, base_seq FROM sessions WHERE session = ?", (base_uid,)
                ).fetchone()
                db.execute(
                    "INSERT INTO events SELECT ?, seq, prev_hash, hash, fence, event FROM events "
                    "WHERE session = ? AND seq > ? AND seq <= ?",
                    (uid, base_uid, own_seq if own_base else 0, base_seq),
                )
                rebased = min(base_seq, own_seq) if own_base else 0
                db.execute(
                    "UPDATE sessions SET base_uid = ?, base_seq = ? WHERE session = ?",
                    (own_base if rebased else "", rebased, uid),
                )
        db.execute("DROP INDEX sessions_base")
        db.execute("ALTER TABLE sessions DROP COLUMN base_uid")
        db.execute("ALTER TABLE sessions DROP COLUMN base_seq")
        db.execute("PRAGMA user_version = 2")
        db.execute("COMMIT")


def own_rows(path: Path | str, uid: str) -> list[int]:
    """The seqs a session stores itself (not through a base)."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [r[0] for r in db.execute("SELECT seq FROM events WHERE session = ? ORDER BY seq", (uid,))]


def fork_marker(detail: str) -> common_pb2.Event:
    return common_pb2.Event(
        kind=common_pb2.EVENT_LIFECYCLE,
        lifecycle=common_pb2.Lifecycle(kind=common_pb2.Lifecycle.LIFECYCLE_FORK, detail=detail),
    )


async def test_fork_children_share_the_prefix_instead_of_copying(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="root", project="p"))
    parent = await store.append("root", [inp(f"r{i}") for i in range(100)], expected_head=0, fence=0)
    await store.fork(
        "root", 60, [SessionRow(uid=f"kid{i}", project="p") for i in range(32)], fork_marker("root@60")
    )
    # 100 parent rows plus one FORK marker per child: the prefix is not copied.
    assert (await query(store.path, "SELECT count(*) FROM events"))[0][0] == 100 + 32
    for child in ("kid0", "kid31"):
        assert own_rows(store.path, child) == [61]
        records = await store.read(child)
        assert records[:60] == parent[:60]
        assert records[60].prev_hash == parent[59].content_hash
        assert [r.seq for r in await store.read(child, 59, 61)] == [59, 60, 61]
        assert await store.verify(child) == 61
    await store.append("root", [inp("later")], expected_head=100, fence=0)
    assert len(await store.read("kid0")) == 61


async def test_a_tampered_shared_prefix_is_caught_in_every_child(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="root", project="p"))
    await store.append("root", [inp(f"r{i}") for i in range(6)], expected_head=0, fence=0)
    await store.fork(
        "root", 4, [SessionRow(uid="a", project="p"), SessionRow(uid="b", project="p")], fork_marker("root@4")
    )
    await run_sql(
        Path(store.path), "UPDATE events SET hash = 'f' || substr(hash, 2) WHERE session = 'root' AND seq = 2"
    )
    for uid in ("root", "a", "b"):
        with pytest.raises(TamperedError) as caught:
            await store.verify(uid)
        assert (caught.value.session, caught.value.seq) == (uid, 2)


async def test_forks_of_forks_resolve_and_purges_unshare(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="g", project="p"))
    await store.append("g", [inp(f"g{i}") for i in range(10)], expected_head=0, fence=0)
    await store.fork("g", 6, [SessionRow(uid="p1", project="p")], fork_marker("g@6"))
    await store.append("p1", [inp(f"p{i}") for i in range(5)], expected_head=7, fence=0)
    await store.fork("p1", 10, [SessionRow(uid="c1", project="p")], fork_marker("p1@10"))
    await store.fork("p1", 4, [SessionRow(uid="c2", project="p")], fork_marker("p1@4"))
    # Within the parent's own base the prefix is taken straight from there.
    assert await query(store.path, "SELECT base_uid, base_seq FROM sessions WHERE session = 'c2'") == [
        ("g", 4)
    ]
    before = {uid: await store.read(uid) for uid in ("p1", "c1", "c2")}
    assert [r.content_hash for r in before["c1"][:10]] == [r.content_hash for r in before["p1"][:10]]
    await store.delete_session("p1", purge=True)
    assert own_rows(store.path, "p1") == []
    assert own_rows(store.path, "c1") == [7, 8, 9, 10, 11]  # p1's shared rows, now c1's own
    await store.delete_session("g", purge=True)
    for uid in ("c1", "c2"):
        assert await store.read(uid) == before[uid]
        assert await store.verify(uid) == len(before[uid])
    assert (await query(store.path, "SELECT count(*) FROM sessions WHERE base_uid <> ''"))[0][0] == 0


async def test_a_version_2_journal_is_migrated_to_shared_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    store = await SqliteStore.open(path)
    await store.create_session(SessionRow(uid="g", project="p"))
    await store.append("g", [inp(f"g{i}") for i in range(8)], expected_head=0, fence=0)
    await store.fork("g", 5, [SessionRow(uid="mid", project="p")], fork_marker("g@5"))
    await store.append("mid", [inp(f"m{i}") for i in range(3)], expected_head=6, fence=0)
    await store.fork("mid", 8, [SessionRow(uid="leaf", project="p")], fork_marker("mid@8"))
    await store.fork(
        "g",
        3,
        [SessionRow(uid="edited", project="p"), SessionRow(uid="orphan", project="p")],
        fork_marker("g@3"),
    )
    await store.create_session(SessionRow(uid="plain", project="p"))
    await store.append("plain", [inp("x")], expected_head=0, fence=0)
    await store.close()
    await downgrade_to_version_2(path)
    # What version 2 could hold besides: a child's copy that no longer matches its parent, and
    # a child whose parent was purged (its copy is all that is left).
    await run_sql(
        path, "UPDATE events SET hash = 'f' || substr(hash, 2) WHERE session = 'edited' AND seq = 2"
    )
    await run_sql(
        path,
        "INSERT INTO sessions (session, project, created_at, updated_at, parent_uid, fork_seq, "
        "last_seq, last_hash) SELECT 'gone-kid', 'p', 1, 1, 'gone', 2, 3, hash FROM events "
        "WHERE session = 'orphan' AND seq = 3",
        "INSERT INTO events SELECT 'gone-kid', seq, prev_hash, hash, fence, event FROM events "
        "WHERE session = 'orphan' AND seq <= 3",
    )
    assert own_rows(path, "leaf") == list(range(1, 10))
    with contextlib.closing(sqlite3.connect(path)) as db:
        before = {
            uid: db.execute(
                "SELECT seq, prev_hash, hash, fence, event FROM events WHERE session = ? ORDER BY seq", (uid,)
            ).fetchall()
            for uid in ("g", "mid", "leaf", "edited", "orphan", "gone-kid", "plain")
        }

    store = await SqliteStore.open(path)
    try:
        assert await store.schema_version() == SCHEMA_VERSION
        for uid, rows in before.items():
            records = await store.read(uid)
            assert [
                (r.seq, r.prev_hash, r.content_hash, r.fence, r.event.SerializeToString()) for r in records
            ] == [tuple(r) for r in rows], uid
        # Copies identical to their parent's records became references.
        assert own_rows(path, "mid") == [6, 7, 8, 9]
        assert own_rows(path, "leaf") == [9]
        assert own_rows(path, "orphan") == [4]
        # The edited copy and the purged parent's child keep their own rows.
        assert own_rows(path, "edited") == [1, 2, 3, 4]
        assert own_rows(path, "gone-kid") == [1, 2, 3]
        for uid in ("g", "mid", "leaf", "orphan", "gone-kid", "plain"):
            assert await store.verify(uid) == len(before[uid])
        with pytest.raises(TamperedError) as caught:
            await store.verify("edited")
        assert caught.value.seq == 2
        # The migrated journal keeps working: appends, new forks by reference, purges.
        await store.append("leaf", [inp("on")], expected_head=9, fence=0)
        await store.fork("leaf", 10, [SessionRow(uid="new", project="p")], fork_marker("leaf@10"))
        assert own_rows(path, "new") == [11]
        await store.delete_session("mid", purge=True)
        await store.delete_session("g", purge=True)
        for uid in ("leaf", "new", "orphan"):
            assert await store.verify(uid) == len(await store.read(uid))
        assert [r.content_hash for r in (await store.read("new"))[:9]] == [r[2] for r in before["leaf"]]
    finally:
        await store.close()


async def test_a_file_that_is_not_sqlite_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are not the pages you are looking for\n" * 200)
    with pytest.raises(SchemaError, match="not a readable SQLite database"):
        await SqliteStore.open(path)
    assert path.read_bytes().startswith(b"these are not")


async def test_a_foreign_sqlite_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    await run_sql(path, "CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    with pytest.raises(SchemaError, match=r"not an agentsessions journal.*invoices"):
        await SqliteStore.open(path)
    assert (await query(path, "PRAGMA journal_mode"))[0][0] == "delete"
    await run_sql(path, "PRAGMA application_id = 12345")
    with pytest.raises(SchemaError, match="application_id"):
        await SqliteStore.open(path)


async def test_a_go_reference_journal_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "go.db"
    await run_sql(
        path,
        "CREATE TABLE sessions (session TEXT PRIMARY KEY, fence INTEGER NOT NULL DEFAULT 0)",
        "CREATE TABLE events (session TEXT, seq INTEGER, prev_hash TEXT, hash TEXT, fence INTEGER, "
        "event BLOB)",
        "PRAGMA user_version = 2",
    )
    with pytest.raises(SchemaError, match="Go reference host"):
        await SqliteStore.open(path)


async def test_an_unopenable_path_is_a_schema_error(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match="cannot open SQLite journal"):
        await SqliteStore.open(tmp_path / "missing-dir" / "j.db")


async def test_concurrent_first_opens_initialize_once(tmp_path: Path) -> None:
    path = tmp_path / "fresh.db"
    stores = await asyncio.gather(*(SqliteStore.open(path) for _ in range(8)))
    try:
        assert [await s.schema_version() for s in stores] == [SCHEMA_VERSION] * 8
        await stores[0].create_session(SessionRow(uid="s", project="p"))
        assert await stores[7].get_session("s") is not None
    finally:
        for s in stores:
            await s.close()


# -- durability settings ----------------------------------------------------------------------


async def test_synchronous_is_full_by_default_and_configurable(tmp_path: Path) -> None:
    # Read on the writer connection: its commits are the ones that must be durable.
    full = await SqliteStore.open(tmp_path / "a.db")
    normal = await SqliteStore.open(tmp_path / "b.db", synchronous="normal", busy_timeout_ms=1234)
    try:
        assert await full.pragma("synchronous") == 2
        assert await full.pragma("busy_timeout") == 5000
        assert await normal.pragma("synchronous") == 1
        assert await normal.pragma("busy_timeout") == 1234
    finally:
        await full.close()
        await normal.close()
    with pytest.raises(ValueError, match="synchronous"):
        await SqliteStore.open(tmp_path / "c.db", synchronous="sometimes")


# -- group commit -----------------------------------------------------------------------------


async def test_concurrent_appends_share_commits(store: SqliteStore) -> None:
    uids = [f"s{i}" for i in range(64)]
    for uid in uids:
        await store.create_session(SessionRow(uid=uid, project="p"))
    before = store.stats.commits
    await asyncio.gather(*(store.append(u, [inp(u), inp(u)], expected_head=0, fence=0) for u in uids))
    assert store.stats.commits - before < len(uids)
    assert store.stats.appends == 64 and store.stats.events == 128


async def test_a_failed_commit_fails_every_append_of_the_batch(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for uid in ("a", "b", "c"):
        await store.create_session(SessionRow(uid=uid, project="p"))
    real = sqlite_store._Transaction.append_rows
    calls = 0

    # The batch's statements run on the writer's thread; its rows are written, then it fails.
    async def failing_once(tx: Any, *args: Any) -> None:
        nonlocal calls
        calls += 1
        await real(tx, *args)
        if calls == 1:
            raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(sqlite_store._Transaction, "append_rows", failing_once)
    outcomes = await asyncio.gather(
        *(store.append(u, [inp("x")], expected_head=0, fence=0) for u in ("a", "b", "c")),
        return_exceptions=True,
    )
    for outcome in outcomes:
        assert isinstance(outcome, StoreError) and "disk I/O error" in str(outcome)
        assert not isinstance(outcome, sqlite3.Error)
    assert [(await store.head(u)).seq for u in ("a", "b", "c")] == [0, 0, 0]
    assert store.stats.failed_commits == 1
    # The writer survives: the next batch commits.
    (rec,) = await store.append("a", [inp("y")], expected_head=0, fence=0)
    assert rec.seq == 1


async def test_a_cancelled_caller_does_not_undo_or_stall_the_batch(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    task = asyncio.create_task(store.append("s", [inp("x")], expected_head=0, fence=0))
    await asyncio.sleep(0)  # its first step queues the append
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Writes commit in queue order: once a later write returns, the abandoned append has landed.
    await store.new_fence("other")
    assert (await store.head("s")).seq == 1
    (rec,) = await store.append("s", [inp("y")], expected_head=1, fence=0)
    assert rec.seq == 2
    assert await store.verify("s") == 2


async def test_closed_store_refuses_work(tmp_path: Path) -> None:
    s = await SqliteStore.open(tmp_path / "j.db")
    await s.close()
    with pytest.raises(StoreError, match="closed"):
        await s.create_session(SessionRow(uid="s", project="p"))
    with pytest.raises(StoreError, match="closed"):
        await s.get_session("s")


# -- open_store -------------------------------------------------------------------------------


async def test_open_store_dispatch(tmp_path: Path) -> None:
    memory = await open_store("memory:")
    assert isinstance(memory, MemoryStore)
    path = tmp_path / "j.db"
    by_url = await open_store(f"sqlite://{path}")
    try:
        assert isinstance(by_url, SqliteStore) and by_url.path == str(path)
        await by_url.create_session(SessionRow(uid="s", project="p"))
    finally:
        await by_url.close()
    by_path = await open_store(str(path), synchronous="NORMAL")
    try:
        assert await by_path.get_session("s") is not None
    finally:
        await by_path.close()
    with pytest.raises(TypeError):
        await open_store("memory:", synchronous="FULL")


CRASHING_HOST = """
import asyncio, sys
from agentsessions.host.journal import SessionRow, open_store

async def main() -> None:
    store = await open_store(sys.argv[1])
    await store.create_session(SessionRow(uid="s", project="p"))
    raise SystemExit(3)  # leaves without close()

asyncio.run(main())
"""


async def test_a_process_that_never_closes_its_store_still_exits(tmp_path: Path) -> None:
    # aiosqlite's connection threads are not daemons; an unclosed store must not keep the process alive.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CRASHING_HOST,
        str(tmp_path / "j.db"),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        code = await asyncio.wait_for(proc.wait(), timeout=60)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail("the process hung after its event loop finished")
    assert code == 3


# -- the writer's head cache ------------------------------------------------------------------


async def test_appends_to_a_session_this_writer_owns_read_no_heads(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    fence = await store.new_fence("s", expected_head=0)
    before = store.stats.head_reads
    for head in range(5):
        await store.append("s", [inp(str(head))], expected_head=head, fence=fence)
    records = await store.append("s", [inp("next")], expected_head=5, fence=0, mint_fence=True)
    assert store.stats.head_reads == before
    assert records[0].fence == fence + 1
    assert await store.verify("s") == 6


async def test_another_store_on_the_file_is_noticed(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    first = await SqliteStore.open(path)
    second = await SqliteStore.open(path)
    try:
        await first.create_session(SessionRow(uid="s", project="p"))
        (one,) = await first.append("s", [inp("by first")], expected_head=0, fence=0)
        (two,) = await second.append("s", [inp("by second")], expected_head=1, fence=0)
        reads = first.stats.head_reads
        # The first writer's memory says head 1; the file says 2, and the file wins.
        with pytest.raises(ConflictError) as caught:
            await first.append("s", [inp("stale")], expected_head=1, fence=0)
        assert str(caught.value) == "expected_last_seq 1 does not match head 2 of session s"
        assert first.stats.head_reads == reads + 1
        (three,) = await first.append("s", [inp("current")], expected_head=2, fence=0)
        assert (three.seq, three.prev_hash) == (3, two.content_hash)
        assert two.prev_hash == one.content_hash
        assert await second.new_fence("s") == 1
        with pytest.raises(FencedError):
            await first.append("s", [inp("old fence")], expected_head=3, fence=0)
        assert await first.verify("s") == 3
    finally:
        await first.close()
        await second.close()


async def test_another_process_on_the_file_is_noticed(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    fence = await store.new_fence("s")
    await store.append("s", [inp("mine")], expected_head=0, fence=fence)
    await other_process_appends(store.path, 1, mint_fence=True)
    # The other process minted fence 2 and wrote seq 2: this writer's fence is superseded.
    with pytest.raises(FencedError) as caught:
        await store.append("s", [inp("mine again")], expected_head=2, fence=fence)
    assert str(caught.value) == "fence 1 is superseded by fence 2 of session s"
    records = await store.read("s")
    assert [r.event.message.parts[0].text.text for r in records] == ["mine", "from another process"]
    assert await store.verify("s") == 2


async def test_a_version_3_journal_gets_each_sessions_execution_state(tmp_path: Path) -> None:
    """Schema 4 folds every existing session's journal into its row once, so listing reads none."""
    path = tmp_path / "v3.db"
    store = await SqliteStore.open(path)
    await store.create_session(SessionRow(uid="parked", project="p"))
    await store.append("parked", parked_turn(), expected_head=0, fence=0)
    await store.create_session(SessionRow(uid="done", project="p"))
    await store.append(
        "done",
        [
            common_pb2.Event(kind=common_pb2.EVENT_EXECUTION_START, execution_id="y"),
            common_pb2.Event(
                kind=common_pb2.EVENT_END, execution_id="y", end=common_pb2.HarnessEnd(state="COMPLETED")
            ),
        ],
        expected_head=0,
        fence=0,
    )
    await store.fork("parked", 2, [SessionRow(uid="kid", project="p")], fork_marker("parked@2"))
    await store.create_session(SessionRow(uid="empty", project="p"))
    before = {uid: (await store.get_session(uid)) for uid in ("parked", "done", "kid", "empty")}
    await store.close()
    await downgrade_to_version_3(path)
    assert await query(path, "SELECT count(*) FROM sessions") == [(4,)]

    store = await SqliteStore.open(path)
    try:
        assert await store.schema_version() == SCHEMA_VERSION == 4
        for uid, row in before.items():
            got = await store.get_session(uid)
            assert got is not None and row is not None
            fork_seq = got.fork_seq
            folded = execstate.fold([r.event for r in await store.read(uid)], fork_seq=fork_seq)
            assert got.exec_projection == folded == row.exec_projection, uid
        parked = (await store.get_session("parked")).exec_projection  # type: ignore[union-attr]
        assert parked is not None and parked.latest is not None and parked.latest.gate() is not None
        # The migrated rows keep projecting.
        await store.append(
            "parked",
            [
                common_pb2.Event(
                    kind=common_pb2.EVENT_TOOL_RESULT, execution_id="x", result=common_pb2.ToolResult(id="t1")
                )
            ],
            expected_head=3,
            fence=0,
        )
        after = (await store.get_session("parked")).exec_projection  # type: ignore[union-attr]
        assert after is not None and after.latest is not None and after.latest.gate() is None
    finally:
        await store.close()


# -- which connection serves what ---------------------------------------------------------------


async def test_a_page_of_sessions_does_not_wait_behind_row_lookups(store: SqliteStore) -> None:
    # Under load the reader's queue holds the turns' row lookups; a ListSessions page must not
    # queue behind them. The reader's thread is held on an event, so anything queued there waits.
    for i in range(3):
        await store.create_session(SessionRow(uid=f"s{i}", project="p", create_time_ns=i + 1))
    release = threading.Event()
    holding = asyncio.ensure_future(store._sqlite._reader.run(lambda db: release.wait(30)))
    lookup = asyncio.ensure_future(store.get_session("s0"))
    try:
        rows, token = await asyncio.wait_for(store.list_sessions("p", 100, ""), timeout=10)
        assert [r.uid for r in rows] == ["s2", "s1", "s0"] and token == ""
        assert not lookup.done()  # the reader really is held: its lookups wait
    finally:
        release.set()
    assert await holding is True
    found = await lookup
    assert found is not None and found.uid == "s0"


async def test_a_page_of_sessions_goes_to_a_pager_with_nothing_waiting(store: SqliteStore) -> None:
    # Listers often page at once: a page must not queue behind another that is slow to finish.
    await store.create_session(SessionRow(uid="s", project="p", create_time_ns=1))
    started, release = threading.Event(), threading.Event()
    pagers = store._sqlite._pagers
    assert len(pagers) > 1

    def hold(db: object) -> bool:
        started.set()
        return release.wait(30)

    holding = asyncio.ensure_future(pagers[0].run(hold))
    try:
        assert await asyncio.to_thread(started.wait, 10)  # the first pager's thread is busy
        async with asyncio.timeout(10):
            rows, _ = await store.list_sessions("p", 100, "")
        assert [r.uid for r in rows] == ["s"]
    finally:
        release.set()
    assert await holding is True


async def test_a_listed_row_is_decoded_once_while_it_is_unchanged(store: SqliteStore) -> None:
    # A page's rows travel one to a line: a label's newline (escaped by JSON) stays in its row.
    labels = {"lines": "one\ntwo", "quote": '"\\', "": "empty key"}
    await store.create_session(SessionRow(uid="a", project="p", create_time_ns=2, labels=labels))
    await store.create_session(SessionRow(uid="b", project="p", create_time_ns=1))
    listed = store._sqlite.listed
    first, _ = await store.list_sessions("p", 10, "")
    assert [r.uid for r in first] == ["a", "b"] and dict(first[0].labels) == labels
    assert listed.decoded == 2
    again, _ = await store.list_sessions("p", 10, "")
    assert again[0] is first[0] and again[1] is first[1] and listed.decoded == 2
    await store.append("a", [inp("x")], expected_head=0, fence=0)
    after, _ = await store.list_sessions("p", 10, "")
    assert after[0] is not first[0] and after[0].last_seq == 1 and after[0].last_hash
    assert after[1] is first[1] and listed.decoded == 3
    assert await store.get_session("a") == after[0]
    assert len(listed) == 2  # the changed row took its session's place: one a session


@pytest.mark.parametrize("kept", [0, 4])
async def test_listed_rows_kept_are_bounded(tmp_path: Path, kept: int) -> None:
    store = await SqliteStore.open(tmp_path / "j.db", kept_listed=kept)
    try:
        for i in range(10):
            await store.create_session(SessionRow(uid=f"s{i}", project="p", create_time_ns=i + 1))
        first, _ = await store.list_sessions("p", 100, "")
        assert len(store._sqlite.listed) <= kept
        again, _ = await store.list_sessions("p", 100, "")
        assert again == first and [r.uid for r in again] == [f"s{i}" for i in reversed(range(10))]
        assert len(store._sqlite.listed) <= kept
        assert store._sqlite.listed.decoded >= 20 - kept
    finally:
        await store.close()


async def test_a_page_of_sessions_is_served_on_the_loops_thread_while_every_pager_is_held(
    store: SqliteStore,
) -> None:
    # Under load a pager's job waits for the GIL and its answer waits in the loop's queue: a page
    # is read right here, so it is served even with every other connection's thread held.
    for i in range(3):
        await store.create_session(SessionRow(uid=f"s{i}", project="p", create_time_ns=i + 1))
    dialect = store._sqlite
    release = threading.Event()
    held = [c.run(lambda db: release.wait(30)) for c in (*dialect._pagers, dialect._reader)]
    holding = [asyncio.ensure_future(h) for h in held]
    try:
        rows, token = await asyncio.wait_for(store.list_sessions("p", 2, ""), timeout=10)
        assert [r.uid for r in rows] == ["s2", "s1"]
        more, last = await asyncio.wait_for(store.list_sessions("p", 2, token), timeout=10)
        assert [r.uid for r in more] == ["s0"] and last == ""
        assert dialect.pages_here == 2
    finally:
        release.set()
    assert all([await h for h in holding])


async def test_a_page_that_finds_the_file_locked_goes_to_a_pagers_thread(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.create_session(SessionRow(uid="s", project="p", create_time_ns=1))
    dialect = store._sqlite
    here = dialect._pages_here
    assert here is not None
    listed = sqlite_store._list_texts
    threads: list[str] = []

    def locked_here(db: sqlite3.Connection, *args: Any) -> Any:
        threads.append(threading.current_thread().name)
        if db is here.db:  # the loop's own connection never waits for a lock: SQLite says busy
            busy = sqlite3.OperationalError("database is locked")
            busy.sqlite_errorcode = sqlite3.SQLITE_BUSY
            raise busy
        return listed(db, *args)

    monkeypatch.setattr(sqlite_store, "_list_texts", locked_here)
    rows, _ = await store.list_sessions("p", 100, "")
    assert [r.uid for r in rows] == ["s"] and dialect.pages_here == 0
    assert threads[0] == threading.current_thread().name  # tried here first
    assert threads[1].startswith("agentsessions-sqlite-pager")  # then on a pager's thread

    def broken(db: sqlite3.Connection, *args: Any) -> Any:
        raise sqlite3.OperationalError("no such table: sessions")

    monkeypatch.setattr(sqlite_store, "_list_texts", broken)
    with pytest.raises(StoreError, match="list sessions failed: no such table"):
        await store.list_sessions("p", 100, "")


# -- work on the event loop's thread while the host is quiet --------------------------------------


async def test_quiet_commits_and_row_lookups_run_on_the_loop_and_busy_ones_on_their_threads(
    store: SqliteStore,
) -> None:
    dialect = store._dialect
    assert isinstance(dialect, sqlite_store._SqliteDialect)
    quiet = [True]
    store.work_inline_while(lambda: quiet[0])
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.append("s", [inp("a")], expected_head=0, fence=0)
    assert await store.get_session("s") is not None
    here = (dialect.writer.inline_jobs, dialect._reader.inline_jobs)
    assert here[0] >= 2 and here[1] >= 1
    quiet[0] = False
    await store.append("s", [inp("b")], expected_head=1, fence=0)
    got = await store.get_session("s")
    assert got is not None and got.last_seq == 2
    assert (dialect.writer.inline_jobs, dialect._reader.inline_jobs) == here
    assert [r.seq for r in await store.read("s")] == [1, 2]


async def test_a_busy_commits_statements_run_on_the_loop_and_only_its_commit_on_the_writers_thread(
    store: SqliteStore,
) -> None:
    # On the writer's thread every statement (and the body's Python) had to take the GIL back from
    # the busy loop; only the fsync is worth a thread.
    dialect = store._dialect
    assert isinstance(dialect, sqlite_store._SqliteDialect)
    store.work_inline_while(lambda: False)  # the loop is never quiet
    await store.create_session(SessionRow(uid="s", project="p"))
    seen: list[tuple[str, str]] = []
    writer = dialect.writer.db
    assert writer is not None
    writer.set_trace_callback(
        lambda sql: seen.append((sql.split()[0].upper(), threading.current_thread().name))
    )
    try:
        await store.append("s", [inp("a"), inp("b")], expected_head=0, fence=0)
    finally:
        writer.set_trace_callback(None)
    loop_thread = threading.current_thread().name
    verbs = [verb for verb, _ in seen]
    assert "INSERT" in verbs and verbs[-1] == "COMMIT"
    assert all(thread == loop_thread for verb, thread in seen if verb != "COMMIT")
    assert seen[-1][1] == "agentsessions-sqlite-writer"
    assert dialect.writer.inline_jobs == 0
    assert [r.seq for r in await store.read("s")] == [1, 2]
    got = await store.get_session("s")
    assert got is not None and got.last_seq == 2


async def test_a_job_whose_caller_stopped_waiting_keeps_the_writer_until_it_ends(
    store: SqliteStore,
) -> None:
    # A transaction's statements run on the loop only while the writer's thread has no job: one
    # whose caller was cancelled still holds the connection until the thread answers it.
    dialect = store._dialect
    assert isinstance(dialect, sqlite_store._SqliteDialect)
    await store.create_session(SessionRow(uid="s", project="p"))
    release = threading.Event()
    job = asyncio.ensure_future(dialect.writer.queued(lambda db: release.wait(30)))
    for _ in range(1000):
        if dialect.writer.in_flight:
            break
        await asyncio.sleep(0)
    job.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await job
    assert dialect.writer.in_flight == 1  # still running on the thread
    writer = dialect.writer.db
    assert writer is not None
    statements: list[str] = []
    writer.set_trace_callback(statements.append)
    try:
        append = asyncio.create_task(store.append("s", [inp("a")], expected_head=0, fence=0))
        for _ in range(100):
            await asyncio.sleep(0)
        # Queued behind that job on the writer's thread: no statement of it ran here meanwhile.
        assert statements == [] and not append.done()
        release.set()
        await append
    finally:
        writer.set_trace_callback(None)
    assert "COMMIT" in statements
    assert dialect.writer.in_flight == 0
    assert [r.seq for r in await store.read("s")] == [1]


@pytest.mark.parametrize("quiet", [True, False], ids=["quiet", "busy"])
async def test_a_commit_never_waits_on_the_loop_for_another_writers_lock(
    store: SqliteStore, quiet: bool
) -> None:
    dialect = store._dialect
    assert isinstance(dialect, sqlite_store._SqliteDialect)
    store.work_inline_while(lambda: quiet)
    await store.create_session(SessionRow(uid="s", project="p"))
    other = sqlite3.connect(store.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
        append = asyncio.create_task(store.append("s", [inp("a")], expected_head=0, fence=0))
        # The loop keeps running (this coroutine does) while the append waits on the writer's
        # thread, with the busy timeout, instead of holding the loop until the lock is free.
        for _ in range(1000):
            if dialect.writer.in_flight or append.done():
                break
            await asyncio.sleep(0)
        assert dialect.writer.in_flight == 1 and not append.done()
        other.execute("ROLLBACK")
        await append
    finally:
        other.close()
    assert [r.seq for r in await store.read("s")] == [1]

    def busy_timeout(db: sqlite3.Connection) -> int:
        return int(db.execute("PRAGMA busy_timeout").fetchone()[0])

    # The transaction that waited for the lock did so with the writer's own busy timeout.
    assert await dialect.writer.queued(busy_timeout) == dialect.writer.busy_timeout_ms > 0
    # One that starts on the loop leaves it at 0 for the next; any other job sets it back first.
    await store.append("s", [inp("b")], expected_head=1, fence=0)
    assert await dialect.writer.queued(busy_timeout) == 0 and not dialect.writer.waits
    assert await dialect.pragma("busy_timeout") == dialect.writer.busy_timeout_ms
    assert dialect.writer.waits


# -- decoded execution projections ---------------------------------------------------------------


async def test_a_listing_keeps_its_rows_projections_decoded_and_a_turns_row_read_does_not(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A row read to admit a turn finds a projection the turn before it just changed: kept, each
    # turn left two objects for the collector to walk until ~8,000 more turns had passed.
    monkeypatch.setattr(store._dialect, "change_mark", lambda: None)  # every row read is a read
    start = common_pb2.Event(
        kind=common_pb2.EVENT_EXECUTION_START,
        execution_id="00000000000000aa",
        execution_start=common_pb2.ExecutionStart(input_count=1),
    )
    execstate._DECODED.clear()  # the cache is the process's: start from nothing
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.append("s", [start, inp("a")], expected_head=0, fence=0)
    read = await store.get_session("s")
    assert read is not None and read.exec_projection is not None
    text = read.exec_projection.encode()
    assert text not in execstate._DECODED
    (listed,), _ = await store.list_sessions("p", 10, "")
    assert execstate._DECODED.get(text) is listed.exec_projection
    again = await store.get_session("s")
    assert again is not None and again.exec_projection is listed.exec_projection  # found, not decoded
