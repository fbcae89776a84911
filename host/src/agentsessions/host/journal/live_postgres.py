"""The live tables (``agentsessions.host.journal.live``) of the PostgreSQL dialect, and the
listener that tells this host what the others committed.

The tables, and the triggers that announce changes, are created when the store opens, under an
advisory lock (``CREATE TABLE IF NOT EXISTS``: not part of the journal's schema version). The
triggers ``pg_notify`` on channel ``agentsessions_live`` when a transaction commits:

* ``j:<uid>:<seq>`` a session's head moved (an append, a fork child created);
* ``d:<uid>`` a session was deleted;
* ``q:<uid>`` a turn was queued on it or left its queue;
* ``c:<uid>:<execution_id>`` someone asked the owner of a lease to cancel its execution.

:class:`PostgresListener` holds one connection of its own that LISTENs and feeds what it hears to
the store's ``JournalFeed``; when the connection drops it connects again (followers meanwhile fall
back to reading the journal on their own).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Final

import asyncpg

from agentsessions.host.journal.feed import JournalFeed
from agentsessions.host.journal.live import PARKED, RETRY, RUNNING, KeyRecord, Lease, QueuedTurn
from agentsessions.host.journal.sqlrows import (
    KEY_COLUMNS,
    LEASE_COLUMNS,
    QUEUE_COLUMNS,
    key_of,
    key_row,
    lease_of,
    lease_row,
    queued_of,
)

__all__ = ["CHANNEL", "PostgresListener", "PostgresLiveStatements", "create_live_tables"]

log = logging.getLogger("agentsessions.journal")

CHANNEL: Final = "agentsessions_live"
_LOCK_KEY: Final = 0x61676E746C697665  # "agntlive"
RECONNECT_S: Final = 1.0
CONNECT_TIMEOUT_S: Final = 10.0

_TABLES: Final = (
    """
    CREATE TABLE IF NOT EXISTS live_leases (
        session TEXT NOT NULL,
        execution_id TEXT NOT NULL,
        state TEXT NOT NULL,
        owner TEXT NOT NULL DEFAULT '',
        expires_at BIGINT NOT NULL DEFAULT 0,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at BIGINT NOT NULL DEFAULT 0,
        seen_seq BIGINT NOT NULL DEFAULT 0,
        last_error TEXT NOT NULL DEFAULT '',
        cancel_reason TEXT,
        updated_at BIGINT NOT NULL,
        PRIMARY KEY (session, execution_id)
    )
    """,
    "CREATE INDEX IF NOT EXISTS live_leases_owner ON live_leases (owner)",
    """
    CREATE TABLE IF NOT EXISTS live_idempotency (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        method TEXT NOT NULL,
        digest TEXT NOT NULL,
        state TEXT NOT NULL,
        session TEXT NOT NULL DEFAULT '',
        execution_id TEXT NOT NULL DEFAULT '',
        result TEXT NOT NULL DEFAULT '',
        created_at BIGINT NOT NULL,
        expires_at BIGINT NOT NULL,
        PRIMARY KEY (scope, key)
    )
    """,
    "CREATE INDEX IF NOT EXISTS live_idempotency_expiry ON live_idempotency (expires_at)",
    """
    CREATE TABLE IF NOT EXISTS live_queue (
        session TEXT NOT NULL,
        position BIGINT NOT NULL,
        execution_id TEXT NOT NULL UNIQUE,
        request BYTEA NOT NULL,
        submitter TEXT NOT NULL DEFAULT '',
        created_at BIGINT NOT NULL,
        PRIMARY KEY (session, position)
    )
    """,
    f"""
    CREATE OR REPLACE FUNCTION agentsessions_live_session_changed() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.deleted_at IS NOT NULL THEN
            IF TG_OP = 'INSERT' OR OLD.deleted_at IS NULL THEN
                PERFORM pg_notify('{CHANNEL}', 'd:' || NEW.uid);
            END IF;
        ELSIF TG_OP = 'INSERT' OR NEW.last_seq <> OLD.last_seq THEN
            PERFORM pg_notify('{CHANNEL}', 'j:' || NEW.uid || ':' || NEW.last_seq);
        END IF;
        RETURN NULL;
    END $$
    """,
    f"""
    CREATE OR REPLACE FUNCTION agentsessions_live_queue_changed() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            PERFORM pg_notify('{CHANNEL}', 'q:' || OLD.session);
        ELSE
            PERFORM pg_notify('{CHANNEL}', 'q:' || NEW.session);
        END IF;
        RETURN NULL;
    END $$
    """,
    f"""
    CREATE OR REPLACE FUNCTION agentsessions_live_cancel_requested() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        PERFORM pg_notify('{CHANNEL}', 'c:' || NEW.session || ':' || NEW.execution_id);
        RETURN NULL;
    END $$
    """,
)

# (name, table, definition) of each trigger, created when missing (never dropped and recreated,
# which would lock the sessions table while other hosts write).
_TRIGGERS: Final = (
    (
        "agentsessions_live_sessions",
        "sessions",
        "AFTER INSERT OR UPDATE OF last_seq, deleted_at ON sessions "
        "FOR EACH ROW EXECUTE FUNCTION agentsessions_live_session_changed()",
    ),
    (
        "agentsessions_live_queue",
        "live_queue",
        "AFTER INSERT OR DELETE ON live_queue "
        "FOR EACH ROW EXECUTE FUNCTION agentsessions_live_queue_changed()",
    ),
    (
        "agentsessions_live_cancel",
        "live_leases",
        "AFTER INSERT OR UPDATE ON live_leases FOR EACH ROW "
        "WHEN (NEW.cancel_reason IS NOT NULL) EXECUTE FUNCTION agentsessions_live_cancel_requested()",
    ),
)


async def create_live_tables(conn: Any) -> None:
    """The live tables and their triggers, if they are not there yet (one transaction, under an
    advisory lock so concurrent first opens do not race)."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        for statement in _TABLES:
            await conn.execute(statement)
        for name, table, definition in _TRIGGERS:
            exists = await conn.fetchval(
                "SELECT 1 FROM pg_trigger WHERE tgname = $1 AND tgrelid = to_regclass($2)", name, table
            )
            if exists is None:
                await conn.execute(f"CREATE TRIGGER {name} {definition}")


