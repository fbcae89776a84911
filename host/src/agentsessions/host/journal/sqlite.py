"""SQLite journal store (aiosqlite): the embedded default.

One writer connection and one reader connection per store, WAL mode. Every write goes through a
single writer task that groups whatever is queued into one ``BEGIN IMMEDIATE`` transaction per
flush (group commit): one fsync makes a whole batch of appends, across sessions, durable. Each
caller returns only after its batch committed. Heads and fences are read inside the transaction,
so several stores (or processes) on one file stay single-writer safe; a CAS or fence failure fails
only that append, a failed commit fails every operation of its batch.

The ``events`` table keeps the reference layout (spec 3.5) so external verifiers can read it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

import aiosqlite

from agentsessions.host.journal import (
    clamp_page_size,
    decode_page_token,
    encode_page_token,
    imported_chain_state,
    project_compute_state,
    require_distinct_uids,
)
from agentsessions.host.journal.canon import canonical_event, chain_hash, content_hash, normalize_event
from agentsessions.host.journal.store import (
    COMPUTE_NONE,
    ConflictError,
    FencedError,
    Head,
    SchemaError,
    SessionExistsError,
    SessionNotFoundError,
    SessionRow,
    StoreError,
    TamperedError,
)
from agentsessions.v1 import common_pb2, harness_registry_pb2

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteStore", "WriterStats"]

# Stamped in the database header so a foreign SQLite file is told apart from a journal.
APPLICATION_ID: Final = 0x4153_4A4C  # "ASJL"
SCHEMA_VERSION: Final = 2
SYNCHRONOUS_MODES: Final = ("OFF", "NORMAL", "FULL", "EXTRA")
DEFAULT_BUSY_TIMEOUT_MS: Final = 5000
DEFAULT_MAX_BATCH: Final = 1024
VERIFY_CHUNK: Final = 4096
_WAL_ATTEMPTS: Final = 50

# Append-only: schema version N is reached by applying _MIGRATIONS[N - 1] to version N - 1.
_MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    (
        """
    CREATE TABLE sessions (
        session TEXT PRIMARY KEY,
        fence INTEGER NOT NULL DEFAULT 0,
        project TEXT NOT NULL DEFAULT '',
        name TEXT NOT NULL DEFAULT '',
        harness TEXT NOT NULL DEFAULT '',
        model TEXT NOT NULL DEFAULT '',
        parent_uid TEXT NOT NULL DEFAULT '',
        fork_seq INTEGER NOT NULL DEFAULT 0,
        compute_state TEXT NOT NULL DEFAULT 'NONE',
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        labels TEXT NOT NULL DEFAULT '{}',
        annotations TEXT NOT NULL DEFAULT '{}',
        origin BLOB,
        identity BLOB,
        deleted INTEGER NOT NULL DEFAULT 0
    )
    """,
        "CREATE INDEX sessions_project_created ON sessions(project, created_at DESC, session)",
        "CREATE INDEX sessions_harness ON sessions(harness)",
        """
    CREATE TABLE events (
        session TEXT NOT NULL,
        seq INTEGER NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL,
        fence INTEGER NOT NULL,
        event BLOB NOT NULL /* binary agentsessions.v1.Event */,
        PRIMARY KEY (session, seq)
    )
    """,
        """
    CREATE TABLE harnesses (
        name TEXT PRIMARY KEY,
        registration BLOB NOT NULL /* binary agentsessions.v1.HarnessRegistration */,
        updated_at INTEGER NOT NULL
    )
    """,
        """
    CREATE TABLE tool_receipts (
        session TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        result BLOB NOT NULL /* binary agentsessions.v1.ToolResult */,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (session, idempotency_key)
    )
    """,
    ),
    # 2: each session row anchors its journal's head, so verify notices the newest records going
    # missing (a truncated chain still links).
    (
        "ALTER TABLE sessions ADD COLUMN last_seq INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE sessions ADD COLUMN last_hash TEXT NOT NULL DEFAULT ''",
        """
        UPDATE sessions SET
            last_seq = COALESCE((SELECT MAX(seq) FROM events WHERE events.session = sessions.session), 0),
            last_hash = COALESCE(
                (SELECT hash FROM events WHERE events.session = sessions.session
                 ORDER BY seq DESC LIMIT 1),
                ''
            )
        """,
    ),
)

_ROW_COLUMNS: Final = (
    "session, project, name, harness, model, labels, annotations, origin, identity, parent_uid, "
    "fork_seq, created_at, updated_at, compute_state, "
    "(SELECT COALESCE(MAX(seq), 0) FROM events WHERE events.session = sessions.session)"
)
_INSERT_ROW: Final = (
    "INSERT INTO sessions (session, project, name, harness, model, labels, annotations, origin, identity, "
    "parent_uid, fork_seq, created_at, updated_at, compute_state, fence, last_seq, last_hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_EVENT: Final = (
    "INSERT INTO events (session, seq, prev_hash, hash, fence, event) VALUES (?, ?, ?, ?, ?, ?)"
)
_UPDATE_HEAD: Final = (
    "UPDATE sessions SET compute_state = ?, updated_at = ?, last_seq = ?, last_hash = ?, "
    "fence = MAX(fence, ?) WHERE session = ?"
)

_T = TypeVar("_T")
_Db = aiosqlite.Connection


# -- row encoding ------------------------------------------------------------------------------


def _json_map(value: Mapping[str, str]) -> str:
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _row_params(
    row: SessionRow,
    *,
    created: int,
    updated: int,
    state: str,
    fence: int,
    last_seq: int = 0,
    last_hash: str = "",
) -> tuple[Any, ...]:
    return (
        row.uid,
        row.project,
        row.name,
        row.harness,
        row.model,
        _json_map(row.labels),
        _json_map(row.annotations),
        None if row.origin is None else row.origin.SerializeToString(),
        None if row.identity is None else row.identity.SerializeToString(),
        row.parent_uid,
        row.fork_seq,
        created,
        updated,
        state,
        fence,
        last_seq,
        last_hash,
    )


def _row_from(rec: Sequence[Any]) -> SessionRow:
    return SessionRow(
        uid=rec[0],
        project=rec[1],
        name=rec[2],
        harness=rec[3],
        model=rec[4],
        labels=json.loads(rec[5]),
        annotations=json.loads(rec[6]),
        origin=None if rec[7] is None else common_pb2.Origin.FromString(rec[7]),
        identity=None if rec[8] is None else common_pb2.IdentityRef.FromString(rec[8]),
        parent_uid=rec[9],
        fork_seq=rec[10],
        create_time_ns=rec[11],
        update_time_ns=rec[12],
        compute_state=rec[13],
        last_seq=rec[14],
    )


def _log_record(rec: Sequence[Any]) -> common_pb2.LogRecord:
    out = common_pb2.LogRecord(seq=rec[0], prev_hash=rec[1], content_hash=rec[2], fence=rec[3])
    out.event.ParseFromString(rec[4])
    return out


# -- queued writes -----------------------------------------------------------------------------


@dataclass
class WriterStats:
    """What the writer has committed so far: appends and events made durable, and transactions
    (appends per commit shows how well concurrent appends group)."""

    commits: int = 0
    appends: int = 0
    events: int = 0
    failed_commits: int = 0


@dataclass(eq=False)
class _Append:
    """One append waiting for the writer: the work that needs no lock is already done."""

    uid: str
    events: list[common_pb2.Event]
    blobs: list[bytes]
    canonical: list[bytes]
    expected_head: int
    fence: int
    future: asyncio.Future[tuple[list[tuple[int, str, str]], int]]
    mint: bool = False


@dataclass(eq=False)
class _Op(Generic[_T]):
    """Any other write, applied in order inside the batch transaction. ``apply`` checks every
    precondition before its first write, so a domain error leaves nothing behind. ``on_thread``,
    when set, is the same write as plain statements for the connection's thread."""

    apply: Callable[[_Db], Awaitable[_T]]
    future: asyncio.Future[_T]
    on_thread: Callable[[sqlite3.Connection], _T] | None = None


