"""A single-writer store (SQLite) answers a session's row from memory, moved along by its own
commits, while the WAL index's change counter says nobody else committed since (two host processes
on one file: tests/multihost/test_sqlite_file.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agentsessions.host.journal import ConflictError, SessionRow, StoreError, engine
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.v1 import common_pb2
from tests.journal.journals import inp, other_process_appends


def turn(execution_id: str, text: str) -> list[common_pb2.Event]:
    """A whole execution, so the row's execution projection and compute state move too."""
    return [
        common_pb2.Event(
            kind=common_pb2.EVENT_EXECUTION_START,
            execution_id=execution_id,
            execution_start=common_pb2.ExecutionStart(input_count=1),
        ),
        common_pb2.Event(
            kind=common_pb2.EVENT_INPUT,
            execution_id=execution_id,
            message=common_pb2.Message(
                role="user", parts=[common_pb2.Part(text=common_pb2.TextPart(text=text))]
            ),
        ),
        common_pb2.Event(
            kind=common_pb2.EVENT_END,
            execution_id=execution_id,
            end=common_pb2.HarnessEnd(state="COMPLETED"),
        ),
    ]


@pytest.fixture
def store(sqlite_store: SqliteStore) -> SqliteStore:
    return sqlite_store


async def fresh(store: SqliteStore, uid: str) -> SessionRow | None:
    """The row as the database holds it, past the store's memory."""
    return await store._dialect.get_row(uid)


async def test_a_kept_row_moves_with_this_stores_appends_exactly_as_the_database_does(
    store: SqliteStore,
) -> None:
    await store.create_session(SessionRow(uid="s", project="p", harness="h", labels={"k": "v"}))
    first = await store.get_session("s")
    assert first is not None and store.stats.row_reads == 1 and store.stats.row_hits == 0
    await store.append("s", turn("e1", "one"), expected_head=0, fence=0)
    fence = await store.new_fence("s")  # a mint moves the head's fence and update time too
    await store.append("s", [inp("two")], expected_head=3, fence=fence)
    kept = await store.get_session("s")
    assert store.stats.row_reads == 1 and store.stats.row_hits == 1
    assert kept == await fresh(store, "s")
    assert kept is not None and kept.last_seq == 4 and kept.exec_projection is not None
    assert kept.labels == {"k": "v"} and kept.harness == "h"


