"""Rows as both SQL dialects (SQLite, PostgreSQL) write and read them, spelled once: a new
session's row values and a head's execution projection, the live tables'
(``agentsessions.host.journal.live``) column lists, and a row in column order to and from its
value. SQLite rows and asyncpg records are both read by position.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from agentsessions.host.journal import execstate
from agentsessions.host.journal.execstate import ExecProjection
from agentsessions.host.journal.live import KeyRecord, Lease, QueuedTurn
from agentsessions.host.journal.rules import UNKNOWN_EXEC, NewSession

__all__ = [
    "KEY_COLUMNS",
    "LEASE_COLUMNS",
    "QUEUE_COLUMNS",
    "head_projection",
    "json_map",
    "key_of",
    "key_row",
    "lease_of",
    "lease_row",
    "queued_of",
    "session_values",
]

LEASE_COLUMNS: Final = (
    "session, execution_id, state, owner, expires_at, attempts, next_at, seen_seq, last_error, cancel_reason"
)
KEY_COLUMNS: Final = (
    "scope, key, method, digest, state, session, execution_id, result, created_at, expires_at"
)
QUEUE_COLUMNS: Final = "session, position, execution_id, request, submitter, created_at"


def json_map(value: Mapping[str, str]) -> str:
    """Labels or annotations as the JSON text a session row stores."""
    return json.dumps(dict(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def session_values(new: NewSession) -> tuple[Any, ...]:
    """A new session's row in the column order both dialects insert it: uid, project, name,
    harness, model, labels, annotations, origin, identity, parent_uid, fork_seq, created_at,
    updated_at, compute_state, fence, last_seq, last_hash, exec_projection."""
    row = new.row
    return (
        row.uid,
        row.project,
        row.name,
        row.harness,
        row.model,
        json_map(row.labels),
        json_map(row.annotations),
        None if row.origin is None else row.origin.SerializeToString(deterministic=True),
        None if row.identity is None else row.identity.SerializeToString(deterministic=True),
        row.parent_uid,
        row.fork_seq,
        row.create_time_ns,
        row.update_time_ns,
        row.compute_state,
        new.fence,
        row.last_seq,
        new.last_hash,
        None if row.exec_projection is None else row.exec_projection.encode(),
    )


def head_projection(text: str | None) -> ExecProjection:
    """A head's stored execution projection; a row without one is ``UNKNOWN_EXEC``."""
    found = execstate.decode(text)
    return UNKNOWN_EXEC if found is None else found


def lease_of(rec: Sequence[Any]) -> Lease:
    """A ``live_leases`` row read as ``LEASE_COLUMNS``."""
    return Lease(
        session=str(rec[0]),
        execution_id=str(rec[1]),
        state=str(rec[2]),
        owner=str(rec[3]),
        expires_at_ns=int(rec[4]),
        attempts=int(rec[5]),
        next_at_ns=int(rec[6]),
        seen_seq=int(rec[7]),
        last_error=str(rec[8]),
        cancel_reason=None if rec[9] is None else str(rec[9]),
    )


def lease_row(lease: Lease, now_ns: int) -> tuple[Any, ...]:
    """The values of ``LEASE_COLUMNS`` and then ``updated_at``."""
    return (
        lease.session,
        lease.execution_id,
        lease.state,
        lease.owner,
        lease.expires_at_ns,
        lease.attempts,
        lease.next_at_ns,
        lease.seen_seq,
        lease.last_error,
        lease.cancel_reason,
        now_ns,
    )


def key_of(rec: Sequence[Any]) -> KeyRecord:
    """A ``live_idempotency`` row read as ``KEY_COLUMNS``."""
    return KeyRecord(
        scope=str(rec[0]),
        key=str(rec[1]),
        method=str(rec[2]),
        digest=str(rec[3]),
        state=str(rec[4]),
        session=str(rec[5]),
        execution_id=str(rec[6]),
        result=str(rec[7]),
        created_at_ns=int(rec[8]),
        expires_at_ns=int(rec[9]),
    )


def key_row(record: KeyRecord) -> tuple[Any, ...]:
    """The values of ``KEY_COLUMNS``."""
    return (
        record.scope,
        record.key,
        record.method,
        record.digest,
        record.state,
        record.session,
        record.execution_id,
        record.result,
        record.created_at_ns,
        record.expires_at_ns,
    )


def queued_of(rec: Sequence[Any]) -> QueuedTurn:
    """A ``live_queue`` row read as ``QUEUE_COLUMNS``."""
    return QueuedTurn(str(rec[0]), int(rec[1]), str(rec[2]), bytes(rec[3]), str(rec[4]), int(rec[5]))