@dataclass
class _Head:
    """A session as the appends of one transaction see it (updated as they are applied)."""

    exists: bool
    deleted: bool
    fence: int
    compute_state: str
    seq: int
    hash: str
    touched: bool = False


def _settle(future: asyncio.Future[Any], outcome: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up waiting; the write stands regardless
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(outcome)


async def _connect(path: str, busy_timeout_ms: int) -> _Db:
    try:
        return await aiosqlite.connect(path, isolation_level=None, timeout=busy_timeout_ms / 1000)
    except sqlite3.Error as exc:
        raise SchemaError(f"cannot open SQLite journal {path}: {exc}") from None


class SqliteStore:
    """JournalStore on one SQLite file. Create with ``await SqliteStore.open(path)``."""

    def __init__(self, path: str, writer: _Db, reader: _Db, *, max_batch: int) -> None:
        self.path = path
        self._w = writer
        self._r = reader
        self._max_batch = max(1, max_batch)
        self._pending: collections.deque[_Append | _Op[Any]] = collections.deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._writer_task: asyncio.Task[None] | None = None
        self.stats = WriterStats()

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> SqliteStore:
        """Open (creating if absent) the journal at ``path``.

        ``synchronous`` is SQLite's durability knob (FULL: a commit survives power loss; NORMAL: it
        survives a process crash). Raises SchemaError for a file that is not a journal, cannot be
        read, or was written by a newer schema."""
        mode = synchronous.upper()
        if mode not in SYNCHRONOUS_MODES:
            raise ValueError(
                f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, got {synchronous!r}"
            )
        where = str(path)
        writer = await _connect(where, busy_timeout_ms)
        reader: _Db | None = None
        try:
            await _prepare(writer, where, mode)
            reader = await _connect(where, busy_timeout_ms)
            await reader.execute("PRAGMA query_only = ON")
        except BaseException:
            await writer.close()
            if reader is not None:
                await reader.close()
            raise
        store = cls(where, writer, reader, max_batch=max_batch)
        store._writer_task = asyncio.get_running_loop().create_task(store._write_loop())
        return store

    async def close(self) -> None:
        """Commit everything already queued, then close both connections."""
        if self._closing:
            return
        self._closing = True
        self._wake.set()
        if self._writer_task is not None:
            await asyncio.wait([self._writer_task])
            if self._writer_task.cancelled():
                return  # the writer already stopped both connections
        await self._w.close()
        await self._r.close()

    async def schema_version(self) -> int:
        """The schema version recorded in the file (``PRAGMA user_version``)."""
        rows = await self._read("read schema version", "PRAGMA user_version", ())
        return int(rows[0][0])

    # -- the writer --------------------------------------------------------------------------

    def _enqueue(self, item: _Append | _Op[Any], what: str) -> None:
        if self._closing:
            raise StoreError(f"{what}: store is closed")
        if self._writer_task is None or self._writer_task.done():
            raise StoreError(f"{what}: the journal writer is not running")
        self._pending.append(item)
        self._wake.set()

    async def _write(self, what: str, apply: Callable[[_Db], Awaitable[_T]]) -> _T:
        op: _Op[_T] = _Op(apply, asyncio.get_running_loop().create_future())
        self._enqueue(op, what)
        return await op.future

    async def _write_on_thread(self, what: str, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """A write of plain statements: one trip to the connection's thread inside a mixed batch,
        and a batch of nothing else is a single trip, BEGIN to COMMIT."""

        async def apply(db: _Db) -> _T:
            return await _on_thread(db, work)

        op: _Op[_T] = _Op(apply, asyncio.get_running_loop().create_future(), work)
        self._enqueue(op, what)
        return await op.future

    async def _write_loop(self) -> None:
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        return
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                batch = [self._pending.popleft() for _ in range(min(self._max_batch, len(self._pending)))]
                await self._commit(batch)
        except asyncio.CancelledError:
            # The event loop is going away without close() (e.g. asyncio.run tearing down after an
            # error). aiosqlite's connection threads are not daemons: stop them, or the process
            # could never exit.
            self._closing = True
            self._w.stop()
            self._r.stop()
            raise
        finally:
            # Only reached with work left if the writer was cancelled: nobody may hang.
            while self._pending:
                item = self._pending.popleft()
                _settle(item.future, None, StoreError("journal writer stopped before this write committed"))

    async def _commit(self, batch: list[_Append | _Op[Any]]) -> None:
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        failure: tuple[type[StoreError], str, BaseException] | None = None
        try:
            if all(isinstance(item, _Append) for item in batch):
                # Appends only (a turn's records): two trips to the connection's thread, BEGIN with
                # the heads and then every row with COMMIT, instead of one trip per statement.
                await self._commit_appends([item for item in batch if isinstance(item, _Append)], outcomes)
            elif all(isinstance(item, _Op) and item.on_thread is not None for item in batch):
                # Plain-statement writes only (a turn's fence mint): one trip, BEGIN to COMMIT.
                await _on_thread(self._w, _apply_on_thread, batch, outcomes)
            else:
                await self._w.execute("BEGIN IMMEDIATE")
                try:
                    await self._apply(batch, outcomes)
                    await self._w.execute("COMMIT")
                except BaseException:
                    await self._rollback()
                    raise
        except sqlite3.IntegrityError as exc:
            failure = (ConflictError, f"journal write lost to a concurrent writer: {exc}", exc)
        except sqlite3.Error as exc:
            failure = (StoreError, f"journal write failed: {exc}", exc)
        except Exception as exc:
            failure = (StoreError, f"journal write failed: {exc!r}", exc)
        except BaseException as exc:  # cancelled: fail the batch, then stop the writer
            for item in batch:
                _settle(item.future, None, StoreError(f"journal write abandoned: {exc!r}"))
            raise
        if failure is not None:
            self.stats.failed_commits += 1
            kind, message, cause = failure
            for item in batch:
                # One exception object per waiter: each raise extends its own traceback.
                refusal = kind(message)
                refusal.__cause__ = cause
                _settle(item.future, None, refusal)
            return
        self.stats.commits += 1
        refused = {id(future) for future, _, error in outcomes if error is not None}
        for item in batch:
            if isinstance(item, _Append) and id(item.future) not in refused:
                self.stats.appends += 1
                self.stats.events += len(item.events)
        for future, value, error in outcomes:
            _settle(future, value, error)

    async def _commit_appends(
        self, run: list[_Append], outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]
    ) -> None:
        heads = await _on_thread(self._w, _begin_with_heads, {a.uid for a in run})
        try:
            rows, updates = _chain(run, heads, outcomes)
            await _on_thread(self._w, _write_rows, rows, updates, True)
        except BaseException:
            await self._rollback()
            raise

    async def _rollback(self) -> None:
        # Fails harmlessly when no transaction is open (BEGIN itself failed).
        with contextlib.suppress(sqlite3.Error):
            await self._w.execute("ROLLBACK")

    async def _apply(
        self,
        batch: list[_Append | _Op[Any]],
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]],
    ) -> None:
        i = 0
        while i < len(batch):
            item = batch[i]
            if isinstance(item, _Append):
                j = i + 1
                while j < len(batch) and isinstance(batch[j], _Append):
                    j += 1
                run = [a for a in batch[i:j] if isinstance(a, _Append)]
                await self._apply_appends(run, outcomes)
                i = j
                continue
            try:
                value = await item.apply(self._w)
            except StoreError as exc:
                outcomes.append((item.future, None, exc))
            else:
                outcomes.append((item.future, value, None))
            i += 1

    async def _apply_appends(
        self,
        run: list[_Append],
        outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]],
    ) -> None:
        heads = await _on_thread(self._w, _heads, {a.uid for a in run})
        rows, updates = _chain(run, heads, outcomes)
        if rows or updates:
            await _on_thread(self._w, _write_rows, rows, updates, False)

    # -- session rows ------------------------------------------------------------------------

    async def create_session(self, row: SessionRow) -> SessionRow:
        created = row.create_time_ns or time.time_ns()
        stored = dataclasses.replace(
            row,
            create_time_ns=created,
            update_time_ns=row.update_time_ns or created,
            compute_state=COMPUTE_NONE,
            last_seq=0,
        )

        async def apply(db: _Db) -> SessionRow:
            if await _one(db, "SELECT 1 FROM sessions WHERE session = ?", (row.uid,)) is not None:
                raise SessionExistsError(f"session {row.uid} already exists")
            await db.execute(
                _INSERT_ROW,
                _row_params(
                    stored, created=created, updated=stored.update_time_ns, state=COMPUTE_NONE, fence=0
                ),
            )
            return stored

        return await self._write("create session", apply)

    async def get_session(self, uid: str) -> SessionRow | None:
        rows = await self._read(
            "get session", f"SELECT {_ROW_COLUMNS} FROM sessions WHERE session = ? AND deleted = 0", (uid,)
        )
        return _row_from(rows[0]) if rows else None

    async def list_sessions(
        self, project: str, page_size: int, page_token: str
    ) -> tuple[list[SessionRow], str]:
        size = clamp_page_size(page_size)
        if page_token:
            after_ns, after_uid = decode_page_token(page_token)
            recs = await self._read(
                "list sessions",
                f"""
                SELECT {_ROW_COLUMNS} FROM sessions
                WHERE project = ? AND deleted = 0
                  AND (created_at < ? OR (created_at = ? AND session > ?))
                ORDER BY created_at DESC, session ASC LIMIT ?
                """,
                (project, after_ns, after_ns, after_uid, size + 1),
            )
        else:
            recs = await self._read(
                "list sessions",
                f"""
                SELECT {_ROW_COLUMNS} FROM sessions WHERE project = ? AND deleted = 0
                ORDER BY created_at DESC, session ASC LIMIT ?
                """,
                (project, size + 1),
            )
        rows = [_row_from(r) for r in recs[:size]]
        token = ""
        if len(recs) > size:
            token = encode_page_token(rows[-1].create_time_ns, rows[-1].uid)
        return rows, token

    async def delete_session(self, uid: str, *, purge: bool) -> SessionRow:
        async def apply(db: _Db) -> SessionRow:
            rec = await _one(
                db, f"SELECT {_ROW_COLUMNS} FROM sessions WHERE session = ? AND deleted = 0", (uid,)
            )
            if rec is None:
                raise SessionNotFoundError(f"session {uid} not found")
            now = time.time_ns()
            await db.execute("UPDATE sessions SET deleted = 1, updated_at = ? WHERE session = ?", (now, uid))
            if purge:
                await db.execute("UPDATE sessions SET last_seq = 0, last_hash = '' WHERE session = ?", (uid,))
                await db.execute("DELETE FROM events WHERE session = ?", (uid,))
                await db.execute("DELETE FROM tool_receipts WHERE session = ?", (uid,))
            return dataclasses.replace(_row_from(rec), update_time_ns=now)

        return await self._write("delete session", apply)

    async def new_fence(self, uid: str, expected_head: int | None = None) -> int:
        def mint(db: sqlite3.Connection) -> int:
            now = time.time_ns()
            if expected_head is not None:
                row = db.execute("SELECT last_seq FROM sessions WHERE session = ?", (uid,)).fetchone()
                head = int(row[0]) if row is not None else 0
                if head != expected_head:
                    raise ConflictError(
                        f"expected head {expected_head} does not match head {head} of session {uid}"
                    )
            rows = db.execute(
                """
                INSERT INTO sessions (session, fence, created_at, updated_at) VALUES (?, 1, ?, ?)
                ON CONFLICT (session) DO UPDATE SET fence = fence + 1
                RETURNING fence
                """,
                (uid, now, now),
            ).fetchall()
            return int(rows[0][0])  # RETURNING always yields the row

        return await self._write_on_thread("new fence", mint)

    # -- journal -----------------------------------------------------------------------------

    async def append(
        self,
        uid: str,
        events: Sequence[common_pb2.Event],
        *,
        expected_head: int,
        fence: int,
        mint_fence: bool = False,
    ) -> list[common_pb2.LogRecord]:
        normalized = [normalize_event(ev) for ev in events]
        pending = _Append(
            uid=uid,
            events=normalized,
            blobs=[ev.SerializeToString() for ev in normalized],
            canonical=[canonical_event(ev) for ev in normalized],
            expected_head=expected_head,
            fence=fence,
            future=asyncio.get_running_loop().create_future(),
            mint=mint_fence,
        )
        self._enqueue(pending, "append")
        chained, fence = await pending.future
        return [
            common_pb2.LogRecord(seq=seq, prev_hash=prev, content_hash=digest, fence=fence, event=ev)
            for (seq, prev, digest), ev in zip(chained, normalized, strict=True)
        ]

    async def read(self, uid: str, from_seq: int = 1, to_seq: int = 0) -> list[common_pb2.LogRecord]:
        start = max(1, from_seq)
        if to_seq > 0:
            recs = await self._read(
                "read",
                "SELECT seq, prev_hash, hash, fence, event FROM events "
                "WHERE session = ? AND seq >= ? AND seq <= ? ORDER BY seq",
                (uid, start, to_seq),
            )
        else:
            recs = await self._read(
                "read",
                "SELECT seq, prev_hash, hash, fence, event FROM events "
                "WHERE session = ? AND seq >= ? ORDER BY seq",
                (uid, start),
            )
        return [_log_record(r) for r in recs]

    async def head(self, uid: str) -> Head:
        recs = await self._read(
            "head", "SELECT seq, hash FROM events WHERE session = ? ORDER BY seq DESC LIMIT 1", (uid,)
        )
        if not recs:
            return Head(seq=0, hash="")
        return Head(seq=int(recs[0][0]), hash=str(recs[0][1]))

    async def verify(self, uid: str) -> int:
        # The row's anchor is read first: records up to it never change, so chunked reads need no
        # snapshot, and appends racing this verify land beyond it.
        anchor = await self._read(
            "verify", "SELECT last_seq, last_hash FROM sessions WHERE session = ?", (uid,)
        )
        last = int(anchor[0][0]) if anchor else (await self.head(uid)).seq
        checked = 0
        prev = ""
        while checked < last:
            recs = await self._read(
                "verify",
                "SELECT seq, prev_hash, hash, event FROM events "
                "WHERE session = ? AND seq > ? AND seq <= ? ORDER BY seq LIMIT ?",
                (uid, checked, last, VERIFY_CHUNK),
            )
            if not recs:
                raise TamperedError(
                    uid, checked + 1, f"seq {checked + 1} is missing (the head is seq {last})"
                )
            for seq, prev_hash, digest, blob in recs:
                checked += 1
                if seq != checked:
                    raise TamperedError(uid, checked, f"seq {checked} is missing (next stored seq is {seq})")
                if prev_hash != prev:
                    raise TamperedError(uid, seq, "prev_hash does not link to the previous record")
                try:
                    ev = common_pb2.Event.FromString(blob)
                except Exception:
                    raise TamperedError(uid, seq, "stored event does not decode") from None
                if content_hash(ev, prev, seq) != digest:
                    raise TamperedError(uid, seq, "content_hash does not match the recomputed hash")
                prev = digest
        if anchor and prev != anchor[0][1]:
            raise TamperedError(uid, last, "the newest record is not the head recorded when it was appended")
        return checked

    async def fork(
        self,
        parent_uid: str,
        at_seq: int,
        children: Sequence[SessionRow],
        marker: common_pb2.Event,
    ) -> list[SessionRow]:
        if not children:
            return []
        require_distinct_uids(children)
        uids = [c.uid for c in children]
        marker = normalize_event(marker)
        marker_blob = marker.SerializeToString()
        marker_json = canonical_event(marker)
        marker_seq = at_seq + 1
        state = project_compute_state(COMPUTE_NONE, marker)

        async def apply(db: _Db) -> list[SessionRow]:
            if (
                await _one(db, "SELECT 1 FROM sessions WHERE session = ? AND deleted = 0", (parent_uid,))
                is None
            ):
                raise SessionNotFoundError(f"session {parent_uid} not found")
            rec = await _one(db, "SELECT COALESCE(MAX(seq), 0) FROM events WHERE session = ?", (parent_uid,))
            head = int(rec[0]) if rec is not None else 0
            if at_seq < 0 or at_seq > head:
                raise ConflictError(f"fork at_seq {at_seq} is beyond head {head} of session {parent_uid}")
            marks = ",".join("?" for _ in uids)
            taken = await _one(db, f"SELECT session FROM sessions WHERE session IN ({marks})", uids)
            if taken is not None:
                raise SessionExistsError(f"session {taken[0]} already exists")
            prev = ""
            if at_seq > 0:
                found = await _one(
                    db, "SELECT hash FROM events WHERE session = ? AND seq = ?", (parent_uid, at_seq)
                )
                prev = str(found[0]) if found is not None else ""
            digest = chain_hash(marker_json, prev, marker_seq)
            now = time.time_ns()
            stored = [
                dataclasses.replace(
                    child,
                    parent_uid=parent_uid,
                    fork_seq=at_seq,
                    create_time_ns=child.create_time_ns or now,
                    update_time_ns=now,
                    compute_state=state,
                    last_seq=marker_seq,
                )
                for child in children
            ]
            await db.executemany(
                _INSERT_ROW,
                [
                    _row_params(
                        r,
                        created=r.create_time_ns,
                        updated=now,
                        state=state,
                        fence=0,
                        last_seq=marker_seq,
                        last_hash=digest,
                    )
                    for r in stored
                ],
            )
            if at_seq > 0:
                for uid in uids:
                    await db.execute(
                        "INSERT INTO events (session, seq, prev_hash, hash, fence, event) "
                        "SELECT ?, seq, prev_hash, hash, fence, event FROM events "
                        "WHERE session = ? AND seq <= ?",
                        (uid, parent_uid, at_seq),
                    )
            await db.executemany(
                _INSERT_EVENT, [(uid, marker_seq, prev, digest, 0, marker_blob) for uid in uids]
            )
            return stored

        return await self._write("fork", apply)

    async def import_records(self, row: SessionRow, records: Sequence[common_pb2.LogRecord]) -> SessionRow:
        """Create ``row`` holding ``records`` verbatim (stored hashes and fences), atomically.

        The records must run from seq 1 and link; their hashes are not recomputed (``verify`` does)."""
        state, fence = imported_chain_state(row.uid, records)
        now = time.time_ns()
        stored = dataclasses.replace(
            row,
            create_time_ns=row.create_time_ns or now,
            update_time_ns=now,
            compute_state=state,
            last_seq=len(records),
        )
        rows = [
            (row.uid, r.seq, r.prev_hash, r.content_hash, r.fence, r.event.SerializeToString())
            for r in records
        ]

        async def apply(db: _Db) -> SessionRow:
            if await _one(db, "SELECT 1 FROM sessions WHERE session = ?", (row.uid,)) is not None:
                raise SessionExistsError(f"session {row.uid} already exists")
            await db.execute(
                _INSERT_ROW,
                _row_params(
                    stored,
                    created=stored.create_time_ns,
                    updated=now,
                    state=state,
                    fence=fence,
                    last_seq=len(records),
                    last_hash=records[-1].content_hash if records else "",
                ),
            )
            await db.executemany(_INSERT_EVENT, rows)
            return stored

        return await self._write("import", apply)

    # -- harness registry and tool receipts --------------------------------------------------

    async def put_harness(self, registration: harness_registry_pb2.HarnessRegistration) -> None:
        name = registration.metadata.name
        if not name:
            raise StoreError("put_harness: registration has no metadata.name")
        blob = registration.SerializeToString()

        async def apply(db: _Db) -> None:
            await db.execute(
                "INSERT INTO harnesses (name, registration, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET registration = excluded.registration, "
                "updated_at = excluded.updated_at",
                (name, blob, time.time_ns()),
            )

        await self._write("put harness", apply)

    async def get_harness(self, name: str) -> harness_registry_pb2.HarnessRegistration | None:
        recs = await self._read("get harness", "SELECT registration FROM harnesses WHERE name = ?", (name,))
        return harness_registry_pb2.HarnessRegistration.FromString(recs[0][0]) if recs else None

    async def list_harnesses(self) -> list[harness_registry_pb2.HarnessRegistration]:
        recs = await self._read("list harnesses", "SELECT registration FROM harnesses ORDER BY name", ())
        return [harness_registry_pb2.HarnessRegistration.FromString(r[0]) for r in recs]

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> common_pb2.ToolResult | None:
        recs = await self._read(
            "get tool receipt",
            "SELECT result FROM tool_receipts WHERE session = ? AND idempotency_key = ?",
            (uid, idempotency_key),
        )
        return common_pb2.ToolResult.FromString(recs[0][0]) if recs else None

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: common_pb2.ToolResult) -> None:
        blob = result.SerializeToString()

        async def apply(db: _Db) -> None:
            await db.execute(
                "INSERT INTO tool_receipts (session, idempotency_key, result, created_at) "
                "VALUES (?, ?, ?, ?) "
                "ON CONFLICT (session, idempotency_key) DO NOTHING",
                (uid, idempotency_key, blob, time.time_ns()),
            )

        await self._write("put tool receipt", apply)

    async def session_uids(self) -> list[str]:
        recs = await self._read(
            "list session uids",
            "SELECT session FROM sessions UNION SELECT session FROM events ORDER BY 1",
            (),
        )
        return [str(r[0]) for r in recs]

    # -- reads -------------------------------------------------------------------------------

    async def _read(self, what: str, sql: str, params: Sequence[Any]) -> list[Any]:
        if self._closing:
            raise StoreError(f"{what}: store is closed")
        try:
            return list(await self._r.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise StoreError(f"{what} failed: {exc}") from exc


def _chain(
    run: list[_Append],
    heads: dict[str, _Head],
    outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]],
) -> tuple[list[tuple[str, int, str, str, int, bytes]], list[tuple[str, int, int, str, int, str]]]:
    """Check each append against its session's head and fence and chain its events (on the event
    loop's thread: hashing is Python work); the rows to insert and the session heads to update."""
    rows: list[tuple[str, int, str, str, int, bytes]] = []
    for ap in run:
        head = heads[ap.uid]
        if not head.exists or head.deleted:
            outcomes.append((ap.future, None, SessionNotFoundError(f"session {ap.uid} not found")))
            continue
        if ap.expected_head != head.seq:
            outcomes.append(
                (
                    ap.future,
                    None,
                    ConflictError(
                        f"expected_last_seq {ap.expected_head} does not match head {head.seq} "
                        f"of session {ap.uid}"
                    ),
                )
            )
            continue
        fence = ap.fence
        if ap.mint:
            fence = head.fence + 1
            head.fence, head.touched = fence, True
        elif fence < head.fence:
            outcomes.append(
                (
                    ap.future,
                    None,
                    FencedError(f"fence {ap.fence} is superseded by fence {head.fence} of session {ap.uid}"),
                )
            )
            continue
        seq, prev, state = head.seq, head.hash, head.compute_state
        chained: list[tuple[int, str, str]] = []
        for ev, blob, canonical in zip(ap.events, ap.blobs, ap.canonical, strict=True):
            seq += 1
            digest = chain_hash(canonical, prev, seq)
            rows.append((ap.uid, seq, prev, digest, fence, blob))
            chained.append((seq, prev, digest))
            state = project_compute_state(state, ev)
            prev = digest
        if chained:
            head.seq, head.hash, head.compute_state, head.touched = seq, prev, state, True
        outcomes.append((ap.future, (chained, fence), None))
    now = time.time_ns()
    updates = [(h.compute_state, now, h.seq, h.hash, h.fence, uid) for uid, h in heads.items() if h.touched]
    return rows, updates


