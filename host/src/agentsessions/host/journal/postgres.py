"""PostgreSQL journal store (asyncpg): several host processes may share one database.

Cross-process single-writer safety comes from the database, not from this process: every
append locks the session row (``SELECT ... FOR UPDATE``) before comparing the head and the
fence, and the ``(session, seq)`` primary key backs that up. Concurrent appends from this
process are grouped: one transaction per flush carries every queued append, so one commit
(one WAL flush) makes a whole batch durable.

A fork child does not copy its parent's prefix: its records 1..fork_seq are read through the
parent (spec 3.1 still holds for what ``read`` returns: identical records, identical hashes).
Purging a session first copies into its children the rows they share with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import asyncpg

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

__all__ = [
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "PostgresStore",
    "PostgresURLError",
    "redact_url",
    "validate_postgres_url",
]

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


@dataclass(frozen=True)
class _Migration:
    version: int
    name: str
    statements: tuple[str, ...]


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
)
SCHEMA_VERSION: Final = MIGRATIONS[-1].version


class PostgresURLError(StoreError, ValueError):
    """A journal URL that is not a usable PostgreSQL connection URL."""


def redact_url(url: str) -> str:
    """The URL with any password replaced, safe for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"{user}:***@{host}" + (f":{port}" if port is not None else "")
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def validate_postgres_url(url: str) -> str:
    """Check the shape of a ``postgres://`` / ``postgresql://`` URL; returns it unchanged.

    Raises PostgresURLError naming what is wrong; the message never echoes a password."""
    shown = redact_url(url)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise PostgresURLError(f"malformed PostgreSQL URL {shown}: {exc}") from None
    if parts.scheme not in ("postgres", "postgresql"):
        raise PostgresURLError(
            f"malformed PostgreSQL URL {shown}: scheme must be postgres:// or postgresql://"
        )
    try:
        port = parts.port
    except ValueError:
        raise PostgresURLError(
            f"malformed PostgreSQL URL {shown}: port is not a number in 1..65535"
        ) from None
    if port == 0:
        raise PostgresURLError(f"malformed PostgreSQL URL {shown}: port is not a number in 1..65535")
    query = urllib.parse.parse_qs(parts.query, keep_blank_values=True)
    if not parts.hostname and "host" not in query:
        raise PostgresURLError(f"malformed PostgreSQL URL {shown}: no host (use postgresql://HOST[:PORT]/DB)")
    database = parts.path.lstrip("/")
    if "/" in database:
        raise PostgresURLError(f"malformed PostgreSQL URL {shown}: database name may not contain '/'")
    if parts.fragment:
        raise PostgresURLError(f"malformed PostgreSQL URL {shown}: unexpected '#' fragment")
    return url


def _now_ns() -> int:
    return time.time_ns()


@contextlib.contextmanager
def _driver_errors(what: str) -> Iterator[None]:
    """Turn asyncpg/socket failures into typed store errors (never a raw driver error)."""
    try:
        yield
    except StoreError:
        raise
    except (asyncpg.DeadlockDetectedError, asyncpg.SerializationError) as exc:
        raise ConflictError(f"{what}: concurrent writer won ({exc.sqlstate})") from exc
    except asyncpg.UniqueViolationError as exc:
        raise ConflictError(f"{what}: a concurrent writer already wrote that row") from exc
    except asyncpg.UndefinedTableError as exc:
        raise SchemaError(f"{what}: journal tables are missing ({exc})") from exc
    except asyncpg.PostgresError as exc:
        raise StoreError(f"{what}: PostgreSQL error {exc.sqlstate}: {exc}") from exc
    except (OSError, asyncpg.InterfaceError, TimeoutError) as exc:
        raise StoreError(f"{what}: PostgreSQL unavailable: {exc}") from exc


@dataclass
class _PendingAppend:
    uid: str
    payloads: list[bytes]
    canonical: list[bytes]
    events: list[common_pb2.Event]
    expected_head: int
    fence: int
    future: asyncio.Future[list[common_pb2.LogRecord]]
    mint: bool = False


@dataclass
class _SessionState:
    """A locked session row as one flush sees it (updated as the flush applies appends)."""

    fence: int
    last_seq: int
    last_hash: str
    compute_state: str
    dirty: bool = False


