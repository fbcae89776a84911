"""In-process journal store: the memory dialect, kept in dicts.

Nothing is durable beyond the process. Writes apply at once on the event loop without
suspending, so every write is atomic and writes are totally ordered. Events are kept as their
serialized bytes, as the database stores keep them, so ``verify`` recomputes from what is
stored. Records are immutable, so a fork's children hold the parent's prefix records themselves
(the same objects), and purging the parent leaves them whole.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import field
from typing import Any, Final, TypeVar

from agentsessions.host.journal import execstate
from agentsessions.host.journal.dialect import BatchFailure
from agentsessions.host.journal.engine import DialectStore
from agentsessions.host.journal.execstate import ExecProjection
from agentsessions.host.journal.listed import ListedRows
from agentsessions.host.journal.live_memory import LiveTables, MemoryLiveStatements, SessionState
from agentsessions.host.journal.rules import (
    UNKNOWN_EXEC,
    ChainCheck,
    NewSession,
    SessionHead,
    StoredRecord,
    log_record,
)
from agentsessions.host.journal.store import COMPUTE_NONE, KEPT_LISTED, SessionRow, StoreError
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

__all__ = ["MemoryStore"]

_T = TypeVar("_T")


@struct
class _Session:
    row: SessionRow  # as created; the fields below supersede its derived ones
    fence: int = 0
    compute_state: str = COMPUTE_NONE
    update_time_ns: int = 0
    deleted: bool = False
    last_seq: int = 0
    last_hash: str = ""
    exec_projection: ExecProjection = execstate.EMPTY


@struct
class _Memory:
    sessions: dict[str, _Session] = field(default_factory=dict)
    journals: dict[str, list[StoredRecord]] = field(default_factory=dict)
    harnesses: dict[str, bytes] = field(default_factory=dict)
    receipts: dict[tuple[str, str], bytes] = field(default_factory=dict)
    live: LiveTables = field(default_factory=LiveTables)  # leases, idempotency keys, queued turns

    def records(self, uid: str) -> list[StoredRecord]:
        return self.journals.get(uid, [])

    def upto(self, uid: str, seq: int) -> list[StoredRecord]:
        records = self.records(uid)
        return records[: bisect.bisect_right(records, seq, key=_seq)]

    def row(self, uid: str) -> SessionRow | None:
        session = self.sessions.get(uid)
        if session is None or session.deleted:
            return None
        return _own_row(
            dataclasses.replace(
                session.row,
                update_time_ns=session.update_time_ns,
                compute_state=session.compute_state,
                last_seq=session.last_seq,
                exec_projection=session.exec_projection,
                last_hash=session.last_hash,
            )
        )


def _state(session: _Session) -> tuple[Any, ...]:
    """What a listed row of ``session`` is made of besides its uid (see list_rows)."""
    return (
        session.update_time_ns,
        session.compute_state,
        session.last_seq,
        session.last_hash,
        session.exec_projection.encode(),
    )


def _seq(rec: StoredRecord) -> int:
    return rec.seq


def _own_row(row: SessionRow) -> SessionRow:
    """A copy whose protobuf members are not shared with the caller."""
    origin = None
    if row.origin is not None:
        origin = common_pb2.Origin()
        origin.CopyFrom(row.origin)
    identity = None
    if row.identity is not None:
        identity = common_pb2.IdentityRef()
        identity.CopyFrom(row.identity)
    return dataclasses.replace(
        row, labels=dict(row.labels), annotations=dict(row.annotations), origin=origin, identity=identity
    )


class _MemoryTransaction(MemoryLiveStatements):
    """Statements on the dicts. Nobody else writes them, so the head cache is always good."""

    def __init__(self, memory: _Memory) -> None:
        self._m = memory

    def _live_tables(self) -> LiveTables:
        return self._m.live

    def _session_states(self) -> Mapping[str, SessionState]:
        return self._m.sessions

    async def foreign_writes(self) -> bool:
        return False

    async def heads(self, uids: Sequence[str]) -> dict[str, SessionHead]:
        out: dict[str, SessionHead] = {}
        for uid in uids:
            s = self._m.sessions.get(uid)
            out[uid] = (
                SessionHead(uid)
                if s is None
                else SessionHead(
                    uid, True, s.deleted, s.fence, s.compute_state, s.last_seq, s.last_hash, s.exec_projection
                )
            )
        return out

    async def append_rows(
        self, rows: Sequence[StoredRecord], moved: Sequence[SessionHead], now_ns: int
    ) -> None:
        journals = self._m.journals
        for rec in rows:
            journals.setdefault(rec.session, []).append(rec)
        for head in moved:
            s = self._m.sessions[head.uid]
            s.fence, s.compute_state = head.fence, head.compute_state
            s.last_seq, s.last_hash, s.update_time_ns = head.seq, head.hash, now_ns
            s.exec_projection = head.exec

    async def insert_sessions(self, sessions: Sequence[NewSession]) -> None:
        for new in sessions:
            row = new.row
            self._m.sessions[row.uid] = _Session(
                row=_own_row(row),
                fence=new.fence,
                compute_state=row.compute_state,
                update_time_ns=row.update_time_ns,
                last_seq=row.last_seq,
                last_hash=new.last_hash,
                exec_projection=row.exec_projection if row.exec_projection is not None else UNKNOWN_EXEC,
            )

    async def insert_session_if_new(self, session: NewSession) -> bool:
        if session.row.uid in self._m.sessions:
            return False
        await self.insert_sessions([session])
        return True

    async def taken(self, uids: Sequence[str]) -> set[str]:
        return {uid for uid in uids if uid in self._m.sessions}

    async def live_row(self, uid: str) -> SessionRow | None:
        return self._m.row(uid)

    async def mark_deleted(self, uid: str, now_ns: int) -> None:
        session = self._m.sessions[uid]
        session.deleted, session.update_time_ns = True, now_ns

    async def purge(self, uid: str) -> None:
        self._m.journals.pop(uid, None)
        session = self._m.sessions[uid]
        session.last_seq, session.last_hash = 0, ""
        session.exec_projection = execstate.EMPTY
        for key in [k for k in self._m.receipts if k[0] == uid]:
            del self._m.receipts[key]

    async def record_at(self, uid: str, seq: int) -> tuple[int, str] | None:
        found = self._m.upto(uid, seq)
        if not found or found[-1].seq != seq:
            return None
        return seq, found[-1].hash

    async def share_prefix(self, children: Sequence[str], parent_uid: str, at_seq: int) -> None:
        prefix = self._m.upto(parent_uid, at_seq)
        for uid in children:
            self._m.journals[uid] = [*prefix, *self._m.records(uid)]

    async def put_harness(self, name: str, registration: bytes, now_ns: int) -> None:
        self._m.harnesses[name] = registration

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: bytes, now_ns: int) -> None:
        self._m.receipts.setdefault((uid, idempotency_key), result)

    async def touch_probe(self, now_ns: int) -> None:
        return None  # memory always takes writes


class _MemoryDialect:
    immediate: Final = True
    max_in_flight: Final = 1
    committed_mark: Final = None  # rows are read in memory anyway

    def change_mark(self) -> int | None:
        return None

    def __init__(self, kept_listed: int = KEPT_LISTED) -> None:
        self.memory = _Memory()
        self._tx = _MemoryTransaction(self.memory)
        self.listed: ListedRows[tuple[Any, ...]] = ListedRows(kept_listed)

    async def transaction(self, body: Callable[[_MemoryTransaction], Awaitable[_T]]) -> _T:
        # The body awaits only the statements above, which never suspend: nothing interleaves.
        return await body(self._tx)

    def batch_failure(self, exc: Exception) -> BatchFailure:
        return BatchFailure(StoreError, f"journal write failed: {exc!r}")

    def work_inline_while(self, quiet: Callable[[], bool]) -> None:
        pass  # every write and read already runs on the caller's thread

    async def get_row(self, uid: str) -> SessionRow | None:
        return self.memory.row(uid)

    async def list_rows(self, project: str, after: tuple[int, str] | None, limit: int) -> list[SessionRow]:
        keyed = sorted(
            (-s.row.create_time_ns, uid)
            for uid, s in self.memory.sessions.items()
            if not s.deleted and s.row.project == project
        )
        if after is not None:
            cursor = (-after[0], after[1])
            keyed = [k for k in keyed if k > cursor]
        sessions = self.memory.sessions
        # Keyed by what a row is made of: its uid (never created again, not even after a delete)
        # names its own row, which never changes once created, and the rest is its derived state.
        # An unchanged row is then the same object listing after listing, as the SQL stores give
        # it (journal.listed).
        named = [(uid, (uid, *_state(sessions[uid]))) for _, uid in keyed[:limit]]
        return self.listed.rows(named, self._listed)

    def _listed(self, keys: list[tuple[Any, ...]]) -> list[SessionRow]:
        rows = [self.memory.row(key[0]) for key in keys]
        return [r for r in rows if r is not None]

    async def read(self, uid: str, from_seq: int, to_seq: int) -> list[common_pb2.LogRecord]:
        records = self.memory.records(uid)
        start = bisect.bisect_left(records, from_seq, key=_seq)
        end = len(records) if to_seq <= 0 else bisect.bisect_right(records, to_seq, key=_seq)
        return [log_record(r) for r in records[start:end]]

    async def anchor(self, uid: str) -> tuple[int, str] | None:
        session = self.memory.sessions.get(uid)
        return None if session is None else (session.last_seq, session.last_hash)

    async def verify_scan(self, uid: str, check: ChainCheck) -> tuple[int, str] | None:
        for rec in self.memory.records(uid):
            check.feed(rec.seq, rec.prev_hash, rec.hash, rec.event)
        return await self.anchor(uid)

    async def session_uids(self) -> list[str]:
        m = self.memory
        return sorted(set(m.sessions) | {uid for uid, records in m.journals.items() if records})

    async def get_harness(self, name: str) -> bytes | None:
        return self.memory.harnesses.get(name)

    async def list_harnesses(self) -> list[bytes]:
        return [self.memory.harnesses[n] for n in sorted(self.memory.harnesses)]

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> bytes | None:
        return self.memory.receipts.get((uid, idempotency_key))

    async def close(self) -> None:
        return None


class MemoryStore(DialectStore):
    """JournalStore kept in process memory."""

    def __init__(self, *, kept_listed: int = KEPT_LISTED) -> None:
        """``kept_listed``: the listed rows kept for the next listing (``journal.listed``; 0: none)."""
        self._memory_dialect = _MemoryDialect(kept_listed)
        super().__init__(self._memory_dialect)

    # -- test hooks: damage the storage as someone with write access to it could --------------

    def corrupt_record(
        self, uid: str, seq: int, *, event: bytes | None = None, hash: str | None = None
    ) -> None:
        """Overwrite a stored record's event bytes and/or hash."""
        records = self._memory_dialect.memory.records(uid)
        i = bisect.bisect_left(records, seq, key=_seq)
        rec = records[i]
        if event is not None:
            rec = rec._replace(event=event)
        if hash is not None:
            rec = rec._replace(hash=hash)
        records[i] = rec

    def drop_record(self, uid: str, seq: int) -> None:
        """Delete one stored record."""
        records = self._memory_dialect.memory.records(uid)
        del records[bisect.bisect_left(records, seq, key=_seq)]

    def insert_record(self, uid: str, record: common_pb2.LogRecord) -> None:
        """Store a record for a session at its seq, around the rules."""
        records = self._memory_dialect.memory.journals.setdefault(uid, [])
        event = record.event.SerializeToString()
        stored = StoredRecord(uid, record.seq, record.prev_hash, record.content_hash, record.fence, event)
        bisect.insort(records, stored, key=_seq)

    def drop_newest_record(self, uid: str) -> None:
        """Delete a session's newest stored record."""
        self._memory_dialect.memory.records(uid).pop()

    def stored_event(self, uid: str, seq: int) -> bytes:
        """The stored bytes of a record's event."""
        records = self._memory_dialect.memory.records(uid)
        return records[bisect.bisect_left(records, seq, key=_seq)].event