def _apply_on_thread(
    db: sqlite3.Connection,
    ops: list[_Append | _Op[Any]],
    outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]],
) -> None:
    """On the connection's thread: one transaction applying ``ops`` (each with ``on_thread``) in
    order; a domain error fails only its op, anything else rolls the whole batch back."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for op in ops:
            assert isinstance(op, _Op) and op.on_thread is not None
            try:
                value = op.on_thread(db)
            except StoreError as exc:
                outcomes.append((op.future, None, exc))
            else:
                outcomes.append((op.future, value, None))
        db.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise


def _begin_with_heads(db: sqlite3.Connection, uids: Iterable[str]) -> dict[str, _Head]:
    """On the connection's thread: BEGIN IMMEDIATE, then the sessions' heads (rolled back if the
    read fails)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        return _heads(db, uids)
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise


def _write_rows(
    db: sqlite3.Connection,
    rows: list[tuple[str, int, str, str, int, bytes]],
    updates: list[tuple[str, int, int, str, int, str]],
    commit: bool,
) -> None:
    """On the connection's thread, in the open transaction: insert the records, move the heads,
    and with ``commit`` end the transaction (rolled back if any of it fails)."""
    try:
        db.executemany(_INSERT_EVENT, rows)
        db.executemany(_UPDATE_HEAD, updates)
        if commit:
            db.execute("COMMIT")
    except BaseException:
        if commit:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise


