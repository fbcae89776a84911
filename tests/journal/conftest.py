"""Journal store fixtures: one conformance suite, run against every backend.

To add a backend, add an entry to ``BACKENDS`` (how to name its database for one test, how to
damage a stored record, whether separate opens share data) and a param to ``STORE_PARAMS``
(mark it to skip where the backend is unavailable). ``store_factory()`` opens a store through
``open_store``, so the URL dispatch is exercised too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

import aiosqlite
import asyncpg
import pytest

from agentsessions.host.journal import JournalStore, open_store
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.journal.postgres import PostgresStore
from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.v1 import common_pb2
from tests.journal.pg import pg_server, pg_url

__all__ = ["pg_server", "pg_url"]


class Corrupter(Protocol):
    """Overwrite a stored record the way someone with write access to the storage could:
    ``event`` maps the stored event bytes to new bytes, ``hash`` replaces the stored hash."""

    def __call__(
        self,
        store: JournalStore,
        uid: str,
        seq: int,
        *,
        event: Callable[[bytes], bytes] | None = None,
        hash: str | None = None,
    ) -> Awaitable[None]: ...


@dataclass(frozen=True)
class Backend:
    """How the conformance suite uses one kind of store."""

    # The open_store target for one test's database (may request other fixtures).
    target: Callable[[pytest.FixtureRequest, Path], str]
    corrupt: Corrupter
    # Separate opens of the target see the same data, which survives close and reopen.
    shared: bool
    # Delete a session's newest stored record.
    drop_newest: Callable[[JournalStore, str], Awaitable[None]]
    # Delete one stored record of a session (by seq).
    drop: Callable[[JournalStore, str, int], Awaitable[None]]
    # Store a record for a session without going through the store (beyond its head, say).
    insert: Callable[[JournalStore, str, common_pb2.LogRecord], Awaitable[None]]


async def _drop_newest_memory(store: JournalStore, uid: str) -> None:
    cast(MemoryStore, store).drop_newest_record(uid)


async def _drop_newest_sqlite(store: JournalStore, uid: str) -> None:
    async with aiosqlite.connect(cast(SqliteStore, store).path, isolation_level=None) as db:
        await db.execute(
            "DELETE FROM events WHERE session = ? AND seq = (SELECT MAX(seq) FROM events WHERE session = ?)",
            (uid, uid),
        )


async def _drop_newest_postgres(store: JournalStore, uid: str) -> None:
    conn = await asyncpg.connect(cast(PostgresStore, store).url)
    try:
        await conn.execute(
            "DELETE FROM events WHERE session = $1 "
            "AND seq = (SELECT MAX(seq) FROM events WHERE session = $1)",
            uid,
        )
    finally:
        await conn.close()


async def _drop_memory(store: JournalStore, uid: str, seq: int) -> None:
    cast(MemoryStore, store).drop_record(uid, seq)


async def _drop_sqlite(store: JournalStore, uid: str, seq: int) -> None:
    async with aiosqlite.connect(cast(SqliteStore, store).path, isolation_level=None) as db:
        cursor = await db.execute("DELETE FROM events WHERE session = ? AND seq = ?", (uid, seq))
        assert cursor.rowcount == 1, f"no stored record {uid}@{seq}"


async def _drop_postgres(store: JournalStore, uid: str, seq: int) -> None:
    conn = await asyncpg.connect(cast(PostgresStore, store).url)
    try:
        status = await conn.execute("DELETE FROM events WHERE session = $1 AND seq = $2", uid, seq)
        assert status == "DELETE 1", f"no stored record {uid}@{seq}"
    finally:
        await conn.close()


def _event_row(uid: str, record: common_pb2.LogRecord) -> tuple[str, int, str, str, int, bytes]:
    """An ``events`` row's values: session, seq, prev_hash, hash, fence, event."""
    event = record.event.SerializeToString()
    return (uid, record.seq, record.prev_hash, record.content_hash, record.fence, event)


async def _insert_memory(store: JournalStore, uid: str, record: common_pb2.LogRecord) -> None:
    cast(MemoryStore, store).insert_record(uid, record)


async def _insert_sqlite(store: JournalStore, uid: str, record: common_pb2.LogRecord) -> None:
    async with aiosqlite.connect(cast(SqliteStore, store).path, isolation_level=None) as db:
        await db.execute(
            "INSERT INTO events (session, seq, prev_hash, hash, fence, event) VALUES (?, ?, ?, ?, ?, ?)",
            _event_row(uid, record),
        )


async def _insert_postgres(store: JournalStore, uid: str, record: common_pb2.LogRecord) -> None:
    conn = await asyncpg.connect(cast(PostgresStore, store).url)
    try:
        await conn.execute(
            "INSERT INTO events (session, seq, prev_hash, hash, fence, event) "
            "VALUES ($1, $2, $3, $4, $5, $6)",
            *_event_row(uid, record),
        )
    finally:
        await conn.close()


