"""The live tables (``agentsessions.host.journal.live``) of the SQLite dialect.

Created when the store opens (``CREATE TABLE IF NOT EXISTS``: they are not part of the journal's
schema version, and a host without them ignores them). Statements run on the writer connection
inside its ``BEGIN IMMEDIATE`` transaction, like every other write.
"""

from __future__ import annotations

import sqlite3
from typing import Final

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

__all__ = ["SqliteLiveStatements", "create_live_tables"]

_DDL: Final = (
    """
    CREATE TABLE IF NOT EXISTS live_leases (
        session TEXT NOT NULL,
        execution_id TEXT NOT NULL,
        state TEXT NOT NULL,
        owner TEXT NOT NULL DEFAULT '',
        expires_at INTEGER NOT NULL DEFAULT 0,
        attempts INTEGER NOT NULL DEFAULT 0,
        next_at INTEGER NOT NULL DEFAULT 0,
        seen_seq INTEGER NOT NULL DEFAULT 0,
        last_error TEXT NOT NULL DEFAULT '',
        cancel_reason TEXT,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (session, execution_id)
    )
    """,
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
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL,
        PRIMARY KEY (scope, key)
    )
    """,
    "CREATE INDEX IF NOT EXISTS live_idempotency_expiry ON live_idempotency(expires_at)",
    """
    CREATE TABLE IF NOT EXISTS live_queue (
        session TEXT NOT NULL,
        position INTEGER NOT NULL,
        execution_id TEXT NOT NULL UNIQUE,
        request BLOB NOT NULL /* binary agentsessions.v1.ExecRequest */,
        submitter TEXT NOT NULL DEFAULT '',
        created_at INTEGER NOT NULL,
        PRIMARY KEY (session, position)
    )
    """,
)


def create_live_tables(db: sqlite3.Connection) -> None:
    """On the writer's thread, when the store opens: the live tables, if they are not there yet."""
    db.execute("BEGIN IMMEDIATE")
    try:
        for statement in _DDL:
            db.execute(statement)
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