def _heads(db: sqlite3.Connection, uids: Iterable[str]) -> dict[str, _Head]:
    """On the connection's thread, in the open transaction: the sessions' heads."""
    keys = sorted(uids)
    heads: dict[str, _Head] = {}
    # Bounded IN lists keep the statement cache small and stay far below SQLite's variable limit.
    for start in range(0, len(keys), 256):
        chunk = keys[start : start + 256]
        marks = ",".join("(?)" for _ in chunk)
        rows = db.execute(
            f"""
            WITH wanted(uid) AS (VALUES {marks})
            SELECT wanted.uid, s.session IS NOT NULL, COALESCE(s.deleted, 0), COALESCE(s.fence, 0),
                   COALESCE(s.compute_state, 'NONE'), e.seq, e.hash
            FROM wanted
            LEFT JOIN sessions AS s ON s.session = wanted.uid
            LEFT JOIN events AS e ON e.session = wanted.uid
                AND e.seq = (SELECT MAX(seq) FROM events WHERE events.session = wanted.uid)
            """,
            chunk,
        ).fetchall()
        for uid, exists, deleted, fence, state, seq, digest in rows:
            heads[uid] = _Head(bool(exists), bool(deleted), fence, state, seq or 0, digest or "")
    return heads


async def _on_thread(db: _Db, work: Callable[..., _T], *args: Any) -> _T:
    """``work(connection, *args)`` on the connection's own thread: one trip for several statements
    (aiosqlite has no public call for it; its worker runs the callables it is handed, in order)."""
    result: _T = await db._execute(work, db._conn, *args)  # type: ignore[no-untyped-call]
    return result