def _leases(recs: Sequence[Any]) -> list[Lease]:
    return [lease_of(r) for r in recs]


class PostgresLiveStatements:
    """Mixed into the PostgreSQL dialect's transaction (whose pooled connection is ``_conn``)."""

    _conn: Any

    async def lease_get(self, uid: str, execution_id: str) -> Lease | None:
        rec = await self._conn.fetchrow(
            f"SELECT {LEASE_COLUMNS} FROM live_leases WHERE session = $1 AND execution_id = $2 FOR UPDATE",
            uid,
            execution_id,
        )
        return None if rec is None else lease_of(rec)

    async def lease_put(self, lease: Lease, now_ns: int) -> None:
        await self._conn.execute(
            f"""
            INSERT INTO live_leases ({LEASE_COLUMNS}, updated_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
            ON CONFLICT (session, execution_id) DO UPDATE SET
                state = EXCLUDED.state, owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at,
                attempts = EXCLUDED.attempts, next_at = EXCLUDED.next_at, seen_seq = EXCLUDED.seen_seq,
                last_error = EXCLUDED.last_error, cancel_reason = EXCLUDED.cancel_reason,
                updated_at = EXCLUDED.updated_at
            """,
            *lease_row(lease, now_ns),
        )

    async def lease_add(self, lease: Lease, now_ns: int) -> bool:
        inserted = await self._conn.fetchval(
            f"""
            INSERT INTO live_leases ({LEASE_COLUMNS}, updated_at)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
            ON CONFLICT (session, execution_id) DO NOTHING RETURNING 1
            """,
            *lease_row(lease, now_ns),
        )
        return inserted is not None

    async def lease_delete(self, uid: str, execution_id: str) -> None:
        await self._conn.execute(
            "DELETE FROM live_leases WHERE session = $1 AND execution_id = $2", uid, execution_id
        )

    async def lease_drop(self, uid: str, execution_id: str, owner: str) -> bool:
        status = await self._conn.execute(
            "DELETE FROM live_leases WHERE session = $1 AND execution_id = $2 AND owner IN ($3, '')",
            uid,
            execution_id,
            owner,
        )
        return str(status) != "DELETE 0"

    async def leases_of(self, uid: str) -> list[Lease]:
        recs = await self._conn.fetch(
            f"SELECT {LEASE_COLUMNS} FROM live_leases WHERE session = $1 ORDER BY execution_id", uid
        )
        return _leases(recs)

    async def lease_renew(self, owner: str, expires_at_ns: int, now_ns: int) -> list[Lease]:
        recs = await self._conn.fetch(
            f"""
            UPDATE live_leases SET expires_at = $1, updated_at = $2 WHERE owner = $3 AND state = $4
            RETURNING {LEASE_COLUMNS}
            """,
            expires_at_ns,
            now_ns,
            owner,
            RUNNING,
        )
        return _leases(recs)

    async def lease_candidates(self, now_ns: int, local_prefix: str, limit: int) -> list[Lease]:
        columns = ", ".join(f"l.{c.strip()}" for c in LEASE_COLUMNS.split(","))
        recs = await self._conn.fetch(
            f"""
            SELECT {columns} FROM live_leases AS l LEFT JOIN sessions AS s ON s.uid = l.session
            WHERE (l.state = $1 AND (l.expires_at < $2 OR left(l.owner, length($3)) = $3))
               OR (l.state = $4 AND l.next_at <= $2)
               OR (l.state = $5 AND (s.uid IS NULL OR s.deleted_at IS NOT NULL OR s.last_seq <> l.seen_seq))
               OR l.state NOT IN ($1, $4, $5)
            ORDER BY l.updated_at LIMIT $6
            """,
            RUNNING,
            now_ns,
            local_prefix,
            RETRY,
            PARKED,
            limit,
        )
        return _leases(recs)

    async def key_get(self, scope: str, key: str) -> KeyRecord | None:
        rec = await self._conn.fetchrow(
            f"SELECT {KEY_COLUMNS} FROM live_idempotency WHERE scope = $1 AND key = $2 FOR UPDATE",
            scope,
            key,
        )
        return None if rec is None else key_of(rec)

    async def key_put(self, record: KeyRecord) -> None:
        await self._conn.execute(
            f"""
            INSERT INTO live_idempotency ({KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
            ON CONFLICT (scope, key) DO UPDATE SET
                method = EXCLUDED.method, digest = EXCLUDED.digest, state = EXCLUDED.state,
                session = EXCLUDED.session, execution_id = EXCLUDED.execution_id,
                result = EXCLUDED.result, created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at
            """,
            *key_row(record),
        )

    async def key_add(self, record: KeyRecord, now_ns: int) -> KeyRecord | None:
        # A concurrent insert of the same key waits here until that transaction ends.
        inserted = await self._conn.fetchval(
            f"""
            INSERT INTO live_idempotency ({KEY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
            ON CONFLICT (scope, key) DO NOTHING RETURNING 1
            """,
            *key_row(record),
        )
        if inserted is not None:
            return None
        found = await self.key_get(record.scope, record.key)  # locked now
        if found is not None and found.expires_at_ns > now_ns:
            return found
        await self.key_put(record)
        return None

    async def key_delete(self, scope: str, key: str) -> None:
        await self._conn.execute("DELETE FROM live_idempotency WHERE scope = $1 AND key = $2", scope, key)

    async def key_purge(self, now_ns: int) -> int:
        status = await self._conn.execute("DELETE FROM live_idempotency WHERE expires_at <= $1", now_ns)
        return int(str(status).rpartition(" ")[2] or 0)

    async def queue_list(self, uid: str) -> list[QueuedTurn]:
        recs = await self._conn.fetch(
            f"SELECT {QUEUE_COLUMNS} FROM live_queue WHERE session = $1 ORDER BY position", uid
        )
        return [queued_of(r) for r in recs]

    async def queue_insert(
        self, uid: str, execution_id: str, request: bytes, submitter: str, now_ns: int
    ) -> QueuedTurn:
        # The session's row lock orders concurrent inserts into one session's queue.
        await self._conn.execute("SELECT 1 FROM sessions WHERE uid = $1 FOR UPDATE", uid)
        last = await self._conn.fetchval(
            "SELECT COALESCE(MAX(position), 0) FROM live_queue WHERE session = $1", uid
        )
        entry = QueuedTurn(uid, int(last) + 1, execution_id, request, submitter, now_ns)
        await self._conn.execute(
            f"INSERT INTO live_queue ({QUEUE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6)",
            entry.session,
            entry.position,
            entry.execution_id,
            entry.request,
            submitter,
            now_ns,
        )
        return entry

    async def queue_delete(self, uid: str, execution_id: str) -> bool:
        status = await self._conn.execute(
            "DELETE FROM live_queue WHERE session = $1 AND execution_id = $2", uid, execution_id
        )
        return str(status) != "DELETE 0"

    async def queue_idle_sessions(self, limit: int) -> list[str]:
        recs = await self._conn.fetch(
            """
            SELECT DISTINCT q.session FROM live_queue AS q
            WHERE NOT EXISTS (SELECT 1 FROM live_leases AS l WHERE l.session = q.session)
            ORDER BY q.session LIMIT $1
            """,
            limit,
        )
        return [str(r["session"]) for r in recs]


