"""What a journal backend supplies: its dialect (how to lock, write and read), nothing of the rules.

``agentsessions.host.journal.engine.DialectStore`` turns a dialect into a ``JournalStore``: it
holds the write queue (group commit), the head cache and the order of every operation's steps,
and asks ``agentsessions.host.journal.rules`` what to check and write. A dialect is only:

* ``Dialect.transaction(body)``: run ``body`` in one write transaction that holds the journal's
  write lock (SQLite: ``BEGIN IMMEDIATE`` on the writer connection's thread; PostgreSQL: a pooled
  connection, row locks taken by ``heads``; memory: the event loop, never suspending);
* ``Transaction``: the statements a write needs (lock heads, insert rows, move heads, ...);
* the reads (a session row, a page of rows, a range of records, the head anchor, a consistent
  scan for verify) and its DDL, which stays in its own module.

A later table beside the journal (leases, idempotency keys, a queue) is one more ``Transaction``
method per statement and, where it needs one, one more read: the engine's batch already carries
arbitrary write programs (``DialectStore.write``) in order, inside the same group commit.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from agentsessions.host.journal.rules import ChainCheck, NewSession, SessionHead, StoredRecord
from agentsessions.host.journal.store import SessionRow, StoreError
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

__all__ = ["BatchFailure", "Dialect", "Transaction"]

_T = TypeVar("_T")


class Transaction(Protocol):
    """The statements of one write transaction. Each method is one statement's worth of work; a
    refusal is decided by the rules before any of them writes."""

    async def foreign_writes(self) -> bool:
        """Whether anything but this dialect's own writer may have committed since its previous
        transaction (True when the dialect cannot tell): the engine's head cache is then dropped."""
        ...

    async def heads(self, uids: Sequence[str]) -> dict[str, SessionHead]:
        """The sessions' heads, locked until the transaction ends; a uid with no row maps to a
        head with ``exists`` False."""
        ...

    async def append_rows(
        self, rows: Sequence[StoredRecord], moved: Sequence[SessionHead], now_ns: int
    ) -> None:
        """Insert journal records and move session heads (anchor, fence, compute_state)."""
        ...

    async def insert_sessions(self, sessions: Sequence[NewSession]) -> None:
        """Insert new session rows (the caller checked ``taken`` first)."""
        ...

    async def insert_session_if_new(self, session: NewSession) -> bool:
        """Insert one session row unless its uid is taken (then write nothing and return False)."""
        ...

    async def taken(self, uids: Sequence[str]) -> set[str]:
        """Which of ``uids`` have a row, deleted or not (a uid is never reused)."""
        ...

    async def live_row(self, uid: str) -> SessionRow | None:
        """The session's row unless it is missing or deleted."""
        ...

    async def mark_deleted(self, uid: str, now_ns: int) -> None: ...

    async def purge(self, uid: str) -> None:
        """Drop the session's records and tool receipts and reset its head anchor, leaving every
        session that shares records with it whole."""
        ...

    async def record_at(self, uid: str, seq: int) -> tuple[int, str] | None:
        """(seq, hash) of the session's stored record at ``seq``, None if it is not stored."""
        ...

    async def share_prefix(self, children: Sequence[str], parent_uid: str, at_seq: int) -> None:
        """Give new sessions the parent's records 1..at_seq (copied or referenced: the dialect's
        layout; reads of a child return them as its own)."""
        ...

    async def put_harness(self, name: str, registration: bytes, now_ns: int) -> None: ...

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: bytes, now_ns: int) -> None:
        """Record an executor outcome unless one is recorded for the key already."""
        ...

    async def touch_probe(self, now_ns: int) -> None:
        """Write the journal_probe row (a health probe: does the journal take writes?)."""
        ...


@struct(frozen=True)
class BatchFailure:
    """How a failed write transaction is reported to every write it carried."""

    kind: type[StoreError]
    message: str
    # Retrying each write in a transaction of its own may succeed (a conflict that one of the
    # batch's writes caused, such as a row another host inserted first).
    retry_alone: bool = False


class Dialect(Protocol):
    """One backend's storage: transactions, reads and its own schema."""

    @property
    def immediate(self) -> bool:
        """Writes run at once on the event loop, without suspending (memory): no write queue."""
        ...

    @property
    def max_in_flight(self) -> int:
        """Write transactions this dialect may have open at once."""
        ...

    def change_mark(self) -> int | None:
        """A mark of the journal's latest commit by anyone, read without I/O (SQLite: the WAL
        index's change counter, in shared memory), or None where the dialect has none. While it
        equals ``committed_mark`` nobody has committed since this store's last commit, and the
        store answers a session's row from what it last wrote."""
        ...

    @property
    def committed_mark(self) -> int | None:
        """``change_mark`` right after this store's last commit, when that commit alone moved it
        (None: unknown, or the dialect has no marks)."""
        ...

    async def transaction(self, body: Callable[[Transaction], Awaitable[_T]]) -> _T:
        """Run ``body`` in one write transaction: everything it wrote commits, or nothing does."""
        ...

    def batch_failure(self, exc: Exception) -> BatchFailure:
        """The refusal a failed transaction becomes (a typed store error, never a driver's)."""
        ...

    def work_inline_while(self, quiet: Callable[[], bool]) -> None:
        """Where the dialect can, do its work on the caller's thread while ``quiet()`` holds."""
        ...

    async def get_row(self, uid: str) -> SessionRow | None:
        """A live session's row (derived last_seq and compute_state included)."""
        ...

    async def list_rows(self, project: str, after: tuple[int, str] | None, limit: int) -> list[SessionRow]:
        """Live rows of a project by create time desc, uid asc, strictly after the cursor."""
        ...

    async def read(self, uid: str, from_seq: int, to_seq: int) -> list[common_pb2.LogRecord]:
        """Stored records from_seq..to_seq (to_seq 0: no upper bound), hashes verbatim."""
        ...

    async def anchor(self, uid: str) -> tuple[int, str] | None:
        """The head (seq, hash) the session's row records, None without a row."""
        ...

    async def verify_scan(self, uid: str, check: ChainCheck) -> tuple[int, str] | None:
        """Feed every stored record of the session to ``check`` in seq order and return its head
        anchor, all from one consistent snapshot."""
        ...

    async def session_uids(self) -> list[str]:
        """Every uid with a row or stored records, sorted."""
        ...

    async def get_harness(self, name: str) -> bytes | None: ...

    async def list_harnesses(self) -> list[bytes]:
        """Every stored registration, in name order."""
        ...

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> bytes | None: ...

    async def close(self) -> None: ...