class SqliteLiveStatements:
    """Mixed into the SQLite dialect's transaction (whose writer connection is ``_db``)."""

    _db: sqlite3.Connection

    async def lease_get(self, uid: str, execution_id: str) -> Lease | None:
        rec = self._db.execute(
            f"SELECT {LEASE_COLUMNS} FROM live_leases WHERE session = ? AND execution_id = ?",
            (uid, execution_id),
        ).fetchone()
        return None if rec is None else lease_of(rec)

    async def lease_put(self, lease: Lease, now_ns: int) -> None:
        self._db.execute(
            f"INSERT OR REPLACE INTO live_leases ({LEASE_COLUMNS}, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            lease_row(lease, now_ns),
        )

    async def lease_add(self, lease: Lease, now_ns: int) -> bool:
        if await self.lease_get(lease.session, lease.execution_id) is not None:
            return False
        await self.lease_put(lease, now_ns)
        return True

    async def lease_delete(self, uid: str, execution_id: str) -> None:
        self._db.execute(
            "DELETE FROM live_leases WHERE session = ? AND execution_id = ?", (uid, execution_id)
        )

    async def lease_drop(self, uid: str, execution_id: str, owner: str) -> bool:
        dropped = self._db.execute(
            "DELETE FROM live_leases WHERE session = ? AND execution_id = ? AND owner IN (?, '')",
            (uid, execution_id, owner),
        ).rowcount
        return bool(dropped)

    async def leases_of(self, uid: str) -> list[Lease]:
        recs = self._db.execute(
            f"SELECT {LEASE_COLUMNS} FROM live_leases WHERE session = ? ORDER BY execution_id", (uid,)
        ).fetchall()
        return [lease_of(r) for r in recs]

    async def lease_renew(self, owner: str, expires_at_ns: int, now_ns: int) -> list[Lease]:
        db = self._db
        db.execute(
            "UPDATE live_leases SET expires_at = ?, updated_at = ? WHERE owner = ? AND state = ?",
            (expires_at_ns, now_ns, owner, RUNNING),
        )
        recs = db.execute(
            f"SELECT {LEASE_COLUMNS} FROM live_leases WHERE owner = ? AND state = ?", (owner, RUNNING)
        ).fetchall()
        return [lease_of(r) for r in recs]

    async def lease_candidates(self, now_ns: int, local_prefix: str, limit: int) -> list[Lease]:
        columns = ", ".join(f"l.{c.strip()}" for c in LEASE_COLUMNS.split(","))
        recs = self._db.execute(
            f"""
            SELECT {columns} FROM live_leases AS l LEFT JOIN sessions AS s ON s.session = l.session
            WHERE (l.state = ? AND (l.expires_at < ? OR substr(l.owner, 1, ?) = ?))
               OR (l.state = ? AND l.next_at <= ?)
               OR (l.state = ? AND (s.session IS NULL OR s.deleted <> 0 OR s.last_seq <> l.seen_seq))
               OR l.state NOT IN (?, ?, ?)
            ORDER BY l.updated_at LIMIT ?
            """,
            (
                RUNNING,
                now_ns,
                len(local_prefix),
                local_prefix,
                RETRY,
                now_ns,
                PARKED,
                RUNNING,
                RETRY,
                PARKED,
                limit,
            ),
        ).fetchall()
        return [lease_of(r) for r in recs]

    async def key_get(self, scope: str, key: str) -> KeyRecord | None:
        rec = self._db.execute(
            f"SELECT {KEY_COLUMNS} FROM live_idempotency WHERE scope = ? AND key = ?", (scope, key)
        ).fetchone()
        return None if rec is None else key_of(rec)

    async def key_put(self, record: KeyRecord) -> None:
        self._db.execute(
            f"INSERT OR REPLACE INTO live_idempotency ({KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            key_row(record),
        )

    async def key_add(self, record: KeyRecord, now_ns: int) -> KeyRecord | None:
        # The writer holds the file's write lock: nothing interleaves between the read and the write.
        found = await self.key_get(record.scope, record.key)
        if found is not None and found.expires_at_ns > now_ns:
            return found
        await self.key_put(record)
        return None

    async def key_delete(self, scope: str, key: str) -> None:
        self._db.execute("DELETE FROM live_idempotency WHERE scope = ? AND key = ?", (scope, key))

    async def key_purge(self, now_ns: int) -> int:
        return int(self._db.execute("DELETE FROM live_idempotency WHERE expires_at <= ?", (now_ns,)).rowcount)

    async def queue_list(self, uid: str) -> list[QueuedTurn]:
        recs = self._db.execute(
            f"SELECT {QUEUE_COLUMNS} FROM live_queue WHERE session = ? ORDER BY position", (uid,)
        ).fetchall()
        return [queued_of(r) for r in recs]

    async def queue_insert(
        self, uid: str, execution_id: str, request: bytes, submitter: str, now_ns: int
    ) -> QueuedTurn:
        db = self._db
        (last,) = db.execute(
            "SELECT COALESCE(MAX(position), 0) FROM live_queue WHERE session = ?", (uid,)
        ).fetchone()
        entry = QueuedTurn(uid, int(last) + 1, execution_id, request, submitter, now_ns)
        db.execute(
            f"INSERT INTO live_queue ({QUEUE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            (entry.session, entry.position, entry.execution_id, entry.request, submitter, now_ns),
        )
        return entry

    async def queue_delete(self, uid: str, execution_id: str) -> bool:
        deleted = self._db.execute(
            "DELETE FROM live_queue WHERE session = ? AND execution_id = ?", (uid, execution_id)
        ).rowcount
        return bool(deleted)

    async def queue_idle_sessions(self, limit: int) -> list[str]:
        recs = self._db.execute(
            """
            SELECT DISTINCT q.session FROM live_queue AS q
            WHERE NOT EXISTS (SELECT 1 FROM live_leases AS l WHERE l.session = q.session)
            ORDER BY q.session LIMIT ?
            """,
            (limit,),
        ).fetchall()
        return [str(r[0]) for r in recs]
