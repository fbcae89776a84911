"""PostgreSQL journal store (asyncpg), a dialect of ``engine.DialectStore``: several host
processes may share one database.

Cross-process single-writer safety comes from the database, not from this process: every write
transaction locks the rows of the sessions it appends to (``SELECT ... FOR UPDATE``) before the
rules compare the head and the fence, and the ``(session, seq)`` primary key backs that up. The
engine's group commit carries every write queued in this process; one transaction per batch (one
WAL flush) makes the whole batch durable, with two batches in flight on separate connections.
Heads are read under the lock in every transaction: this dialect cannot tell whether another
host committed since (``foreign_writes`` is always True), so the engine's head cache is not used.

A fork child does not copy its parent's prefix: its records 1..fork_seq are read through the
parent (spec 3.1 still holds for what ``read`` returns: identical records, identical hashes).
Purging a session first copies into its children the rows they share with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Final, TypeVar, cast

import asyncpg

from agentsessions.host.journal import PostgresURLError, execstate, redact_url, validate_postgres_url
from agentsessions.host.journal.dialect import BatchFailure
from agentsessions.host.journal.engine import DialectStore
from agentsessions.host.journal.listed import ListedRows
from agentsessions.host.journal.live_postgres import PostgresLiveStatements, create_live_tables
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
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "PostgresStore",
    "PostgresURLError",
    "redact_url",
    "validate_postgres_url",
]

_T = TypeVar("_T")

# Two flushes in flight: one commits while the next batch forms.
DEFAULT_FLUSHERS: Final = 2
DEFAULT_MAX_BATCH: Final = 512
CONNECT_TIMEOUT_S: Final = 10.0
COMMAND_TIMEOUT_S: Final = 60.0
VERIFY_CHUNK: Final = 2000

# Taken by whoever migrates, so concurrent first opens apply each migration once.
_MIGRATION_LOCK_KEY: Final = 0x61676E7473657373  # "agntsess"
_MIGRATIONS_TABLE: Final = "schema_migrations"
_OUR_TABLES: Final = ("sessions", "events", "harnesses", "tool_receipts")


@struct(frozen=True)
class _Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    # Work in Python after the statements, in the same transaction (existing rows to fill).
    backfill: Callable[[Any], Awaitable[None]] | None = None


async def _project_existing_sessions(conn: Any) -> None:
    """Migration 3 on an existing journal: fold each session's journal into its row (the one time
    a session's records are read for its execution state)."""
    sessions = await conn.fetch(
        "SELECT uid, fork_seq FROM sessions WHERE exec_projection IS NULL ORDER BY uid"
    )
    for rec in sessions:
        events = []
        for r in await conn.fetch(_RESOLVED, rec["uid"], 1, 0):
            event = common_pb2.Event()
            event.ParseFromString(r["event"])
            events.append(event)
        projection = execstate.fold(events, fork_seq=int(rec["fork_seq"]))
        await conn.execute(
            "UPDATE sessions SET exec_projection = $2 WHERE uid = $1", rec["uid"], projection.encode()
        )