async def test_a_deleted_session_is_not_answered_from_memory(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    assert await store.get_session("s") is not None
    await store.append("s", [inp("a")], expected_head=0, fence=0)
    await store.delete_session("s", purge=False)
    assert await store.get_session("s") is None


async def test_another_processs_commit_is_seen_at_once(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.create_session(SessionRow(uid="t", project="p"))
    await store.get_session("s")
    await store.append("s", [inp("mine")], expected_head=0, fence=0)
    assert (await store.get_session("s")) == await fresh(store, "s")
    hits = store.stats.row_hits
    assert hits == 1
    await other_process_appends(store.path, 1)
    # Nothing of this store's has committed since: the WAL index's change counter says someone
    # else did, so the kept row is not answered.
    row = await store.get_session("s")
    assert row is not None and row.last_seq == 2 and store.stats.row_hits == hits
    assert row == await fresh(store, "s")
    # This store's next commit (any session's) finds the other writer and drops what it kept,
    # heads included: a row is kept again once the writer knows its head afresh.
    await store.append("t", [inp("elsewhere")], expected_head=0, fence=0)
    assert await store.get_session("s") == await fresh(store, "s")
    assert store.stats.row_hits == hits
    await store.append("s", [inp("mine again")], expected_head=2, fence=0)
    assert await store.get_session("s") == await fresh(store, "s")  # read, and kept
    assert await store.get_session("s") == await fresh(store, "s")
    assert store.stats.row_hits == hits + 1


async def test_a_row_that_shows_another_head_than_the_writer_knows_is_not_kept(
    store: SqliteStore,
) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.append("s", [inp("mine")], expected_head=0, fence=0)
    await other_process_appends(store.path, 1)
    # The writer still knows head 1; the database holds 2 (nothing of this store's committed
    # since): the row read is answered but not kept, so the next ask reads again.
    reads = store.stats.row_reads
    assert (await store.get_session("s")) == await fresh(store, "s")
    assert (await store.get_session("s")) == await fresh(store, "s")
    assert store.stats.row_reads == reads + 2 and store.stats.row_hits == 0


async def test_a_failed_commit_drops_every_kept_row(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.get_session("s")
    await store.append("s", [inp("a")], expected_head=0, fence=0)
    assert store._rows and "s" in store._rows

    async def refuse(body: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(store._dialect, "transaction", refuse)
    with pytest.raises(StoreError):
        await store.append("s", [inp("b")], expected_head=1, fence=0)
    monkeypatch.undo()
    assert not store._rows
    reads = store.stats.row_reads
    await store.get_session("s")
    assert store.stats.row_reads == reads + 1


async def test_the_memory_store_keeps_no_second_copy() -> None:
    store = MemoryStore()
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.append("s", [inp("a")], expected_head=0, fence=0)
    row = await store.get_session("s")
    assert row is not None and row.last_seq == 1
    assert store.stats.row_hits == store.stats.row_reads == 0


async def test_a_transaction_that_wrote_nothing_keeps_what_was_vouched(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.get_session("s")
    await store.append("s", [inp("a")], expected_head=0, fence=0)
    mark = store._dialect.committed_mark
    assert mark is not None and mark == store._dialect.change_mark()
    # A refused append commits an empty transaction: the counter stays, and so does the vouch.
    with pytest.raises(ConflictError):
        await store.append("s", [inp("stale")], expected_head=0, fence=0)
    assert store._dialect.committed_mark == mark == store._dialect.change_mark()
    hits = store.stats.row_hits
    await store.get_session("s")
    assert store.stats.row_hits == hits + 1


async def test_without_a_wal_index_rows_are_always_read(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "j.db")
    try:
        store._sqlite._shm = None  # as when the -shm file cannot be mapped
        await store.create_session(SessionRow(uid="s", project="p"))
        await store.get_session("s")
        await store.append("s", [inp("a")], expected_head=0, fence=0)
        row = await store.get_session("s")
        assert row is not None and row.last_seq == 1
        assert store.stats.row_hits == store.stats.row_reads == 0
    finally:
        await store.close()


async def test_other_sessions_rows_are_answered_between_a_commit_and_the_loop_taking_it(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for uid in ("s", "t"):
        await store.create_session(SessionRow(uid=uid, project="p"))
        await store.get_session(uid)  # read, and kept
    kept_t = await store.get_session("t")
    seen: dict[str, object] = {}
    remember = store._remember

    def between(view: engine.HeadView, foreign: bool) -> None:
        # Committed, and the loop has not taken the commit yet: the mark has moved past the
        # rows, by this store's commit alone.
        mark = store._dialect.change_mark()
        assert mark is not None and mark != store._vouched
        seen["t"], seen["s"] = store._kept("t", mark), store._kept("s", mark)
        if "other" in seen:  # another connection commits right after this one
            other = sqlite3.connect(store.path, isolation_level=None)
            try:
                assert other.execute("UPDATE journal_probe SET written_at = written_at + 1").rowcount == 1
            finally:
                other.close()
            seen["t after another commit"] = store._kept("t", store._dialect.change_mark() or 0)
        remember(view, foreign)

    monkeypatch.setattr(store, "_remember", between)
    await store.append("s", [inp("a")], expected_head=0, fence=0)
    assert seen["t"] is kept_t  # not in the batch: still holds
    assert seen["s"] is None  # in the batch: its kept row is older than the file
    row = await store.get_session("s")
    assert row == await fresh(store, "s") and row is not None and row.last_seq == 1
    seen.clear()
    seen["other"] = True
    await store.probe()  # a commit of this store's: the journal probe's row
    assert seen["t"] is kept_t and seen["t after another commit"] is None
