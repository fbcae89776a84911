"""A single-writer store (SQLite) answers a session's row from memory, moved along by its own
commits; another process's write is noticed by the next commit, and a quiet store reads afresh."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentsessions.host.journal import SessionRow, StoreError, engine
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
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(tmp_path / "j.db")
    try:
        yield s
    finally:
        await s.close()


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


async def test_a_quiet_store_reads_its_rows_afresh(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.get_session("s")
    await store.append("s", [inp("a")], expected_head=0, fence=0)
    # Past ROW_TRUST_S since the last commit (made 0 here: no commit is recent enough).
    monkeypatch.setattr(engine, "ROW_TRUST_S", 0.0)
    await store.get_session("s")
    assert store.stats.row_hits == 0 and store.stats.row_reads == 2


async def test_another_processs_write_is_noticed_by_the_next_commit(store: SqliteStore) -> None:
    await store.create_session(SessionRow(uid="s", project="p"))
    await store.create_session(SessionRow(uid="t", project="p"))
    await store.get_session("s")
    await store.append("s", [inp("mine")], expected_head=0, fence=0)
    assert (await store.get_session("s")) == await fresh(store, "s")
    await other_process_appends(store.path, 1)
    # This store's next commit (any session's) finds that someone else wrote: no row it kept
    # is answered any more.
    await store.append("t", [inp("elsewhere")], expected_head=0, fence=0)
    hits = store.stats.row_hits
    row = await store.get_session("s")
    assert row is not None and row.last_seq == 2 and store.stats.row_hits == hits
    assert row == await fresh(store, "s")


async def test_a_row_that_shows_another_head_than_the_writer_knows_is_not_kept(
    store: SqliteStore, monkeypatch: pytest.MonkeyPatch
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