# Append-only: never edit a released migration, add a new version instead.
MIGRATIONS: Final[tuple[_Migration, ...]] = (
    _Migration(
        1,
        "agentsessions journal: sessions, events, harnesses, tool receipts",
        (
            """
            CREATE TABLE sessions (
                uid TEXT PRIMARY KEY,
                project TEXT NOT NULL DEFAULT '',
                name TEXT NOT NULL DEFAULT '',
                harness TEXT NOT NULL DEFAULT '',
                model TEXT NOT NULL DEFAULT '',
                labels JSONB NOT NULL DEFAULT '{}',
                annotations JSONB NOT NULL DEFAULT '{}',
                origin BYTEA,
                identity BYTEA,
                parent_uid TEXT NOT NULL DEFAULT '',
                fork_seq BIGINT NOT NULL DEFAULT 0,
                fence BIGINT NOT NULL DEFAULT 0,
                compute_state TEXT NOT NULL DEFAULT 'NONE',
                last_seq BIGINT NOT NULL DEFAULT 0,
                last_hash TEXT NOT NULL DEFAULT '',
                created_at BIGINT NOT NULL,
                updated_at BIGINT NOT NULL,
                deleted_at BIGINT
            )
            """,
            """
            CREATE INDEX sessions_project_created
                ON sessions (project, created_at DESC, uid) WHERE deleted_at IS NULL
            """,
            """
            CREATE TABLE events (
                session TEXT NOT NULL,
                seq BIGINT NOT NULL,
                prev_hash TEXT NOT NULL,
                hash TEXT NOT NULL,
                fence BIGINT NOT NULL,
                event BYTEA NOT NULL,
                PRIMARY KEY (session, seq)
            )
            """,
            """
            CREATE TABLE harnesses (
                name TEXT PRIMARY KEY,
                registration BYTEA NOT NULL,
                updated_at BIGINT NOT NULL
            )
            """,
            """
            CREATE TABLE tool_receipts (
                session TEXT NOT NULL,
                idempotency_key TEXT NOT NULL,
                result BYTEA NOT NULL,
                created_at BIGINT NOT NULL,
                PRIMARY KEY (session, idempotency_key)
            )
            """,
        ),
    ),
    _Migration(
        2,
        "fork children share their parent's prefix instead of copying it",
        (
            # Records 1..base_seq of a session are those of base_uid (resolved recursively);
            # the events table holds only the session's own records, seq > base_seq.
            """
            ALTER TABLE sessions
                ADD COLUMN base_uid TEXT NOT NULL DEFAULT '',
                ADD COLUMN base_seq BIGINT NOT NULL DEFAULT 0
            """,
            "CREATE INDEX sessions_base ON sessions (base_uid) WHERE base_uid <> ''",
        ),
    ),
    _Migration(
        3,
        "sessions keep the execution state their journal projects; a journal health probe row",
        (
            # Maintained by every append (journal.execstate), so listing sessions reads no journal.
            "ALTER TABLE sessions ADD COLUMN exec_projection TEXT",
            """
            CREATE TABLE IF NOT EXISTS journal_probe (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                written_at BIGINT NOT NULL
            )
            """,
        ),
        _project_existing_sessions,
    ),
)
SCHEMA_VERSION: Final = MIGRATIONS[-1].version


def _driver_error(what: str, exc: BaseException) -> tuple[type[StoreError], str, bool] | None:
    """The typed store error an asyncpg or socket failure becomes, and whether it is a conflict
    one write of a batch may have caused (worth retrying each write alone); None if not ours."""
    if isinstance(exc, asyncpg.DeadlockDetectedError | asyncpg.SerializationError):
        return ConflictError, f"{what}: concurrent writer won ({exc.sqlstate})", True
    if isinstance(exc, asyncpg.UniqueViolationError):
        return ConflictError, f"{what}: a concurrent writer already wrote that row", True
    if isinstance(exc, asyncpg.UndefinedTableError):
        return SchemaError, f"{what}: journal tables are missing ({exc})", False
    state = "writable" if what == "journal write" else "available"
    if isinstance(exc, asyncpg.PostgresError) and _refuses_writes(exc):
        return JournalUnavailableError, f"journal not {state}: {what}: {exc} ({exc.sqlstate})", False
    if isinstance(exc, asyncpg.PostgresError):
        return StoreError, f"{what}: PostgreSQL error {exc.sqlstate}: {exc}", False
    if isinstance(exc, OSError | asyncpg.InterfaceError | TimeoutError):
        reason = f"PostgreSQL unavailable: {exc or type(exc).__name__}"
        return JournalUnavailableError, f"journal not {state}: {what}: {reason}", False
    return None


