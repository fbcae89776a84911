"""SQLite journal store: the embedded default, a dialect of ``engine.DialectStore``.

Connections each used only on a thread of its own: the writer, a reader for row lookups (every
turn makes one), pagers for pages of sessions (so a ListSessions neither waits behind the turns'
lookups nor holds them up; a few, as listers often page at once), a records reader for ranges of
records (so a long Replay never holds up either), and a scanner for ``verify`` (one consistent
snapshot per verify, without holding up the readers), all in WAL mode; and one used on the event
loop's own thread, for pages of sessions, that never waits for a lock (a page that finds the file
locked goes to a pager). Each batch of the engine's group commit is one ``BEGIN IMMEDIATE``
transaction, so one fsync makes a whole batch of appends, across sessions, durable. Its
statements run on the event loop's thread and its COMMIT on the writer's (one trip a batch): on
that thread the batch's Python and each of its statements had to take the GIL back from the busy
loop. While the loop has nothing else to do the COMMIT runs there too; while another connection
holds the write lock (another process) the whole transaction waits for it on the writer's thread.

The write lock makes several stores (or processes) on one file single-writer safe. The writer
keeps the heads it wrote or read in the engine's head cache, so an append to a session it owns
reads nothing before writing; SQLite's ``PRAGMA data_version``, read at the start of each
transaction, says whether any other connection committed since the writer's previous one, and
only then are heads read from the file again (under the lock). Between transactions the WAL
index's change counter (``change_mark``: the header of the ``-shm`` file, mapped read-only and
read without a system call) tells the same about the last commit, so the engine answers a
session's row from what its writer last committed as long as nobody else committed since.

A fork child does not copy its parent's prefix: its records 1..fork_seq are read through the
parent (spec 3.1 still holds for what ``read`` returns: identical records, identical hashes), and
purging a session first copies into its children the rows they share with it. The ``events``
table keeps the reference layout (spec 3.5); ``agentsessions journal export`` writes every session
fully materialized, so external verifiers read an exported journal session by session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import mmap
import queue
import sqlite3
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from agentsessions.host.journal import execstate
from agentsessions.host.journal.dialect import BatchFailure
from agentsessions.host.journal.engine import DEFAULT_MAX_BATCH, DialectStore, WriterStats
from agentsessions.host.journal.listed import ListedRows
from agentsessions.host.journal.live_sqlite import SqliteLiveStatements, create_live_tables
from agentsessions.host.journal.rules import ChainCheck, NewSession, SessionHead, StoredRecord
from agentsessions.host.journal.sqlrows import head_projection, session_values
from agentsessions.host.journal.store import (
    KEPT_LISTED,
    ConflictError,
    JournalUnavailableError,
    SchemaError,
    SessionRow,
    StoreError,
)
from agentsessions.v1 import common_pb2

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteStore", "WriterStats"]

# Stamped in the database header so a foreign SQLite file is told apart from a journal.
APPLICATION_ID: Final = 0x4153_4A4C  # "ASJL"
SCHEMA_VERSION: Final = 4
SYNCHRONOUS_MODES: Final = ("OFF", "NORMAL", "FULL", "EXTRA")
DEFAULT_BUSY_TIMEOUT_MS: Final = 5000
_WAL_ATTEMPTS: Final = 50
# Bounded IN lists keep the statement cache small and stay far below SQLite's variable limit.
_IN_CHUNK: Final = 64
# Fork bases a read follows at most (a base chain is as deep as forks of forks go).
_MAX_BASE_DEPTH: Final = 10_000

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
    # 3: fork children share their parent's prefix instead of copying it. A session's records
    # 1..base_seq are those of base_uid (resolved recursively); the events table holds only its
    # own records, seq > base_seq. Children forked by version 2 held full copies: each copy that
    # is identical to its parent's records is dropped and the child pointed at the parent (a
    # copy that differs, or whose parent's records are gone, is kept and stays the child's own).
    (
        "ALTER TABLE sessions ADD COLUMN base_uid TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE sessions ADD COLUMN base_seq INTEGER NOT NULL DEFAULT 0",
        """
        CREATE TEMP TABLE shared_prefixes AS
        SELECT c.session AS uid, c.parent_uid AS parent, c.fork_seq AS upto
        FROM sessions AS c JOIN sessions AS p ON p.session = c.parent_uid
        WHERE c.fork_seq > 0
          AND (SELECT count(*) FROM events AS ce
               JOIN events AS pe ON pe.session = c.parent_uid AND pe.seq = ce.seq
                   AND pe.prev_hash = ce.prev_hash AND pe.hash = ce.hash AND pe.fence = ce.fence
                   AND pe.event = ce.event
               WHERE ce.session = c.session AND ce.seq <= c.fork_seq) = c.fork_seq
        """,
        """
        UPDATE sessions SET
            base_uid = (SELECT parent FROM shared_prefixes WHERE uid = sessions.session),
            base_seq = (SELECT upto FROM shared_prefixes WHERE uid = sessions.session)
        WHERE session IN (SELECT uid FROM shared_prefixes)
        """,
        """
        DELETE FROM events WHERE EXISTS (
            SELECT 1 FROM shared_prefixes AS s WHERE s.uid = events.session AND events.seq <= s.upto
        )
        """,
        "DROP TABLE temp.shared_prefixes",
        "CREATE INDEX sessions_base ON sessions(base_uid) WHERE base_uid <> ''",
    ),
    # 4: each session row keeps the execution state its journal projects (journal.execstate),
    # maintained by every append, so listing sessions reads no journal. Existing rows are folded
    # from their journals once, by _project_existing_sessions. And one row a health probe writes
    # to learn whether the journal takes writes again.
    (
        "ALTER TABLE sessions ADD COLUMN exec_projection TEXT",
        """
        CREATE TABLE IF NOT EXISTS journal_probe (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            written_at INTEGER NOT NULL
        )
        """,
    ),
)


_ROW_COLUMNS: Final = (
    "session, project, name, harness, model, labels, annotations, origin, identity, parent_uid, "
    "fork_seq, created_at, updated_at, compute_state, last_seq, exec_projection, last_hash"
)
_INSERT_ROW: Final = (
    "INSERT INTO sessions (session, project, name, harness, model, labels, annotations, origin, identity, "
    "parent_uid, fork_seq, created_at, updated_at, compute_state, fence, last_seq, last_hash, "
    "exec_projection) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_EVENT: Final = (
    "INSERT INTO events (session, seq, prev_hash, hash, fence, event) VALUES (?, ?, ?, ?, ?, ?)"
)
_MOVE_HEAD: Final = (
    "UPDATE sessions SET compute_state = ?, updated_at = ?, last_seq = ?, last_hash = ?, fence = ?, "
    "exec_projection = ? WHERE session = ?"
)
_HEAD: Final = (
    "SELECT deleted, fence, compute_state, last_seq, last_hash, exec_projection "
    "FROM sessions WHERE session = ?"
)

# A page of sessions is one row, its sessions' JSON arrays one to a line, that SQLite builds in a
# single step, so the pager's thread gives the GIL up and takes it back once per page rather than
# once per session: with the event loop busy (as under load) each retake waits up to the
# interpreter's switch interval, and a page of 100 rows fetched row by row took 31 ms of wall time
# (p50, beside a busy thread) against 5 ms as one row. A session's line is also the key its decoded
# row is kept by (journal.listed). Blobs travel as hex (NULL stays null: an empty message is a blob of
# no bytes).
_PAGE_BLOBS: Final = tuple(i for i, n in enumerate(_ROW_COLUMNS.split(", ")) if n in ("origin", "identity"))
_PAGE_COLUMNS: Final = ", ".join(
    f"iif({name} IS NULL, NULL, hex({name}))" if i in _PAGE_BLOBS else name
    for i, name in enumerate(_ROW_COLUMNS.split(", "))
)

_T = TypeVar("_T")
_PAGERS: Final = 4  # connections serving pages of sessions


# -- row encoding ------------------------------------------------------------------------------


def _json_object(text: str) -> dict[str, str]:
    return {} if text == "{}" else dict(json.loads(text))  # most sessions carry no labels


def _row_from(rec: Sequence[Any], *, listed: bool = False) -> SessionRow:
    """A session row from its columns; ``listed``: read for a listing (see execstate.decode)."""
    return SessionRow(
        uid=rec[0],
        project=rec[1],
        name=rec[2],
        harness=rec[3],
        model=rec[4],
        labels=_json_object(rec[5]),
        annotations=_json_object(rec[6]),
        origin=None if rec[7] is None else common_pb2.Origin.FromString(rec[7]),
        identity=None if rec[8] is None else common_pb2.IdentityRef.FromString(rec[8]),
        parent_uid=rec[9],
        fork_seq=rec[10],
        create_time_ns=rec[11],
        update_time_ns=rec[12],
        compute_state=rec[13],
        last_seq=rec[14],
        exec_projection=execstate.decode(rec[15], keep=listed),
        last_hash=rec[16],
    )


def _log_record(rec: Sequence[Any]) -> common_pb2.LogRecord:
    out = common_pb2.LogRecord(seq=rec[0], prev_hash=rec[1], content_hash=rec[2], fence=rec[3])
    out.event.ParseFromString(rec[4])
    return out


def _chunks(items: Sequence[str]) -> list[Sequence[str]]:
    return [items[i : i + _IN_CHUNK] for i in range(0, len(items), _IN_CHUNK)]


# -- connections -------------------------------------------------------------------------------


class _Connection:
    """A sqlite3 connection and the one thread it is used on.

    The thread is a daemon: a process that ends without closing its store stops it mid-write,
    which SQLite survives as it survives kill -9 (the transaction is rolled back on next open)."""

    def __init__(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        self._jobs = jobs
        self.db: sqlite3.Connection | None = None
        self.in_flight = 0  # jobs handed to the thread and not yet answered (on the event loop)
        # Whether a job may run right here, on the event loop's thread (see ``here``).
        self.inline: Callable[[], bool] | None = None
        self.busy_timeout_ms = 0
        # Whether the connection waits out another's lock now (its busy timeout is set) or fails at
        # once (0, while its transactions start on the event loop's thread: see ``transaction``).
        self.waits = True
        self.inline_jobs = 0  # jobs run on the event loop's thread (stats, tests)

    @classmethod
    async def open(cls, path: str, busy_timeout_ms: int, role: str) -> _Connection:
        jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        name = f"agentsessions-sqlite-{role}"
        threading.Thread(target=_serve, args=(jobs,), name=name, daemon=True).start()
        connection = cls(jobs)
        connection.busy_timeout_ms = busy_timeout_ms
        try:
            connection.db = await connection._call(_connect, path, busy_timeout_ms)
        except sqlite3.Error as exc:
            jobs.put(None)
            raise SchemaError(f"cannot open SQLite journal {path}: {exc}") from None
        return connection

    async def _call(self, work: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        self._jobs.put((self, loop, future, work, args))
        # Down again when the thread answers (``_hand_over``), not when this caller stops waiting:
        # a job its caller gave up on still has the connection until it ends.
        self.in_flight += 1
        return await future

    def here(self) -> bool:
        """Whether a job may run right here, on the event loop's thread: ``inline`` says so and
        the connection's thread has nothing queued (so both never use the connection at once)."""
        return self.inline is not None and not self.in_flight and self.inline()

    async def run(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(connection, *args)`` here when ``here()`` allows, else on the connection's thread."""
        if self.here():
            self.inline_jobs += 1
            return work(self.db, *args)
        return await self.queued(work, *args)

    async def queued(self, work: Callable[..., _T], *args: Any) -> _T:
        """``work(connection, *args)`` on the connection's thread."""
        return await self._call(work, self.db, *args)

    async def close(self) -> None:
        try:
            if self.db is not None:
                await self.run(sqlite3.Connection.close)
        finally:
            self._jobs.put(None)


_Job = tuple[
    _Connection, asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]
]