async def _corrupt_memory(
    store: JournalStore,
    uid: str,
    seq: int,
    *,
    event: Callable[[bytes], bytes] | None = None,
    hash: str | None = None,
) -> None:
    memory = cast(MemoryStore, store)
    new_event = event(memory.stored_event(uid, seq)) if event is not None else None
    memory.corrupt_record(uid, seq, event=new_event, hash=hash)


async def _corrupt_sqlite(
    store: JournalStore,
    uid: str,
    seq: int,
    *,
    event: Callable[[bytes], bytes] | None = None,
    hash: str | None = None,
) -> None:
    path = cast(SqliteStore, store).path
    async with aiosqlite.connect(path, isolation_level=None) as db:
        if event is not None:
            cursor = await db.execute("SELECT event FROM events WHERE session = ? AND seq = ?", (uid, seq))
            row = await cursor.fetchone()
            await cursor.close()
            assert row is not None, f"no stored record {uid}@{seq}"
            await db.execute(
                "UPDATE events SET event = ? WHERE session = ? AND seq = ?", (event(bytes(row[0])), uid, seq)
            )
        if hash is not None:
            await db.execute("UPDATE events SET hash = ? WHERE session = ? AND seq = ?", (hash, uid, seq))


async def _corrupt_postgres(
    store: JournalStore,
    uid: str,
    seq: int,
    *,
    event: Callable[[bytes], bytes] | None = None,
    hash: str | None = None,
) -> None:
    conn = await asyncpg.connect(cast(PostgresStore, store).url)
    try:
        if event is not None:
            stored = await conn.fetchval("SELECT event FROM events WHERE session = $1 AND seq = $2", uid, seq)
            assert stored is not None, f"no stored record {uid}@{seq}"
            await conn.execute(
                "UPDATE events SET event = $3 WHERE session = $1 AND seq = $2", uid, seq, event(bytes(stored))
            )
        if hash is not None:
            await conn.execute("UPDATE events SET hash = $3 WHERE session = $1 AND seq = $2", uid, seq, hash)
    finally:
        await conn.close()


BACKENDS: dict[str, Backend] = {
    "memory": Backend(
        target=lambda request, tmp: "memory:",
        corrupt=_corrupt_memory,
        shared=False,
        drop_newest=_drop_newest_memory,
        drop=_drop_memory,
        insert=_insert_memory,
    ),
    "sqlite": Backend(
        target=lambda request, tmp: f"sqlite://{tmp / 'journal.db'}",
        corrupt=_corrupt_sqlite,
        shared=True,
        drop_newest=_drop_newest_sqlite,
        drop=_drop_sqlite,
        insert=_insert_sqlite,
    ),
    # A fresh database per test on the run's server (tests/journal/pg.py).
    "postgres": Backend(
        target=lambda request, tmp: str(request.getfixturevalue("pg_url")),
        corrupt=_corrupt_postgres,
        shared=True,
        drop_newest=_drop_newest_postgres,
        drop=_drop_postgres,
        insert=_insert_postgres,
    ),
}

STORE_PARAMS = [
    pytest.param("memory"),
    pytest.param("sqlite"),
    pytest.param("postgres", marks=pytest.mark.postgres),
]


class StoreFactory:
    """Opens stores on one test's database; everything it opened is closed after the test."""

    def __init__(self, name: str, backend: Backend, target: str) -> None:
        self.name = name
        self.backend = backend
        self.target = target
        self.opened: list[JournalStore] = []

    @property
    def shared(self) -> bool:
        return self.backend.shared

    async def __call__(self) -> JournalStore:
        store = await open_store(self.target)
        self.opened.append(store)
        return store

    async def corrupt(
        self,
        store: JournalStore,
        uid: str,
        seq: int,
        *,
        event: Callable[[bytes], bytes] | None = None,
        hash: str | None = None,
    ) -> None:
        await self.backend.corrupt(store, uid, seq, event=event, hash=hash)


@pytest.fixture(params=STORE_PARAMS)
def backend_name(request: pytest.FixtureRequest) -> str:
    """The backend under test (one run of every conformance test per STORE_PARAMS entry)."""
    return str(request.param)


@pytest.fixture
def journal_target(request: pytest.FixtureRequest, backend_name: str, tmp_path: Path) -> str:
    """The open_store target of this test's database. A sync fixture, so that a backend's target
    function may call ``request.getfixturevalue`` on async fixtures (a per-test database)."""
    return BACKENDS[backend_name].target(request, tmp_path)


@pytest.fixture
async def store_factory(backend_name: str, journal_target: str) -> AsyncIterator[StoreFactory]:
    factory = StoreFactory(backend_name, BACKENDS[backend_name], journal_target)
    try:
        yield factory
    finally:
        for store in factory.opened:
            await store.close()


@pytest.fixture
async def store(store_factory: StoreFactory) -> JournalStore:
    """One store on this test's database."""
    return await store_factory()