# SQLSTATEs of a database that refuses this host's writes for now: no privilege (42501), a
# read-only transaction or server (25006), insufficient resources such as a full disk (class 53),
# the server shutting down or not accepting connections (class 57P), connection failures (08).
_REFUSALS: Final = ("42501", "25006")
_REFUSAL_CLASSES: Final = ("53", "57P", "08")


def _refuses_writes(exc: Any) -> bool:
    state = str(getattr(exc, "sqlstate", "") or "")
    return state in _REFUSALS or state.startswith(_REFUSAL_CLASSES)


@contextlib.contextmanager
def _driver_errors(what: str) -> Iterator[None]:
    """Turn asyncpg/socket failures into typed store errors (never a raw driver error)."""
    try:
        yield
    except StoreError:
        raise
    except Exception as exc:
        mapped = _driver_error(what, exc)
        if mapped is None:
            raise
        raise mapped[0](mapped[1]) from exc


_INSERT_EVENTS: Final = """
    INSERT INTO events (session, seq, prev_hash, hash, fence, event)
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::bytea[])
"""

# One round trip writes the records and moves the heads.
_APPEND_ROWS: Final = """
    WITH appended AS (
        INSERT INTO events (session, seq, prev_hash, hash, fence, event)
        SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::bytea[])
    )
    UPDATE sessions AS s
    SET last_seq = u.last_seq, last_hash = u.last_hash, compute_state = u.compute_state, updated_at = $11,
        fence = u.fence, exec_projection = u.exec_projection
    FROM unnest($7::text[], $8::bigint[], $9::text[], $10::text[], $12::bigint[], $13::text[])
        AS u(uid, last_seq, last_hash, compute_state, fence, exec_projection)
    WHERE s.uid = u.uid
"""

_INSERT_SESSIONS: Final = """
    INSERT INTO sessions (uid, project, name, harness, model, labels, annotations, origin, identity,
        parent_uid, fork_seq, created_at, updated_at, compute_state, fence, last_seq, last_hash,
        exec_projection)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[],
        $7::jsonb[], $8::bytea[], $9::bytea[], $10::text[], $11::bigint[], $12::bigint[], $13::bigint[],
        $14::text[], $15::bigint[], $16::bigint[], $17::text[], $18::text[])
"""

# A session's records: its own rows above base_seq, then (recursively) rows 1..base_seq of its
# base. Each step owns the rows in (lo, hi]; hi is NULL (unbounded) for the session itself, so
# rows stored beyond the head are still seen (and caught by verify).
_RESOLVED: Final = """
    WITH RECURSIVE segment (uid, base_uid, lo, hi, depth) AS (
        SELECT uid, base_uid, base_seq, NULL::bigint, 0 FROM sessions WHERE uid = $1
        UNION ALL
        SELECT p.uid, p.base_uid, LEAST(p.base_seq, seg.lo), seg.lo, seg.depth + 1
        FROM segment AS seg JOIN sessions AS p ON p.uid = seg.base_uid
        WHERE seg.lo > 0 AND seg.base_uid <> '' AND seg.depth < 10000
    )
    SELECT e.seq, e.prev_hash, e.hash, e.fence, e.event
    FROM segment AS seg
    JOIN events AS e ON e.session = seg.uid AND e.seq > seg.lo AND (seg.hi IS NULL OR e.seq <= seg.hi)
    WHERE e.seq >= $2 AND ($3::bigint = 0 OR e.seq <= $3::bigint)
    ORDER BY e.seq
"""

_SESSION_COLUMNS: Final = (
    "uid, project, name, harness, model, labels, annotations, origin, identity, parent_uid, "
    "fork_seq, fence, compute_state, last_seq, created_at, updated_at, exec_projection, last_hash"
)


def _now_ns() -> int:
    return time.time_ns()


def _columns(rows: Sequence[StoredRecord]) -> tuple[list[Any], ...]:
    return (
        [r.session for r in rows],
        [r.seq for r in rows],
        [r.prev_hash for r in rows],
        [r.hash for r in rows],
        [r.fence for r in rows],
        [r.event for r in rows],
    )