def _serve(jobs: queue.SimpleQueue[_Job | None]) -> None:
    """A connection's thread: run each job in order, hand its outcome to the job's event loop."""
    while (job := jobs.get()) is not None:
        connection, loop, future, work, args = job
        try:
            outcome, failed = work(*args), False
        except BaseException as exc:  # handed to the waiting coroutine, whatever it is
            outcome, failed = exc, True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_hand_over, connection, future, outcome, failed)


def _hand_over(connection: _Connection, future: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    connection.in_flight -= 1
    if future.done():  # the caller was cancelled; the work stands regardless
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _connect(path: str, busy_timeout_ms: int) -> sqlite3.Connection:
    # Autocommit mode (isolation_level None): transactions are spelled out as statements.
    return sqlite3.connect(
        path, isolation_level=None, timeout=busy_timeout_ms / 1000, check_same_thread=False
    )


def run_without_suspending(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine that awaits only calls that never suspend, to its end, here and now.

    The engine's batch program is a coroutine so that PostgreSQL can await its statements;
    SQLite's statements are plain calls, so the whole program runs on the writer's thread."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: _T = done.value
        return result
    coro.close()
    raise RuntimeError("a SQLite write transaction awaited something that suspends")


# -- a session's records, shared along its fork bases -------------------------------------------


def _base(db: sqlite3.Connection, uid: str) -> tuple[str, int]:
    rec = db.execute("SELECT base_uid, base_seq FROM sessions WHERE session = ?", (uid,)).fetchone()
    return ("", 0) if rec is None or not rec[0] else (str(rec[0]), int(rec[1]))


def _segments(db: sqlite3.Connection, uid: str) -> list[tuple[str, int, int | None]]:
    """Where a session's records are stored, newest first: (owner, lo, hi) says the owner's rows
    with lo < seq <= hi (hi None: unbounded, so rows stored beyond the head are still seen)."""
    segments: list[tuple[str, int, int | None]] = []
    owner, hi = uid, None
    base_uid, base_seq = _base(db, owner)
    lo = base_seq
    segments.append((owner, lo, hi))
    while base_uid and lo > 0 and len(segments) < _MAX_BASE_DEPTH:
        owner, hi = base_uid, lo
        base_uid, base_seq = _base(db, owner)
        lo = min(base_seq, hi)
        segments.append((owner, lo, hi))
    return segments


_OWN_ROWS: Final = (
    "SELECT seq, prev_hash, hash, fence, event FROM events "
    "WHERE session = ? AND seq > ? AND seq <= ? ORDER BY seq"
)
_UNBOUNDED: Final = 1 << 62


def _resolved(db: sqlite3.Connection, uid: str, from_seq: int, to_seq: int) -> list[Any]:
    """(seq, prev_hash, hash, fence, event) of the session's records from_seq..to_seq (to_seq 0:
    no bound), wherever along its bases they are stored, in seq order."""
    top = to_seq if to_seq > 0 else _UNBOUNDED
    rows: list[Any] = []
    for owner, lo, hi in reversed(_segments(db, uid)):
        low = max(lo, from_seq - 1)
        high = top if hi is None else min(hi, top)
        if low < high:
            rows.extend(db.execute(_OWN_ROWS, (owner, low, high)))
    return rows


# -- the writer's transaction ------------------------------------------------------------------


class _Transaction(SqliteLiveStatements):
    """Statements on the writer connection, inside its BEGIN IMMEDIATE transaction."""

    def __init__(self, dialect: _SqliteDialect, db: sqlite3.Connection) -> None:
        self._dialect = dialect
        self._db = db

    async def foreign_writes(self) -> bool:
        # data_version moves only when another connection commits: this writer's cache holds.
        version = int(self._db.execute("PRAGMA data_version").fetchone()[0])
        changed = version != self._dialect.data_version
        self._dialect.data_version = version
        return changed

    async def heads(self, uids: Sequence[str]) -> dict[str, SessionHead]:
        out: dict[str, SessionHead] = {}
        for uid in uids:
            rec = self._db.execute(_HEAD, (uid,)).fetchone()
            if rec is None:
                out[uid] = SessionHead(uid)
            else:
                out[uid] = SessionHead(
                    uid, True, bool(rec[0]), rec[1], rec[2], rec[3], rec[4], head_projection(rec[5])
                )
        return out

    async def append_rows(
        self, rows: Sequence[StoredRecord], moved: Sequence[SessionHead], now_ns: int
    ) -> None:
        db = self._db
        db.executemany(
            _INSERT_EVENT, [(r.session, r.seq, r.prev_hash, r.hash, r.fence, r.event) for r in rows]
        )
        db.executemany(
            _MOVE_HEAD,
            [(h.compute_state, now_ns, h.seq, h.hash, h.fence, h.exec.encode(), h.uid) for h in moved],
        )

    async def insert_sessions(self, sessions: Sequence[NewSession]) -> None:
        self._db.executemany(_INSERT_ROW, [session_values(s) for s in sessions])

    async def insert_session_if_new(self, session: NewSession) -> bool:
        return (
            self._db.execute(
                _INSERT_ROW + " ON CONFLICT (session) DO NOTHING", session_values(session)
            ).rowcount
            == 1
        )

    async def taken(self, uids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        for chunk in _chunks(uids):
            marks = ",".join("?" * len(chunk))
            found.update(
                r[0]
                for r in self._db.execute(f"SELECT session FROM sessions WHERE session IN ({marks})", chunk)
            )
        return found

    async def live_row(self, uid: str) -> SessionRow | None:
        rec = self._db.execute(
            f"SELECT {_ROW_COLUMNS} FROM sessions WHERE session = ? AND deleted = 0", (uid,)
        ).fetchone()
        return None if rec is None else _row_from(rec)

    async def mark_deleted(self, uid: str, now_ns: int) -> None:
        self._db.execute("UPDATE sessions SET deleted = 1, updated_at = ? WHERE session = ?", (now_ns, uid))

    async def purge(self, uid: str) -> None:
        db = self._db
        _unshare(db, uid)
        db.execute(
            "UPDATE sessions SET last_seq = 0, last_hash = '', base_uid = '', base_seq = 0, "
            "exec_projection = ? WHERE session = ?",
            (execstate.EMPTY.encode(), uid),
        )
        db.execute("DELETE FROM events WHERE session = ?", (uid,))
        db.execute("DELETE FROM tool_receipts WHERE session = ?", (uid,))

    async def record_at(self, uid: str, seq: int) -> tuple[int, str] | None:
        rows = _resolved(self._db, uid, seq, seq)
        return (int(rows[0][0]), str(rows[0][2])) if rows else None

    async def share_prefix(self, children: Sequence[str], parent_uid: str, at_seq: int) -> None:
        # A prefix that lies wholly in the parent's own base is taken from there, keeping base
        # chains short.
        base_uid, base_seq = _base(self._db, parent_uid)
        owner = "" if at_seq == 0 else base_uid if base_uid and at_seq <= base_seq else parent_uid
        self._db.executemany(
            "UPDATE sessions SET base_uid = ?, base_seq = ? WHERE session = ?",
            [(owner, at_seq if owner else 0, uid) for uid in children],
        )

    async def put_harness(self, name: str, registration: bytes, now_ns: int) -> None:
        self._db.execute(
            "INSERT INTO harnesses (name, registration, updated_at) VALUES (?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET registration = excluded.registration, "
            "updated_at = excluded.updated_at",
            (name, registration, now_ns),
        )

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: bytes, now_ns: int) -> None:
        self._db.execute(
            "INSERT INTO tool_receipts (session, idempotency_key, result, created_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (session, idempotency_key) DO NOTHING",
            (uid, idempotency_key, result, now_ns),
        )

    async def touch_probe(self, now_ns: int) -> None:
        self._db.execute(
            "INSERT INTO journal_probe (id, written_at) VALUES (1, ?) "
            "ON CONFLICT (id) DO UPDATE SET written_at = excluded.written_at",
            (now_ns,),
        )


def _unshare(db: sqlite3.Connection, uid: str) -> None:
    """Before ``uid``'s own rows are dropped, copy the part each session based on it shares into
    that session, and rebase it onto ``uid``'s own base."""
    own_base, own_from = _base(db, uid)
    dependents = db.execute("SELECT session, base_seq FROM sessions WHERE base_uid = ?", (uid,)).fetchall()
    for dependent, upto in dependents:
        db.execute(
            "INSERT INTO events (session, seq, prev_hash, hash, fence, event) "
            "SELECT ?, seq, prev_hash, hash, fence, event FROM events "
            "WHERE session = ? AND seq > ? AND seq <= ?",
            (dependent, uid, own_from, upto),
        )
        rebased = min(int(upto), own_from)
        db.execute(
            "UPDATE sessions SET base_uid = ?, base_seq = ? WHERE session = ?",
            (own_base if rebased > 0 else "", rebased if own_base else 0, dependent),
        )


class _WriteLockHeld(Exception):
    """Another connection holds the write lock, and the transaction was not to wait for it."""


def _transact(db: sqlite3.Connection, dialect: _SqliteDialect, body: Callable[[_Transaction], Any]) -> Any:
    """BEGIN IMMEDIATE (waiting for the write lock), the body, COMMIT: on the writer's thread."""
    _let_wait(db, dialect.writer)
    db.execute("BEGIN IMMEDIATE")
    result, before = _run(db, dialect, body)
    _commit(db, dialect, before)
    return result


def _begin_and_run(
    db: sqlite3.Connection, dialect: _SqliteDialect, body: Callable[[_Transaction], Any]
) -> tuple[Any, int | None]:
    """On the event loop: BEGIN IMMEDIATE only if the write lock is free at once (else
    _WriteLockHeld, and nothing is done), then the body; the caller commits (``_commit``).

    The busy timeout stays 0 from one such transaction to the next (two statements fewer each):
    the other jobs of the writer's connection set it back first (``_transact``, ``_waiting``)."""
    writer = dialect.writer
    if writer.waits:
        db.execute("PRAGMA busy_timeout = 0")
        writer.waits = False
    try:
        db.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            raise _WriteLockHeld from exc
        raise
    return _run(db, dialect, body)


def _run(
    db: sqlite3.Connection, dialect: _SqliteDialect, body: Callable[[_Transaction], Any]
) -> tuple[Any, int | None]:
    """The body of an open transaction (rolled back if it fails), and the change mark before it
    commits."""
    try:
        result = run_without_suspending(body(_Transaction(dialect, db)))
        return result, dialect.change_mark()  # under the write lock: nobody else commits meanwhile
    except BaseException:
        _roll_back(db, dialect)
        raise


def _commit(db: sqlite3.Connection, dialect: _SqliteDialect, before: int | None) -> None:
    """COMMIT the open transaction (rolled back if that fails); ``before``: the change mark it
    left under the write lock."""
    try:
        db.execute("COMMIT")
    except BaseException:
        _roll_back(db, dialect)
        raise
    # Read again with the lock given up: exactly one more is this commit alone; more is another
    # connection's commit right after it, and nothing is vouched for. The same means this
    # transaction wrote nothing, and what was vouched for before still is.
    after = dialect.change_mark()
    if before is None or after is None or after not in (before, (before + 1) & 0xFFFFFFFF):
        dialect.committed_mark = None
    elif after != before:
        dialect.committed_mark = after


def _waiting(db: sqlite3.Connection, connection: _Connection, work: Callable[..., _T], *args: Any) -> _T:
    """``work(db, *args)`` with the connection's busy timeout set (see ``_begin_and_run``)."""
    _let_wait(db, connection)
    return work(db, *args)


def _let_wait(db: sqlite3.Connection, connection: _Connection) -> None:
    """Set the connection's busy timeout back, where a transaction started on the loop left it 0."""
    if not connection.waits:
        db.execute(f"PRAGMA busy_timeout = {int(connection.busy_timeout_ms)}")
        connection.waits = True


def _roll_back(db: sqlite3.Connection, dialect: _SqliteDialect) -> None:
    dialect.committed_mark = None
    with contextlib.suppress(sqlite3.Error):
        db.execute("ROLLBACK")


# -- reads (each one trip to the reader's thread) ----------------------------------------------


def _get_row(db: sqlite3.Connection, uid: str) -> SessionRow | None:
    rec = db.execute(
        f"SELECT {_ROW_COLUMNS} FROM sessions WHERE session = ? AND deleted = 0", (uid,)
    ).fetchone()
    return None if rec is None else _row_from(rec)


def _list_texts(db: sqlite3.Connection, project: str, after: tuple[int, str] | None, limit: int) -> list[str]:
    """A page of the project's session rows, each as the JSON array of its columns (``_PAGE_COLUMNS``)."""
    args: tuple[str | int, ...]
    if after is None:
        where, args = "", (project, limit)
    else:
        where = "AND (created_at < ? OR (created_at = ? AND session > ?)) "
        args = (project, after[0], after[0], after[1], limit)
    (text,) = db.execute(
        f"SELECT group_concat(json_array({_PAGE_COLUMNS}), char(10)) FROM (SELECT {_ROW_COLUMNS} "
        f"FROM sessions WHERE project = ? AND deleted = 0 {where}ORDER BY created_at DESC, session ASC "
        "LIMIT ?)",
        args,
    ).fetchone()
    # JSON escapes every control character inside its strings: a newline only ever parts two rows.
    return text.split("\n") if text else []


def _decode_listed(texts: list[str]) -> list[SessionRow]:
    """Rows from their page lines, decoded in one go (a decoder's call per row costs a third more)."""
    items = json.loads("[" + ",".join(texts) + "]")
    return [_row_from(_page_item(item), listed=True) for item in items]


def _line_session(line: str) -> str:
    """The session a page line is of: the line's start, up to its uid's closing quote (for a uid
    holding an escaped quote and a comma, a prefix of it: another uid may share the prefix, which
    only means their rows take each other's place among the kept ones)."""
    end = line.find('",')
    return line if end < 0 else line[:end]


def _listing_order(row: SessionRow) -> tuple[int, str]:
    return (-row.create_time_ns, row.uid)


def _page_item(item: list[Any]) -> list[Any]:
    for i in _PAGE_BLOBS:
        if item[i] is not None:
            item[i] = bytes.fromhex(item[i])
    return item


def _read(db: sqlite3.Connection, uid: str, from_seq: int, to_seq: int) -> list[common_pb2.LogRecord]:
    # One read transaction: a purge moving shared rows meanwhile cannot tear the result.
    db.execute("BEGIN")
    try:
        return [_log_record(r) for r in _resolved(db, uid, from_seq, to_seq)]
    finally:
        db.execute("COMMIT")


def _anchor(db: sqlite3.Connection, uid: str) -> tuple[int, str] | None:
    rec = db.execute("SELECT last_seq, last_hash FROM sessions WHERE session = ?", (uid,)).fetchone()
    return None if rec is None else (int(rec[0]), str(rec[1]))


def _verify_scan(db: sqlite3.Connection, uid: str, check: ChainCheck) -> tuple[int, str] | None:
    # One read transaction: the anchor and the records come from the same snapshot.
    db.execute("BEGIN")
    try:
        anchor = _anchor(db, uid)
        for owner, lo, hi in reversed(_segments(db, uid)):
            for seq, prev_hash, digest, _fence, blob in db.execute(
                _OWN_ROWS, (owner, lo, _UNBOUNDED if hi is None else hi)
            ):
                check.feed(seq, prev_hash, digest, blob)
    finally:
        db.execute("COMMIT")
    return anchor


# SQLite's primary result codes for storage that refuses the operation (sqlite3.h): the file or
# its directory is read-only or immutable, the disk is full or failing, the file cannot be opened
# or is locked past the busy timeout, or it is no longer a database.
_STORAGE_CODES: Final = frozenset({3, 5, 6, 8, 10, 11, 13, 14, 26})


def _storage_refused(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and isinstance(code, int) and (code & 0xFF) in _STORAGE_CODES


def _busy(exc: BaseException) -> bool:
    """Whether SQLite answered that another connection holds a lock this one would wait for."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(code, int) and (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _fetch_all(db: sqlite3.Connection, sql: str, params: Sequence[Any]) -> list[Any]:
    return db.execute(sql, params).fetchall()


# -- the dialect -------------------------------------------------------------------------------


class _SqliteDialect:
    immediate: Final = False
    max_in_flight: Final = 1

    def __init__(
        self,
        path: str,
        writer: _Connection,
        reader: _Connection,
        pagers: Sequence[_Connection],
        records: _Connection,
        scanner: _Connection,
        pages_here: _Connection | None = None,
        kept_listed: int = KEPT_LISTED,
    ) -> None:
        self.path = path
        self.writer = writer
        self._reader = reader
        # Under load the reader's queue holds hundreds of the turns' row lookups: a page of sessions
        # behind them waited up to ~300 ms (200 sessions turning), and held them up for ~7 ms each.
        # A page goes to the pager with the fewest jobs in flight: 20 listers paging at once queued
        # up to 18 pages deep on one (a page's ~1 ms of work takes 4-60 ms while the loop holds the GIL).
        self._pagers = list(pagers)
        # Ranges of records (Replay pages, a journal read whole) on a thread of their own, so row
        # lookups and session pages never wait behind a long read.
        self._records = records
        self._scanner = scanner
        # Pages of sessions on the event loop's own thread, first: see list_rows.
        self._pages_here = pages_here
        self.pages_here = 0  # pages served on the event loop's thread (stats, tests)
        self.listed: ListedRows[str] = ListedRows(kept_listed)  # by each row's page line (_list_texts)
        # PRAGMA data_version in the writer's last transaction (None: before the first).
        self.data_version: int | None = None
        # The WAL index's header, mapped read-only by map_wal_index (None: not mapped).
        self._shm: mmap.mmap | None = None
        self.committed_mark: int | None = None

    def map_wal_index(self) -> None:
        """Map the first page of the file's WAL index, read-only; left unmapped where there is
        none to map (no -shm file beside the journal, or one too short), and then ``change_mark``
        is None and every row is read from the file."""
        try:
            with open(f"{self.path}-shm", "rb") as f:
                self._shm = mmap.mmap(f.fileno(), mmap.PAGESIZE, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            self._shm = None

    def change_mark(self) -> int | None:
        """The WAL index's change counter: SQLite adds one for every commit, by any connection of
        any process (https://www.sqlite.org/walformat.html, the WAL-index header's ``iChange``);
        checkpoints, reads and rollbacks leave it. None when the index is not mapped."""
        shm = self._shm
        if shm is None:
            return None
        mark: int = _ICHANGE.unpack_from(shm, _ICHANGE_OFFSET)[0]
        return mark

    async def transaction(self, body: Callable[[_Transaction], Awaitable[_T]]) -> _T:
        writer = self.writer
        db = writer.db
        if db is not None and not writer.in_flight:
            # The statements right here, on the event loop's thread, and the COMMIT (its fsync) on
            # the writer's thread, or here too while the loop has nothing else to do (``here``).
            # On the writer's thread the body's Python and its every statement each had to take the
            # GIL back from the busy loop: 32 sessions turned 7-10% faster with only the COMMIT
            # there. The body holds the loop for its length (a big batch's too), as it held the
            # GIL before. Nothing else uses the connection meanwhile: the body never suspends, and
            # the COMMIT is the writer's only job in flight until it is answered.
            try:
                result, before = _begin_and_run(db, self, body)
            except _WriteLockHeld:
                pass  # another connection (another process) is writing: wait for it on the thread
            else:
                if writer.here():
                    writer.inline_jobs += 1
                    _commit(db, self, before)
                else:
                    await writer.queued(_commit, self, before)
                done: _T = result
                return done
        queued: _T = await writer.queued(_transact, self, body)
        return queued

    def work_inline_while(self, quiet: Callable[[], bool]) -> None:
        # A commit handed to the writer's thread and back costs a turn ~0.2 ms beyond the commit
        # itself (two thread wake-ups and the GIL's return); on the event loop's thread it costs
        # none, but holds the loop through the fsync. Worth it only while nothing else waits on the
        # loop: one session turned 14% faster (165 -> 189 turns/s), 32 sessions 31% slower with
        # the rule always on (bench/NOTEBOOK.md).
        self.writer.inline = self._reader.inline = quiet

    def batch_failure(self, exc: Exception) -> BatchFailure:
        if isinstance(exc, sqlite3.IntegrityError):
            # A row already there: another writer won it, or the file was edited behind our back.
            return BatchFailure(ConflictError, f"journal write lost to a concurrent writer: {exc}", True)
        if _storage_refused(exc):
            return BatchFailure(JournalUnavailableError, f"journal not writable: {exc} ({self.path})")
        if isinstance(exc, sqlite3.Error):
            return BatchFailure(StoreError, f"journal write failed: {exc}")
        return BatchFailure(StoreError, f"journal write failed: {exc!r}")

    async def _read(
        self, what: str, work: Callable[..., _T], *args: Any, on: _Connection | None = None
    ) -> _T:
        try:
            return await (on or self._reader).run(work, *args)
        except sqlite3.Error as exc:
            raise self._read_failed(what, exc) from exc

    def _read_failed(self, what: str, exc: sqlite3.Error) -> StoreError:
        if _storage_refused(exc):
            return JournalUnavailableError(f"journal not readable: {what}: {exc} ({self.path})")
        return StoreError(f"{what} failed: {exc}")

    async def get_row(self, uid: str) -> SessionRow | None:
        return await self._read("get session", _get_row, uid)

    async def list_rows(self, project: str, after: tuple[int, str] | None, limit: int) -> list[SessionRow]:
        # A page is one indexed query building one row (~0.2 ms of SQLite on an idle machine, plus
        # decoding it): done right here, on the event loop's thread, it skips the two trips a
        # pager's thread costs (the job's wait for the GIL while the loop holds it, and the answer's
        # wait in the loop's queue behind every turn's callbacks). The connection never waits for a
        # lock (busy timeout 0): a page that finds the file busy goes to a pager's thread instead.
        here = self._pages_here
        if here is not None and here.db is not None:
            try:
                texts = _list_texts(here.db, project, after, limit)
            except sqlite3.Error as exc:
                if not _busy(exc):
                    raise self._read_failed("list sessions", exc) from exc
            else:
                self.pages_here += 1
                return self._listed(texts)
        pager = min(self._pagers, key=lambda c: c.in_flight)
        return self._listed(await self._read("list sessions", _list_texts, project, after, limit, on=pager))

    def _listed(self, texts: list[str]) -> list[SessionRow]:
        rows = self.listed.rows([(_line_session(text), text) for text in texts], _decode_listed)
        # The aggregate's order is the subquery's in practice, which SQLite does not promise.
        rows.sort(key=_listing_order)
        return rows

    async def read(self, uid: str, from_seq: int, to_seq: int) -> list[common_pb2.LogRecord]:
        return await self._read("read", _read, uid, from_seq, to_seq, on=self._records)

    async def anchor(self, uid: str) -> tuple[int, str] | None:
        return await self._read("head", _anchor, uid)

    async def verify_scan(self, uid: str, check: ChainCheck) -> tuple[int, str] | None:
        try:
            return await self._scanner.run(_verify_scan, uid, check)
        except sqlite3.Error as exc:
            raise StoreError(f"verify failed: {exc}") from exc

    async def session_uids(self) -> list[str]:
        recs = await self._read(
            "list session uids",
            _fetch_all,
            "SELECT session FROM sessions UNION SELECT session FROM events ORDER BY 1",
            (),
        )
        return [str(r[0]) for r in recs]

    async def get_harness(self, name: str) -> bytes | None:
        recs = await self._read(
            "get harness", _fetch_all, "SELECT registration FROM harnesses WHERE name = ?", (name,)
        )
        return bytes(recs[0][0]) if recs else None

    async def list_harnesses(self) -> list[bytes]:
        recs = await self._read(
            "list harnesses", _fetch_all, "SELECT registration FROM harnesses ORDER BY name", ()
        )
        return [bytes(r[0]) for r in recs]

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> bytes | None:
        recs = await self._read(
            "get tool receipt",
            _fetch_all,
            "SELECT result FROM tool_receipts WHERE session = ? AND idempotency_key = ?",
            (uid, idempotency_key),
        )
        return bytes(recs[0][0]) if recs else None

    async def pragma(self, name: str) -> int:
        rows = await self.writer.run(_waiting, self.writer, _fetch_all, f"PRAGMA {name}", ())
        return int(rows[0][0])

    async def schema_version(self) -> int:
        rows = await self._read("read schema version", _fetch_all, "PRAGMA user_version", ())
        return int(rows[0][0])

    async def close(self) -> None:
        here = () if self._pages_here is None else (self._pages_here,)
        for connection in (self.writer, self._reader, *self._pagers, self._records, self._scanner, *here):
            with contextlib.suppress(sqlite3.Error):
                await connection.close()
        shm, self._shm = self._shm, None
        if shm is not None:
            shm.close()


# The WAL-index header's change counter: a native-order u32 at byte 8 of the -shm file.
_ICHANGE: Final = struct.Struct("=I")
_ICHANGE_OFFSET: Final = 8


class SqliteStore(DialectStore):
    """JournalStore on one SQLite file. Create with ``await SqliteStore.open(path)``."""

    def __init__(self, dialect: _SqliteDialect, *, max_batch: int) -> None:
        super().__init__(dialect, max_batch=max_batch)
        self._sqlite = dialect
        self.path = dialect.path

    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        synchronous: str = "FULL",
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        max_batch: int = DEFAULT_MAX_BATCH,
        kept_listed: int = KEPT_LISTED,
    ) -> SqliteStore:
        """Open (creating if absent) the journal at ``path``.

        ``synchronous`` is SQLite's durability knob (FULL: a commit survives power loss; NORMAL: it
        survives a process crash). Raises SchemaError for a file that is not a journal, cannot be
        read, or was written by a newer schema. ``kept_listed``: the listed rows kept decoded for
        the next listing (``journal.listed``; 0: none)."""
        mode = synchronous.upper()
        if mode not in SYNCHRONOUS_MODES:
            raise ValueError(
                f"synchronous must be one of {', '.join(SYNCHRONOUS_MODES)}, got {synchronous!r}"
            )
        where = str(path)
        opened: list[_Connection] = []
        try:
            writer = await _Connection.open(where, busy_timeout_ms, "writer")
            opened.append(writer)
            await writer.run(_prepare, where, mode)
            await writer.run(_create_live_tables, where)
            roles = ("reader", *(f"pager-{i}" for i in range(_PAGERS)), "records", "scanner", "pages-here")
            for role in roles:
                # The event loop's own connection never waits for a lock (list_rows).
                timeout_ms = 0 if role == "pages-here" else busy_timeout_ms
                connection = await _Connection.open(where, timeout_ms, role)
                opened.append(connection)
                await connection.run(_fetch_all, "PRAGMA query_only = ON", ())
        except BaseException:
            for connection in opened:
                with contextlib.suppress(sqlite3.Error):
                    await connection.close()
            raise
        reader, *pagers, records, scanner, here = opened[1:]
        dialect = _SqliteDialect(where, writer, reader, pagers, records, scanner, here, kept_listed)
        # Mapped here, once: the file is in WAL mode and open, so its index exists by now.
        dialect.map_wal_index()
        return cls(dialect, max_batch=max_batch)

    async def schema_version(self) -> int:
        """The schema version recorded in the file (``PRAGMA user_version``)."""
        self._check_open("read schema version")
        return await self._sqlite.schema_version()

    async def pragma(self, name: str) -> int:
        """An integer PRAGMA's value on the writer connection (for diagnostics and tests)."""
        self._check_open("read pragma")
        return await self._sqlite.pragma(name)


# -- schema --------------------------------------------------------------------------------------


def _prepare(db: sqlite3.Connection, path: str, synchronous: str) -> None:
    """On the writer's thread: check the file is ours (or empty), switch to WAL, and create or
    migrate the schema."""
    try:
        app_id, version, tables = _identity(db)
    except sqlite3.DatabaseError as exc:
        raise SchemaError(f"{path} is not a readable SQLite database: {exc}") from None
    _check_identity(path, app_id, version, tables)
    _set_wal(db, path)
    try:
        db.execute(f"PRAGMA synchronous = {synchronous}")
        if app_id == APPLICATION_ID and version == SCHEMA_VERSION:
            return
        # Several processes may open the file at once: migrate under the write lock, re-checking.
        db.execute("BEGIN IMMEDIATE")
        try:
            app_id, version, tables = _identity(db)
            _check_identity(path, app_id, version, tables)
            for reached, statements in enumerate(_MIGRATIONS[version:], start=version + 1):
                for statement in statements:
                    db.execute(statement)
                if reached == 4 and version > 0:
                    _project_existing_sessions(db)
            db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise SchemaError(f"cannot initialize SQLite journal {path}: {exc}") from None


def _project_existing_sessions(db: sqlite3.Connection) -> None:
    """Schema 4 on a journal of an earlier version: fold each session's journal into its row
    (the one time a session's records are read for its execution state)."""
    sessions = db.execute("SELECT session, fork_seq FROM sessions WHERE exec_projection IS NULL").fetchall()
    for uid, fork_seq in sessions:
        events = []
        for rec in _resolved(db, uid, 1, 0):
            event = common_pb2.Event()
            event.ParseFromString(rec[4])
            events.append(event)
        projection = execstate.fold(events, fork_seq=int(fork_seq))
        db.execute("UPDATE sessions SET exec_projection = ? WHERE session = ?", (projection.encode(), uid))


def _create_live_tables(db: sqlite3.Connection, path: str) -> None:
    try:
        create_live_tables(db)
    except sqlite3.Error as exc:
        raise SchemaError(f"cannot create the live tables of SQLite journal {path}: {exc}") from None


def _identity(db: sqlite3.Connection) -> tuple[int, int, list[str]]:
    """(application_id, user_version, table names), read from one snapshot (or in the caller's
    transaction): a concurrent first open may be creating the schema meanwhile."""
    own = not db.in_transaction
    if own:
        db.execute("BEGIN")
    try:
        (app_id,) = db.execute("PRAGMA application_id").fetchone()
        (version,) = db.execute("PRAGMA user_version").fetchone()
        tables = [
            str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        ]
    finally:
        if own:
            db.execute("COMMIT")
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


def _set_wal(db: sqlite3.Connection, path: str) -> None:
    # Switching to WAL needs a moment of exclusive access; a concurrent opener may hold the file.
    for attempt in range(_WAL_ATTEMPTS):
        try:
            rec = db.execute("PRAGMA journal_mode = WAL").fetchone()
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or attempt == _WAL_ATTEMPTS - 1:
                raise SchemaError(f"cannot switch SQLite journal {path} to WAL: {exc}") from None
            time.sleep(0.02)  # on the writer's own thread, not the event loop
            continue
        if rec is None or str(rec[0]).lower() != "wal":
            raise SchemaError(f"SQLite journal {path} refused WAL mode (got {rec[0] if rec else None!r})")
        return