async def _one(db: _Db, sql: str, params: Sequence[Any]) -> Any:
    """The first row of a statement's result, or None (one round trip to the connection thread)."""
    rows = list(await db.execute_fetchall(sql, params))
    return rows[0] if rows else None


async def _prepare(db: _Db, path: str, synchronous: str) -> None:
    """Check the file is ours (or empty), switch to WAL, and create or migrate the schema."""
    try:
        app_id, version, tables = await _identity(db)
    except sqlite3.DatabaseError as exc:
        raise SchemaError(f"{path} is not a readable SQLite database: {exc}") from None
    _check_identity(path, app_id, version, tables)
    await _set_wal(db, path)
    try:
        await db.execute(f"PRAGMA synchronous = {synchronous}")
        if app_id == APPLICATION_ID and version == SCHEMA_VERSION:
            return
        # Several processes may open the file at once: migrate under the write lock, re-checking.
        await db.execute("BEGIN IMMEDIATE")
        try:
            app_id, version, tables = await _identity(db)
            _check_identity(path, app_id, version, tables)
            for statements in _MIGRATIONS[version:]:
                for statement in statements:
                    await db.execute(statement)
            await db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            await db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise SchemaError(f"cannot initialize SQLite journal {path}: {exc}") from None


async def _identity(db: _Db) -> tuple[int, int, list[str]]:
    app_id = (await _one(db, "PRAGMA application_id", ()))[0]
    version = (await _one(db, "PRAGMA user_version", ()))[0]
    cursor = await db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    tables = [str(r[0]) for r in await cursor.fetchall()]
    await cursor.close()
    return int(app_id), int(version), tables