class _Transaction(PostgresLiveStatements):
    """Statements on one pooled connection, inside its transaction."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def foreign_writes(self) -> bool:
        return True  # another host may have committed; heads are always read under the lock

    async def heads(self, uids: Sequence[str]) -> dict[str, SessionHead]:
        recs = await self._conn.fetch(
            """
            SELECT uid, fence, last_seq, last_hash, compute_state, deleted_at, exec_projection FROM sessions
            WHERE uid = ANY($1::text[]) ORDER BY uid FOR UPDATE
            """,
            list(uids),
        )
        out = {uid: SessionHead(uid) for uid in uids}
        for r in recs:
            uid = str(r["uid"])
            out[uid] = SessionHead(
                uid,
                True,
                r["deleted_at"] is not None,
                int(r["fence"]),
                str(r["compute_state"]),
                int(r["last_seq"]),
                str(r["last_hash"]),
                head_projection(r["exec_projection"]),
            )
        return out

    async def append_rows(
        self, rows: Sequence[StoredRecord], moved: Sequence[SessionHead], now_ns: int
    ) -> None:
        if not moved:
            if rows:
                await self._conn.execute(_INSERT_EVENTS, *_columns(rows))
            return
        await self._conn.execute(
            _APPEND_ROWS,
            *_columns(rows),
            [h.uid for h in moved],
            [h.seq for h in moved],
            [h.hash for h in moved],
            [h.compute_state for h in moved],
            now_ns,
            [h.fence for h in moved],
            [h.exec.encode() for h in moved],
        )

    async def insert_sessions(self, sessions: Sequence[NewSession]) -> None:
        columns = list(zip(*(session_values(s) for s in sessions), strict=True))
        await self._conn.execute(_INSERT_SESSIONS, *(list(c) for c in columns))

    async def insert_session_if_new(self, session: NewSession) -> bool:
        inserted = await self._conn.fetchval(
            _INSERT_SESSIONS + " ON CONFLICT (uid) DO NOTHING RETURNING uid",
            *([c] for c in session_values(session)),
        )
        return inserted is not None

    async def taken(self, uids: Sequence[str]) -> set[str]:
        recs = await self._conn.fetch("SELECT uid FROM sessions WHERE uid = ANY($1::text[])", list(uids))
        return {str(r["uid"]) for r in recs}

    async def live_row(self, uid: str) -> SessionRow | None:
        rec = await self._conn.fetchrow(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE uid = $1 AND deleted_at IS NULL FOR UPDATE", uid
        )
        return None if rec is None else _row_from_record(rec)

    async def mark_deleted(self, uid: str, now_ns: int) -> None:
        await self._conn.execute(
            "UPDATE sessions SET deleted_at = $2, updated_at = $2 WHERE uid = $1", uid, now_ns
        )

    async def purge(self, uid: str) -> None:
        conn = self._conn
        await _unshare(conn, uid)
        await conn.execute(
            "UPDATE sessions SET last_seq = 0, last_hash = '', base_uid = '', base_seq = 0, "
            "exec_projection = $2 WHERE uid = $1",
            uid,
            execstate.EMPTY.encode(),
        )
        await conn.execute("DELETE FROM events WHERE session = $1", uid)
        await conn.execute("DELETE FROM tool_receipts WHERE session = $1", uid)

    async def record_at(self, uid: str, seq: int) -> tuple[int, str] | None:
        rec = await self._conn.fetchrow(_RESOLVED, uid, seq, seq)
        return None if rec is None else (int(rec["seq"]), str(rec["hash"]))

    async def share_prefix(self, children: Sequence[str], parent_uid: str, at_seq: int) -> None:
        # A prefix that lies wholly in the parent's own base is taken from there, keeping base
        # chains short.
        await self._conn.execute(
            """
            UPDATE sessions AS c
            SET base_seq = $3::bigint,
                base_uid = CASE WHEN $3::bigint = 0 THEN ''
                                WHEN $3::bigint <= p.base_seq THEN p.base_uid
                                ELSE p.uid END
            FROM sessions AS p
            WHERE p.uid = $2 AND c.uid = ANY($1::text[])
            """,
            list(children),
            parent_uid,
            at_seq,
        )

    async def put_harness(self, name: str, registration: bytes, now_ns: int) -> None:
        await self._conn.execute(
            """
            INSERT INTO harnesses (name, registration, updated_at) VALUES ($1, $2, $3)
            ON CONFLICT (name) DO UPDATE
            SET registration = EXCLUDED.registration, updated_at = EXCLUDED.updated_at
            """,
            name,
            registration,
            now_ns,
        )

    async def touch_probe(self, now_ns: int) -> None:
        await self._conn.execute(
            """
            INSERT INTO journal_probe (id, written_at) VALUES (1, $1)
            ON CONFLICT (id) DO UPDATE SET written_at = EXCLUDED.written_at
            """,
            now_ns,
        )

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: bytes, now_ns: int) -> None:
        await self._conn.execute(
            """
            INSERT INTO tool_receipts (session, idempotency_key, result, created_at)
            VALUES ($1, $2, $3, $4) ON CONFLICT (session, idempotency_key) DO NOTHING
            """,
            uid,
            idempotency_key,
            result,
            now_ns,
        )


class _PostgresDialect:
    immediate: Final = False
    committed_mark: Final = None  # replicas write the same database at any moment

    def __init__(self, pool: Any, url: str, *, flushers: int, kept_listed: int = KEPT_LISTED) -> None:
        self.pool = pool
        self.url = url
        self.max_in_flight = max(1, flushers)
        self.listed: ListedRows[tuple[Any, ...]] = ListedRows(kept_listed)

    def change_mark(self) -> int | None:
        return None

    @contextlib.asynccontextmanager
    async def _conn(self, what: str) -> AsyncIterator[Any]:
        with _driver_errors(what):
            async with self.pool.acquire(timeout=COMMAND_TIMEOUT_S) as conn:
                yield conn

    async def transaction(self, body: Callable[[_Transaction], Awaitable[_T]]) -> _T:
        async with self.pool.acquire(timeout=COMMAND_TIMEOUT_S) as conn, conn.transaction():
            return await body(_Transaction(conn))

    def work_inline_while(self, quiet: Callable[[], bool]) -> None:
        pass  # asyncpg works on the event loop already

    def batch_failure(self, exc: Exception) -> BatchFailure:
        if isinstance(exc, StoreError):
            return BatchFailure(type(exc), str(exc))
        mapped = _driver_error("journal write", exc)
        if mapped is None:
            return BatchFailure(StoreError, f"journal write failed: {exc!r}")
        return BatchFailure(*mapped)

    async def get_row(self, uid: str) -> SessionRow | None:
        async with self._conn("get session") as conn:
            rec = await conn.fetchrow(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE uid = $1 AND deleted_at IS NULL", uid
            )
        return None if rec is None else _row_from_record(rec)

    async def list_rows(self, project: str, after: tuple[int, str] | None, limit: int) -> list[SessionRow]:
        async with self._conn("list sessions") as conn:
            if after is None:
                recs = await conn.fetch(
                    f"""
                    SELECT {_SESSION_COLUMNS} FROM sessions
                    WHERE project = $1 AND deleted_at IS NULL
                    ORDER BY created_at DESC, uid ASC LIMIT $2
                    """,
                    project,
                    limit,
                )
            else:
                recs = await conn.fetch(
                    f"""
                    SELECT {_SESSION_COLUMNS} FROM sessions
                    WHERE project = $1 AND deleted_at IS NULL
                      AND (created_at < $2 OR (created_at = $2 AND uid > $3))
                    ORDER BY created_at DESC, uid ASC LIMIT $4
                    """,
                    project,
                    after[0],
                    after[1],
                    limit,
                )
        # Keyed by the record's values: the same values are the same row (journal.listed).
        records = {tuple(r): r for r in recs}
        return self.listed.rows(
            [(key[0], key) for key in records],
            lambda missing: [_row_from_record(records[k], listed=True) for k in missing],
        )

    async def read(self, uid: str, from_seq: int, to_seq: int) -> list[common_pb2.LogRecord]:
        async with self._conn("read") as conn:
            recs = await conn.fetch(_RESOLVED, uid, from_seq, to_seq)
        return [_log_record(r) for r in recs]

    async def anchor(self, uid: str) -> tuple[int, str] | None:
        async with self._conn("head") as conn:
            rec = await conn.fetchrow("SELECT last_seq, last_hash FROM sessions WHERE uid = $1", uid)
        return None if rec is None else (int(rec["last_seq"]), str(rec["last_hash"]))

    async def verify_scan(self, uid: str, check: ChainCheck) -> tuple[int, str] | None:
        async with self._conn("verify") as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            rec = await conn.fetchrow("SELECT last_seq, last_hash FROM sessions WHERE uid = $1", uid)
            async for r in conn.cursor(_RESOLVED, uid, 1, 0, prefetch=VERIFY_CHUNK):
                check.feed(int(r["seq"]), str(r["prev_hash"]), str(r["hash"]), bytes(r["event"]))
        return None if rec is None else (int(rec["last_seq"]), str(rec["last_hash"]))

    async def session_uids(self) -> list[str]:
        async with self._conn("list session uids") as conn:
            recs = await conn.fetch(
                "SELECT uid FROM sessions UNION SELECT DISTINCT session FROM events ORDER BY 1"
            )
        return [str(r[0]) for r in recs]

    async def get_harness(self, name: str) -> bytes | None:
        async with self._conn("get harness") as conn:
            blob = await conn.fetchval("SELECT registration FROM harnesses WHERE name = $1", name)
        return None if blob is None else bytes(blob)

    async def list_harnesses(self) -> list[bytes]:
        async with self._conn("list harnesses") as conn:
            recs = await conn.fetch("SELECT registration FROM harnesses ORDER BY name")
        return [bytes(r["registration"]) for r in recs]

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> bytes | None:
        async with self._conn("get tool receipt") as conn:
            blob = await conn.fetchval(
                "SELECT result FROM tool_receipts WHERE session = $1 AND idempotency_key = $2",
                uid,
                idempotency_key,
            )
        return None if blob is None else bytes(blob)

    async def schema_version(self) -> int:
        async with self._conn("read schema version") as conn:
            return int(await conn.fetchval(f"SELECT max(version) FROM {_MIGRATIONS_TABLE}"))

    async def close(self) -> None:
        await asyncio.wait_for(self.pool.close(), timeout=COMMAND_TIMEOUT_S)


class PostgresStore(DialectStore):
    """JournalStore on PostgreSQL. Create with ``await PostgresStore.open(url)``."""

    def __init__(self, dialect: _PostgresDialect, *, max_batch: int) -> None:
        super().__init__(dialect, max_batch=max_batch)
        self._postgres = dialect
        # The connection URL (may carry a password: show redact_url(url) instead).
        self.url = dialect.url

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        pool_size: int = 10,
        flushers: int = DEFAULT_FLUSHERS,
        max_batch: int = DEFAULT_MAX_BATCH,
        migrate: bool = True,
        kept_listed: int = KEPT_LISTED,
    ) -> PostgresStore:
        """Connect, apply pending migrations (refusing a newer schema) and return the store.

        With ``migrate=False`` nothing is created or upgraded: a database without a journal, or
        with an older one, is refused (for read-only tooling such as ``journal verify``).
        ``kept_listed``: the listed rows kept decoded for the next listing (``journal.listed``;
        0: none)."""
        validate_postgres_url(url)
        shown = redact_url(url)
        try:
            pool = await asyncpg.create_pool(
                dsn=url,
                min_size=1,
                max_size=max(1, pool_size),
                timeout=CONNECT_TIMEOUT_S,
                command_timeout=COMMAND_TIMEOUT_S,
                reset=_reset_connection,
            )
        except (asyncpg.ClientConfigurationError, ValueError) as exc:
            raise PostgresURLError(f"malformed PostgreSQL URL {shown}: {exc}") from None
        except asyncpg.InvalidCatalogNameError as exc:
            raise StoreError(f"cannot open PostgreSQL journal {shown}: {exc}") from None
        except asyncpg.InvalidAuthorizationSpecificationError as exc:
            raise StoreError(f"cannot open PostgreSQL journal {shown}: {exc}") from None
        except asyncpg.PostgresError as exc:
            raise StoreError(f"cannot open PostgreSQL journal {shown}: {exc}") from None
        except (OSError, TimeoutError, asyncpg.InterfaceError) as exc:
            raise StoreError(
                f"cannot connect to PostgreSQL at {shown}: {exc or type(exc).__name__}"
            ) from None
        try:
            async with pool.acquire() as conn:
                await _migrate(conn, shown, apply=migrate)
                if migrate:
                    with _driver_errors(f"create the live tables of {shown}"):
                        await create_live_tables(conn)
        except BaseException:
            await pool.close()
            raise
        dialect = _PostgresDialect(pool, url, flushers=flushers, kept_listed=kept_listed)
        return cls(dialect, max_batch=max_batch)

    async def schema_version(self) -> int:
        """The newest applied migration version."""
        self._check_open("read schema version")
        return await self._postgres.schema_version()


async def _unshare(conn: Any, uid: str) -> None:
    """Before ``uid``'s own rows are dropped, copy the part each session based on it shares
    into that session, and rebase it onto ``uid``'s own base."""
    owner = await conn.fetchrow("SELECT base_uid, base_seq FROM sessions WHERE uid = $1", uid)
    dependents = await conn.fetch(
        "SELECT uid, base_seq FROM sessions WHERE base_uid = $1 ORDER BY uid FOR UPDATE", uid
    )
    if owner is None or not dependents:
        return
    own_from = int(owner["base_seq"])
    await conn.execute(
        """
        INSERT INTO events (session, seq, prev_hash, hash, fence, event)
        SELECT d.uid, e.seq, e.prev_hash, e.hash, e.fence, e.event
        FROM sessions AS d JOIN events AS e ON e.session = $1 AND e.seq > $2 AND e.seq <= d.base_seq
        WHERE d.base_uid = $1
        """,
        uid,
        own_from,
    )
    await conn.execute(
        """
        UPDATE sessions
        SET base_seq = LEAST(base_seq, $2),
            base_uid = CASE WHEN LEAST(base_seq, $2) > 0 THEN $3 ELSE '' END
        WHERE base_uid = $1
        """,
        uid,
        own_from,
        str(owner["base_uid"]),
    )