class PostgresListener:
    """LISTEN on one connection of its own; what it hears goes to ``feed``."""

    def __init__(self, url: str, feed: JournalFeed) -> None:
        self._url = url
        self._feed = feed
        self._task: asyncio.Task[None] | None = None
        self._conn: Any = None
        self.connected = asyncio.Event()
        self.heard = 0  # notifications received (for diagnostics and tests)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep_listening())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self.connected.clear()
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), CONNECT_TIMEOUT_S)

    async def _keep_listening(self) -> None:
        while True:
            try:
                conn = await asyncpg.connect(self._url, timeout=CONNECT_TIMEOUT_S)
                self._conn = conn
                await conn.add_listener(CHANNEL, self._heard)
                self.connected.set()
                # Polled: asyncpg reports a lost connection through is_closed().
                while not conn.is_closed():  # noqa: ASYNC110
                    await asyncio.sleep(RECONNECT_S)
                log.warning("journal listener lost its PostgreSQL connection; reconnecting")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("journal listener cannot LISTEN: %s", type(exc).__name__)
            await self._drop()
            await asyncio.sleep(RECONNECT_S)

    def _heard(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        self.heard += 1
        kind, _, rest = payload.partition(":")
        uid, _, extra = rest.partition(":")
        if not uid:
            return
        if kind == "j":
            with contextlib.suppress(ValueError):
                self._feed.head_moved(uid, int(extra))
        elif kind == "d":
            self._feed.deleted(uid)
        elif kind == "q":
            self._feed.queue_changed(uid)
        elif kind == "c":
            self._feed.cancel_requested(uid, extra)