@dataclass
class _Batch:
    rows_session: list[str] = field(default_factory=list)
    rows_seq: list[int] = field(default_factory=list)
    rows_prev: list[str] = field(default_factory=list)
    rows_hash: list[str] = field(default_factory=list)
    rows_fence: list[int] = field(default_factory=list)
    rows_event: list[bytes] = field(default_factory=list)

    def add(self, uid: str, record: common_pb2.LogRecord, payload: bytes) -> None:
        self.rows_session.append(uid)
        self.rows_seq.append(record.seq)
        self.rows_prev.append(record.prev_hash)
        self.rows_hash.append(record.content_hash)
        self.rows_fence.append(record.fence)
        self.rows_event.append(payload)


_INSERT_EVENTS: Final = """
    INSERT INTO events (session, seq, prev_hash, hash, fence, event)
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::bytea[])
"""

_APPEND_ROWS: Final = """
    WITH appended AS (
        INSERT INTO events (session, seq, prev_hash, hash, fence, event)
        SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::bytea[])
    )
    UPDATE sessions AS s
    SET last_seq = u.last_seq, last_hash = u.last_hash, compute_state = u.compute_state, updated_at = $11,
        fence = GREATEST(s.fence, u.fence)
    FROM unnest($7::text[], $8::bigint[], $9::text[], $10::text[], $12::bigint[])
        AS u(uid, last_seq, last_hash, compute_state, fence)
    WHERE s.uid = u.uid
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
    "fork_seq, fence, compute_state, last_seq, created_at, updated_at"
)


class PostgresStore:
    """JournalStore on PostgreSQL. Create with ``await PostgresStore.open(url)``."""

    def __init__(self, pool: Any, url: str, *, flushers: int, max_batch: int) -> None:
        self._pool = pool
        # The connection URL (may carry a password: show redact_url(url) instead).
        self.url = url
        self._flushers = max(1, flushers)
        self._max_batch = max(1, max_batch)
        self._queue: list[_PendingAppend] = []
        self._flushing = 0
        self._flush_tasks: set[asyncio.Task[None]] = set()
        self._flush_scheduled = False
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        pool_size: int = 10,
        flushers: int = DEFAULT_FLUSHERS,
        max_batch: int = DEFAULT_MAX_BATCH,
        migrate: bool = True,
    ) -> PostgresStore:
        """Connect, apply pending migrations (refusing a newer schema) and return the store.

        With ``migrate=False`` nothing is created or upgraded: a database without a journal, or
        with an older one, is refused (for read-only tooling such as ``journal verify``)."""
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
        store = cls(pool, url, flushers=flushers, max_batch=max_batch)
        try:
            async with pool.acquire() as conn:
                await _migrate(conn, shown, apply=migrate)
        except BaseException:
            await pool.close()
            raise
        return store

    async def close(self) -> None:
        """Wait for queued appends to flush, then close the pool."""
        if self._closed:
            return
        self._closed = True
        while self._queue or self._flush_tasks:
            self._start_flushes()
            await asyncio.gather(*list(self._flush_tasks), return_exceptions=True)
        await asyncio.wait_for(self._pool.close(), timeout=COMMAND_TIMEOUT_S)

    async def schema_version(self) -> int:
        """The newest applied migration version."""
        async with self._conn("read schema version") as conn:
            return int(await conn.fetchval(f"SELECT max(version) FROM {_MIGRATIONS_TABLE}"))

    @contextlib.asynccontextmanager
    async def _conn(self, what: str, *, flushing: bool = False) -> AsyncIterator[Any]:
        # A flush queued before close() still runs: close() waits for it.
        if self._closed and not flushing:
            raise StoreError(f"{what}: store is closed")
        with _driver_errors(what):
            async with self._pool.acquire(timeout=COMMAND_TIMEOUT_S) as conn:
                yield conn

    # -- session rows ------------------------------------------------------------------------

    async def create_session(self, row: SessionRow) -> SessionRow:
        now = _now_ns()
        created = row.create_time_ns or now
        updated = row.update_time_ns or created
        async with self._conn("create session") as conn:
            try:
                await conn.execute(
                    """
                    INSERT INTO sessions (uid, project, name, harness, model, labels, annotations,
                        origin, identity, parent_uid, fork_seq, created_at, updated_at)
                    VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9, $10, $11, $12, $13)
                    """,
                    *_row_params(row),
                    created,
                    updated,
                )
            except asyncpg.UniqueViolationError:
                raise SessionExistsError(f"session {row.uid} already exists") from None
        return dataclasses.replace(
            row, create_time_ns=created, update_time_ns=updated, compute_state=COMPUTE_NONE, last_seq=0
        )

    async def get_session(self, uid: str) -> SessionRow | None:
        async with self._conn("get session") as conn:
            rec = await conn.fetchrow(
                f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE uid = $1 AND deleted_at IS NULL", uid
            )
        return None if rec is None else _row_from_record(rec)

    async def list_sessions(
        self, project: str, page_size: int, page_token: str
    ) -> tuple[list[SessionRow], str]:
        size = clamp_page_size(page_size)
        async with self._conn("list sessions") as conn:
            if page_token:
                after_ns, after_uid = decode_page_token(page_token)
                recs = await conn.fetch(
                    f"""
                    SELECT {_SESSION_COLUMNS} FROM sessions
                    WHERE project = $1 AND deleted_at IS NULL
                      AND (created_at < $2 OR (created_at = $2 AND uid > $3))
                    ORDER BY created_at DESC, uid ASC LIMIT $4
                    """,
                    project,
                    after_ns,
                    after_uid,
                    size + 1,
                )
            else:
                recs = await conn.fetch(
                    f"""
                    SELECT {_SESSION_COLUMNS} FROM sessions
                    WHERE project = $1 AND deleted_at IS NULL
                    ORDER BY created_at DESC, uid ASC LIMIT $2
                    """,
                    project,
                    size + 1,
                )
        rows = [_row_from_record(r) for r in recs[:size]]
        token = ""
        if len(recs) > size:
            last = rows[-1]
            token = encode_page_token(last.create_time_ns, last.uid)
        return rows, token

    async def delete_session(self, uid: str, *, purge: bool) -> SessionRow:
        async with self._conn("delete session") as conn, conn.transaction():
            rec = await conn.fetchrow(
                f"""
                UPDATE sessions SET deleted_at = $2, updated_at = $2
                WHERE uid = $1 AND deleted_at IS NULL
                RETURNING {_SESSION_COLUMNS}
                """,
                uid,
                _now_ns(),
            )
            if rec is None:
                raise SessionNotFoundError(f"session {uid} not found")
            if purge:
                await _unshare(conn, uid)
                await conn.execute(
                    "UPDATE sessions SET last_seq = 0, last_hash = '', base_uid = '', base_seq = 0 "
                    "WHERE uid = $1",
                    uid,
                )
                await conn.execute("DELETE FROM events WHERE session = $1", uid)
                await conn.execute("DELETE FROM tool_receipts WHERE session = $1", uid)
        return _row_from_record(rec)

    async def new_fence(self, uid: str, expected_head: int | None = None) -> int:
        now = _now_ns()
        if expected_head is not None:
            async with self._conn("new fence") as conn:
                # The row lock orders this mint against appends, which lock the same row.
                value = await conn.fetchval(
                    """
                    UPDATE sessions SET fence = fence + 1 WHERE uid = $1 AND last_seq = $2
                    RETURNING fence
                    """,
                    uid,
                    expected_head,
                )
                if value is not None:
                    return int(value)
                head = await conn.fetchval("SELECT last_seq FROM sessions WHERE uid = $1", uid)
            if head is not None or expected_head != 0:
                raise ConflictError(
                    f"expected head {expected_head} does not match head {head or 0} of session {uid}"
                )
        async with self._conn("new fence") as conn:
            value = await conn.fetchval(
                """
                INSERT INTO sessions (uid, fence, created_at, updated_at) VALUES ($1, 1, $2, $2)
                ON CONFLICT (uid) DO UPDATE SET fence = sessions.fence + 1
                RETURNING fence
                """,
                uid,
                now,
            )
        return int(value)

    # -- append (group commit) ---------------------------------------------------------------

    async def append(
        self,
        uid: str,
        events: Sequence[common_pb2.Event],
        *,
        expected_head: int,
        fence: int,
        mint_fence: bool = False,
    ) -> list[common_pb2.LogRecord]:
        if self._closed:
            raise StoreError("append: store is closed")
        normalized = [normalize_event(e) for e in events]
        # Serialization and the canonical form need no lock: done here, only chaining is batched.
        pending = _PendingAppend(
            uid=uid,
            payloads=[e.SerializeToString(deterministic=True) for e in normalized],
            canonical=[canonical_event(e) for e in normalized],
            events=normalized,
            expected_head=expected_head,
            fence=fence,
            future=asyncio.get_running_loop().create_future(),
            mint=mint_fence,
        )
        self._queue.append(pending)
        self._schedule_flush()
        return await pending.future

    def _schedule_flush(self) -> None:
        # Deferred by one loop turn: writers woken by the previous flush queue their next
        # appends first, so a free flusher takes them all in one transaction.
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._start_flushes)

    def _start_flushes(self) -> None:
        self._flush_scheduled = False
        while self._queue and self._flushing < self._flushers:
            batch = self._queue[: self._max_batch]
            del self._queue[: self._max_batch]
            self._flushing += 1
            task = asyncio.get_running_loop().create_task(self._flush(batch))
            self._flush_tasks.add(task)
            task.add_done_callback(self._flush_done)

    def _flush_done(self, task: asyncio.Task[None]) -> None:
        self._flush_tasks.discard(task)
        self._flushing -= 1
        if self._queue:
            self._schedule_flush()

    async def _flush(self, batch: list[_PendingAppend]) -> None:
        try:
            outcomes = await self._commit_batch(batch)
        except (ConflictError, StoreError) as exc:
            if len(batch) > 1 and isinstance(exc.__cause__, _RETRYABLE):
                # A batch-wide failure the database rolled back: retry alone so one bad
                # append cannot fail its neighbours.
                for pending in batch:
                    try:
                        single = await self._commit_batch([pending])
                    except BaseException as one_exc:
                        _settle(pending, one_exc)
                    else:
                        _settle(pending, single[0])
                return
            for pending in batch:
                _settle(pending, exc)
            return
        except BaseException as exc:
            for pending in batch:
                _settle(pending, exc)
            if not isinstance(exc, Exception):
                raise
            return
        for pending, outcome in zip(batch, outcomes, strict=True):
            _settle(pending, outcome)

    async def _commit_batch(
        self, batch: list[_PendingAppend]
    ) -> list[list[common_pb2.LogRecord] | BaseException]:
        outcomes: list[list[common_pb2.LogRecord] | BaseException] = []
        uids = sorted({p.uid for p in batch})
        now = _now_ns()
        async with self._conn("append", flushing=True) as conn, conn.transaction():
            recs = await conn.fetch(
                """
                SELECT uid, fence, last_seq, last_hash, compute_state, deleted_at FROM sessions
                WHERE uid = ANY($1::text[]) ORDER BY uid FOR UPDATE
                """,
                uids,
            )
            states: dict[str, _SessionState] = {}
            deleted: set[str] = set()
            for r in recs:
                if r["deleted_at"] is not None:
                    deleted.add(r["uid"])
                states[r["uid"]] = _SessionState(
                    fence=r["fence"],
                    last_seq=r["last_seq"],
                    last_hash=r["last_hash"],
                    compute_state=r["compute_state"],
                )
            rows = _Batch()
            for pending in batch:
                state = states.get(pending.uid)
                if state is None or pending.uid in deleted:
                    outcomes.append(SessionNotFoundError(f"session {pending.uid} not found"))
                    continue
                if pending.expected_head != state.last_seq:
                    outcomes.append(
                        ConflictError(
                            f"expected_last_seq {pending.expected_head} does not match head "
                            f"{state.last_seq} of session {pending.uid}"
                        )
                    )
                    continue
                fence = pending.fence
                if pending.mint:
                    fence = state.fence + 1
                    state.fence, state.dirty = fence, True
                elif fence < state.fence:
                    outcomes.append(
                        FencedError(
                            f"fence {pending.fence} is superseded by fence {state.fence} "
                            f"of session {pending.uid}"
                        )
                    )
                    continue
                records: list[common_pb2.LogRecord] = []
                for event, payload, canonical in zip(
                    pending.events, pending.payloads, pending.canonical, strict=True
                ):
                    seq = state.last_seq + 1
                    digest = chain_hash(canonical, state.last_hash, seq)
                    record = common_pb2.LogRecord(
                        seq=seq,
                        prev_hash=state.last_hash,
                        content_hash=digest,
                        fence=fence,
                    )
                    record.event.CopyFrom(event)
                    rows.add(pending.uid, record, payload)
                    records.append(record)
                    state.last_seq = seq
                    state.last_hash = digest
                    state.compute_state = project_compute_state(state.compute_state, event)
                    state.dirty = True
                outcomes.append(records)
            if any(s.dirty for s in states.values()):
                touched = [(u, s) for u, s in states.items() if s.dirty]
                # One round trip writes the records and moves the heads.
                await conn.execute(
                    _APPEND_ROWS,
                    rows.rows_session,
                    rows.rows_seq,
                    rows.rows_prev,
                    rows.rows_hash,
                    rows.rows_fence,
                    rows.rows_event,
                    [u for u, _ in touched],
                    [s.last_seq for _, s in touched],
                    [s.last_hash for _, s in touched],
                    [s.compute_state for _, s in touched],
                    now,
                    [s.fence for _, s in touched],
                )
        return outcomes

    # -- reads -------------------------------------------------------------------------------

    async def read(self, uid: str, from_seq: int = 1, to_seq: int = 0) -> list[common_pb2.LogRecord]:
        start = max(1, from_seq)
        async with self._conn("read") as conn:
            recs = await conn.fetch(_RESOLVED, uid, start, max(0, to_seq))
        return [_log_record(r) for r in recs]

    async def head(self, uid: str) -> Head:
        async with self._conn("head") as conn:
            rec = await conn.fetchrow("SELECT last_seq, last_hash FROM sessions WHERE uid = $1", uid)
        if rec is None:
            return Head(seq=0, hash="")
        return Head(seq=int(rec["last_seq"]), hash=str(rec["last_hash"]))

    async def verify(self, uid: str) -> int:
        checked = 0
        prev = ""
        async with self._conn("verify") as conn, conn.transaction(isolation="repeatable_read", readonly=True):
            head = await conn.fetchrow("SELECT last_seq, last_hash FROM sessions WHERE uid = $1", uid)
            cursor = conn.cursor(_RESOLVED, uid, 1, 0, prefetch=VERIFY_CHUNK)
            async for r in cursor:
                seq = int(r["seq"])
                checked += 1
                if seq != checked:
                    raise TamperedError(uid, checked, f"seq {checked} is missing (next stored seq is {seq})")
                if r["prev_hash"] != prev:
                    raise TamperedError(uid, seq, "prev_hash does not link to the previous record")
                try:
                    event = common_pb2.Event.FromString(r["event"])
                except Exception:
                    raise TamperedError(uid, seq, "stored event does not decode") from None
                if content_hash(event, prev, seq) != r["hash"]:
                    raise TamperedError(uid, seq, "content_hash does not match the recomputed hash")
                prev = r["hash"]
        if head is not None and (int(head["last_seq"]), str(head["last_hash"])) != (checked, prev):
            raise TamperedError(
                uid,
                checked + 1 if int(head["last_seq"]) > checked else int(head["last_seq"]),
                f"session head says seq {head['last_seq']} but the journal ends at seq {checked}",
            )
        return checked

    # -- fork --------------------------------------------------------------------------------

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
        now = _now_ns()
        marker = normalize_event(marker)
        marker_payload = marker.SerializeToString(deterministic=True)
        async with self._conn("fork") as conn, conn.transaction():
            # FOR SHARE: the parent cannot be deleted or purged while children come to share
            # its prefix (appends beyond at_seq do not matter: the prefix never changes).
            parent = await conn.fetchrow(
                """
                SELECT last_seq, base_uid, base_seq FROM sessions
                WHERE uid = $1 AND deleted_at IS NULL FOR SHARE
                """,
                parent_uid,
            )
            if parent is None:
                raise SessionNotFoundError(f"session {parent_uid} not found")
            head = int(parent["last_seq"])
            if at_seq < 0 or at_seq > head:
                raise ConflictError(f"fork at_seq {at_seq} is beyond head {head} of session {parent_uid}")
            prev = ""
            if at_seq > 0:
                found = await conn.fetchrow(_RESOLVED, parent_uid, at_seq, at_seq)
                if found is None:
                    raise TamperedError(parent_uid, at_seq, "record is missing")
                prev = str(found["hash"])
            # Children share the prefix instead of copying it. A prefix that lies wholly in
            # the parent's own base is taken from there, keeping base chains short.
            base_uid = parent_uid
            if 0 < at_seq <= int(parent["base_seq"]):
                base_uid = str(parent["base_uid"])
            if at_seq == 0:
                base_uid = ""
            marker_seq = at_seq + 1
            digest = chain_hash(canonical_event(marker), prev, marker_seq)
            marker_state = project_compute_state(COMPUTE_NONE, marker)
            taken = await conn.fetchval("SELECT uid FROM sessions WHERE uid = ANY($1::text[]) LIMIT 1", uids)
            if taken is not None:
                raise SessionExistsError(f"session {taken} already exists")
            stored = [
                dataclasses.replace(
                    child,
                    parent_uid=parent_uid,
                    fork_seq=at_seq,
                    create_time_ns=child.create_time_ns or now,
                    update_time_ns=now,
                    compute_state=marker_state,
                    last_seq=marker_seq,
                )
                for child in children
            ]
            columns = list(zip(*(_row_params(r) for r in stored), strict=True))
            try:
                await conn.execute(
                    """
                    INSERT INTO sessions (uid, project, name, harness, model, labels, annotations,
                        origin, identity, parent_uid, fork_seq, created_at, updated_at,
                        compute_state, last_seq, last_hash, base_uid, base_seq)
                    SELECT u.*, $13, $14, $15, $16, $17, $18 FROM unnest(
                        $1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::jsonb[],
                        $7::jsonb[], $8::bytea[], $9::bytea[], $10::text[], $11::bigint[], $12::bigint[]
                    ) AS u
                    """,
                    *(list(c) for c in columns),
                    [r.create_time_ns for r in stored],
                    now,
                    marker_state,
                    marker_seq,
                    digest,
                    base_uid,
                    at_seq,
                )
            except asyncpg.UniqueViolationError:
                raise SessionExistsError("a fork child uid was taken concurrently") from None
            n = len(uids)
            await conn.execute(
                _INSERT_EVENTS,
                uids,
                [marker_seq] * n,
                [prev] * n,
                [digest] * n,
                [0] * n,
                [marker_payload] * n,
            )
        return stored

    # -- harness registry --------------------------------------------------------------------

    async def put_harness(self, registration: harness_registry_pb2.HarnessRegistration) -> None:
        name = registration.metadata.name
        if not name:
            raise StoreError("put_harness: registration has no metadata.name")
        async with self._conn("put harness") as conn:
            await conn.execute(
                """
                INSERT INTO harnesses (name, registration, updated_at) VALUES ($1, $2, $3)
                ON CONFLICT (name) DO UPDATE
                SET registration = EXCLUDED.registration, updated_at = EXCLUDED.updated_at
                """,
                name,
                registration.SerializeToString(deterministic=True),
                _now_ns(),
            )

    async def get_harness(self, name: str) -> harness_registry_pb2.HarnessRegistration | None:
        async with self._conn("get harness") as conn:
            blob = await conn.fetchval("SELECT registration FROM harnesses WHERE name = $1", name)
        if blob is None:
            return None
        return harness_registry_pb2.HarnessRegistration.FromString(blob)

    async def list_harnesses(self) -> list[harness_registry_pb2.HarnessRegistration]:
        async with self._conn("list harnesses") as conn:
            recs = await conn.fetch("SELECT registration FROM harnesses ORDER BY name")
        return [harness_registry_pb2.HarnessRegistration.FromString(r["registration"]) for r in recs]

    # -- tool receipts -----------------------------------------------------------------------

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> common_pb2.ToolResult | None:
        async with self._conn("get tool receipt") as conn:
            blob = await conn.fetchval(
                "SELECT result FROM tool_receipts WHERE session = $1 AND idempotency_key = $2",
                uid,
                idempotency_key,
            )
        return None if blob is None else common_pb2.ToolResult.FromString(blob)

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: common_pb2.ToolResult) -> None:
        async with self._conn("put tool receipt") as conn:
            await conn.execute(
                """
                INSERT INTO tool_receipts (session, idempotency_key, result, created_at)
                VALUES ($1, $2, $3, $4) ON CONFLICT (session, idempotency_key) DO NOTHING
                """,
                uid,
                idempotency_key,
                result.SerializeToString(deterministic=True),
                _now_ns(),
            )

    # -- tooling -----------------------------------------------------------------------------

    async def session_uids(self) -> list[str]:
        async with self._conn("list session uids") as conn:
            recs = await conn.fetch(
                "SELECT uid FROM sessions UNION SELECT DISTINCT session FROM events ORDER BY 1"
            )
        return [str(r[0]) for r in recs]

    async def import_records(self, row: SessionRow, records: Sequence[common_pb2.LogRecord]) -> SessionRow:
        """Create ``row`` holding ``records`` verbatim (stored hashes and fences), atomically.

        The caller verifies the chain first; this only checks that seqs run 1..n and link."""
        state, max_fence = imported_chain_state(row.uid, records)
        now = _now_ns()
        created = row.create_time_ns or now
        async with self._conn("import") as conn, conn.transaction():
            try:
                await conn.execute(
                    """
                    INSERT INTO sessions (uid, project, name, harness, model, labels, annotations,
                        origin, identity, parent_uid, fork_seq, created_at, updated_at,
                        compute_state, last_seq, last_hash, fence)
                    VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9, $10, $11, $12, $13,
                        $14, $15, $16, $17)
                    """,
                    *_row_params(row),
                    created,
                    now,
                    state,
                    len(records),
                    records[-1].content_hash if records else "",
                    max_fence,
                )
            except asyncpg.UniqueViolationError:
                raise SessionExistsError(f"session {row.uid} already exists") from None
            if records:
                await conn.execute(
                    _INSERT_EVENTS,
                    [row.uid] * len(records),
                    [r.seq for r in records],
                    [r.prev_hash for r in records],
                    [r.content_hash for r in records],
                    [r.fence for r in records],
                    [r.event.SerializeToString(deterministic=True) for r in records],
                )
        return dataclasses.replace(
            row, create_time_ns=created, update_time_ns=now, compute_state=state, last_seq=len(records)
        )


_RETRYABLE: Final = (
    asyncpg.UniqueViolationError,
    asyncpg.DeadlockDetectedError,
    asyncpg.SerializationError,
)


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


def _settle(pending: _PendingAppend, outcome: list[common_pb2.LogRecord] | BaseException) -> None:
    if pending.future.done():
        return
    if isinstance(outcome, BaseException):
        pending.future.set_exception(outcome)
    else:
        pending.future.set_result(outcome)


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
                await conn.execute(
                    f"INSERT INTO {_MIGRATIONS_TABLE} (version, name) VALUES ($1, $2)",
                    migration.version,
                    migration.name,
                )


def _json_map(value: Mapping[str, str]) -> str:
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"))


def _row_params(row: SessionRow) -> tuple[Any, ...]:
    return (
        row.uid,
        row.project,
        row.name,
        row.harness,
        row.model,
        _json_map(row.labels),
        _json_map(row.annotations),
        None if row.origin is None else row.origin.SerializeToString(deterministic=True),
        None if row.identity is None else row.identity.SerializeToString(deterministic=True),
        row.parent_uid,
        row.fork_seq,
    )


def _decode_map(value: Any) -> dict[str, str]:
    loaded = json.loads(value) if isinstance(value, str) else value
    return {str(k): str(v) for k, v in cast(Mapping[str, Any], loaded).items()}


def _row_from_record(rec: Any) -> SessionRow:
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
    )


def _log_record(rec: Any) -> common_pb2.LogRecord:
    record = common_pb2.LogRecord(
        seq=rec["seq"], prev_hash=rec["prev_hash"], content_hash=rec["hash"], fence=rec["fence"]
    )
    record.event.ParseFromString(rec["event"])
    return record