def _check_identity(path: str, app_id: int, version: int, tables: list[str]) -> None:
    if app_id == APPLICATION_ID:
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"unsupported database schema: {path} is at journal schema version {version}, "
                f"this agentsessions understands up to {SCHEMA_VERSION}; upgrade agentsessions"
            )
        if version < 1:
            raise SchemaError(f"{path} is a damaged agentsessions journal: no schema version recorded")
        return
    if app_id != 0:
        raise SchemaError(f"{path} is not an agentsessions journal (SQLite application_id {app_id:#x})")
    if not tables:
        return  # empty database: ours to initialize
    if {"sessions", "events"} <= set(tables) and version in (1, 2):
        raise SchemaError(
            f"{path} looks like a journal written by the Go reference host (schema version {version}); "
            "it cannot be opened in place: export its sessions and import them"
        )
    raise SchemaError(f"{path} is not an agentsessions journal: it holds table(s) {', '.join(tables)}")


async def _set_wal(db: _Db, path: str) -> None:
    # Switching to WAL needs a moment of exclusive access; a concurrent opener may hold the file.
    for attempt in range(_WAL_ATTEMPTS):
        try:
            rec = await _one(db, "PRAGMA journal_mode = WAL", ())
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == _WAL_ATTEMPTS - 1:
                raise SchemaError(f"cannot switch SQLite journal {path} to WAL: {exc}") from None
            await asyncio.sleep(0.02)
            continue
        if rec is None or str(rec[0]).lower() != "wal":
            raise SchemaError(f"SQLite journal {path} refused WAL mode (got {rec[0] if rec else None!r})")
        return