async def _reset_connection(conn: Any) -> None:
    """Pool release hook. The store never leaves session state behind (no SET, LISTEN,
    session advisory locks or open cursors), so asyncpg's full reset, a round trip on every
    release, is replaced by ending a transaction an interrupted caller left open."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def _migrate(conn: Any, shown: str, *, apply: bool) -> None:
    """Apply missing migrations in one transaction under an advisory lock (or, without
    ``apply``, only check that none are missing)."""
    what = f"migrate PostgreSQL journal {shown}"
    with _driver_errors(what):
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK_KEY)
            existing = {
                str(r["table_name"])
                for r in await conn.fetch(
                    """
                    SELECT table_name FROM information_schema.tables
                    WHERE table_schema = current_schema() AND table_name = ANY($1::text[])
                    """,
                    [_MIGRATIONS_TABLE, *_OUR_TABLES],
                )
            }
            if _MIGRATIONS_TABLE not in existing:
                clash = sorted(existing & set(_OUR_TABLES))
                if clash:
                    raise SchemaError(
                        f"{shown} is not an agentsessions journal: it has table(s) {', '.join(clash)} "
                        f"but no {_MIGRATIONS_TABLE}"
                    )
                if not apply:
                    raise SchemaError(
                        f"{shown} holds no agentsessions journal (no {_MIGRATIONS_TABLE} table)"
                    )
                await conn.execute(
                    f"""
                    CREATE TABLE {_MIGRATIONS_TABLE} (
                        version INTEGER PRIMARY KEY,
                        name TEXT NOT NULL,
                        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
                    )
                    """
                )
                applied: dict[int, str] = {}
            else:
                try:
                    applied = {
                        int(r["version"]): str(r["name"])
                        for r in await conn.fetch(f"SELECT version, name FROM {_MIGRATIONS_TABLE}")
                    }
                except asyncpg.UndefinedColumnError:
                    raise SchemaError(
                        f"{shown} is not an agentsessions journal: its {_MIGRATIONS_TABLE} table "
                        "has a different shape"
                    ) from None
            newest = max(applied, default=0)
            if newest > SCHEMA_VERSION:
                raise SchemaError(
                    f"unsupported database schema: {shown} is at journal schema version {newest}, "
                    f"this agentsessions understands up to {SCHEMA_VERSION}; upgrade agentsessions"
                )
            for migration in MIGRATIONS:
                known = applied.get(migration.version)
                if known is not None:
                    if known != migration.name:
                        raise SchemaError(
                            f"{shown} is not an agentsessions journal: migration {migration.version} "
                            f"is {known!r}, expected {migration.name!r}"
                        )
                    continue
                if not apply:
                    raise SchemaError(
                        f"{shown} is at journal schema version {newest}; version {migration.version} "
                        "is missing (open it with the host once to upgrade it)"
                    )
                for statement in migration.statements:
                    await conn.execute(statement)
                if migration.backfill is not None:
                    await migration.backfill(conn)
                await conn.execute(
                    f"INSERT INTO {_MIGRATIONS_TABLE} (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )


def _decode_map(value: Any) -> dict[str, str]:
    loaded = json.loads(value) if isinstance(value, str) else value
    return {str(k): str(v) for k, v in cast(Mapping[str, Any], loaded).items()}


def _row_from_record(rec: Any, *, listed: bool = False) -> SessionRow:
    """A session row from its columns; ``listed``: read for a listing (see execstate.decode)."""
    origin = None if rec["origin"] is None else common_pb2.Origin.FromString(rec["origin"])
    identity = None if rec["identity"] is None else common_pb2.IdentityRef.FromString(rec["identity"])
    return SessionRow(
        uid=str(rec["uid"]),
        project=str(rec["project"]),
        name=str(rec["name"]),
        harness=str(rec["harness"]),
        model=str(rec["model"]),
        labels=_decode_map(rec["labels"]),
        annotations=_decode_map(rec["annotations"]),
        origin=origin,
        identity=identity,
        parent_uid=str(rec["parent_uid"]),
        fork_seq=int(rec["fork_seq"]),
        create_time_ns=int(rec["created_at"]),
        update_time_ns=int(rec["updated_at"]),
        compute_state=str(rec["compute_state"]),
        last_seq=int(rec["last_seq"]),
        exec_projection=execstate.decode(rec["exec_projection"], keep=listed),
        last_hash=str(rec["last_hash"]),
    )


def _log_record(rec: Any) -> common_pb2.LogRecord:
    record = common_pb2.LogRecord(
        seq=rec["seq"], prev_hash=rec["prev_hash"], content_hash=rec["hash"], fence=rec["fence"]
    )
    record.event.ParseFromString(rec["event"])
    return record
