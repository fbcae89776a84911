"""The journal store seam: session rows plus a hash-chained, fenced, append-only event log.

Every implementation (memory, SQLite, PostgreSQL) passes one conformance suite
(tests/journal/test_store_conformance.py). Stores hash events themselves: callers hand
in normalized ``Event`` messages and get back the ``LogRecord``s that were made durable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Final, Protocol

from agentsessions.host.journal.execstate import ExecProjection
from agentsessions.host.journal.health import JournalHealth
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, harness_registry_pb2

# compute_state projection values, stored as the reference's domain strings.
COMPUTE_NONE = "NONE"
COMPUTE_LIVE = "LIVE"
COMPUTE_COLD = "COLD"


class StoreError(Exception):
    """Base class of journal store errors."""


class JournalUnavailableError(StoreError):
    """The journal cannot be written (or read) right now: a read-only or full disk, a file made
    immutable, a database that refuses this host's writes or cannot be reached. Nothing of the
    refused write was kept; the same write may succeed once the journal is writable again."""


class ConflictError(StoreError):
    """The append's expected head did not match the session's head (CAS lost)."""


class FencedError(StoreError):
    """The append's fence is lower than the session's current fence (superseded writer)."""


class SessionExistsError(StoreError):
    """A session row with that uid already exists."""


class SessionNotFoundError(StoreError):
    """No (undeleted) session row has that uid."""


class InvalidPageTokenError(StoreError):
    """A list page token could not be decoded."""


class TamperedError(StoreError):
    """Verification found a record whose link or hash does not recompute."""

    def __init__(self, session: str, seq: int, why: str) -> None:
        super().__init__(f"session {session}: record seq {seq} fails verification: {why}")
        self.session = session
        self.seq = seq
        self.why = why


class JournalLocationError(StoreError, ValueError):
    """A journal location (``--journal``, ``open_store``) that names no store this host can open."""


class SchemaError(StoreError):
    """The database is foreign, unreadable, or of a newer schema than this host understands."""


# Listed sessions a host keeps ready for the next listing by default (the stores' decoded rows,
# the service's encoded Sessions): a listing of 10,000 sessions pages through without
# dropping any. ~1.2 KiB each, both kept together (bench/NOTEBOOK.md).
KEPT_LISTED: Final = 16_384


@struct(frozen=True)
class SessionRow:
    """A session's metadata row. ``last_seq``, ``last_hash``, ``compute_state`` and
    ``exec_projection`` are derived by the store (``exec_projection`` None: the row holds none,
    derive from the journal; ``last_hash`` "": not known with the row, ask ``head``)."""

    uid: str
    project: str
    name: str = ""
    harness: str = ""
    model: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    origin: common_pb2.Origin | None = None
    identity: common_pb2.IdentityRef | None = None
    parent_uid: str = ""
    fork_seq: int = 0
    create_time_ns: int = 0
    update_time_ns: int = 0
    compute_state: str = COMPUTE_NONE
    last_seq: int = 0
    exec_projection: ExecProjection | None = None
    # The head record's hash, read with last_seq (one read for a row and its head at admission).
    last_hash: str = ""


@struct(frozen=True)
class Head:
    """The newest record of a session: seq 0 and hash "" when the journal is empty."""

    seq: int
    hash: str


class JournalStore(Protocol):
    """Durable session rows and per-session hash-chained journals."""

    @property
    def health(self) -> JournalHealth:
        """Whether the journal takes writes, as the last write found (journal.health)."""
        ...

    def work_inline_while(self, quiet: Callable[[], bool]) -> None:
        """Where faster, do the store's work on the event loop's thread while ``quiet()`` holds."""
        ...

    async def probe(self) -> None:
        """One small write: returns once it committed, raises JournalUnavailableError while the
        journal takes no writes."""
        ...

    async def create_session(self, row: SessionRow) -> SessionRow:
        """Insert a session row (raises SessionExistsError); returns it as stored."""
        ...

    async def get_session(self, uid: str) -> SessionRow | None:
        """The row with derived last_seq and compute_state, or None if missing or deleted."""
        ...

    async def list_sessions(
        self, project: str, page_size: int, page_token: str
    ) -> tuple[list[SessionRow], str]:
        """One page ordered by create time desc, uid asc; returns (rows, next token or "").

        Raises InvalidPageTokenError for a token this store did not produce."""
        ...

    async def delete_session(self, uid: str, *, purge: bool) -> SessionRow:
        """Mark a session deleted (purge=True also drops its events). Raises SessionNotFoundError."""
        ...

    async def new_fence(self, uid: str, expected_head: int | None = None) -> int:
        """Mint the next fencing token for a session (monotonic, first is 1).

        With ``expected_head``, mint only while the journal's head is exactly that seq (else
        ConflictError and the fence is unchanged): a writer that lost the race for the head
        never supersedes the writer that won it, so of two hosts starting a turn at the same
        head exactly one proceeds."""
        ...

    async def append(
        self,
        uid: str,
        events: Sequence[common_pb2.Event],
        *,
        expected_head: int,
        fence: int,
        mint_fence: bool = False,
        normalized: bool = False,
    ) -> list[common_pb2.LogRecord]:
        """Append events after ``expected_head`` atomically, hashing each onto the chain.

        Raises ConflictError when the head moved, FencedError when ``fence`` is below the
        session's fence. With ``mint_fence`` the append also mints the session's next fence in
        the same transaction (``fence`` is ignored) and stamps the records with it: one durable
        commit instead of a mint and an append, and only a writer that wins the head mints.
        ``normalized``: the caller normalized the events already (``canon.normalize_event``, spec
        3.3), which the store otherwise does. Returns only once the records are durable."""
        ...

    async def read(self, uid: str, from_seq: int = 1, to_seq: int = 0) -> list[common_pb2.LogRecord]:
        """Stored records from_seq..to_seq (to_seq 0 = head), hashes verbatim."""
        ...

    async def head(self, uid: str) -> Head:
        """The session's head."""
        ...

    async def verify(self, uid: str) -> int:
        """Recompute the chain from genesis; returns the number of records checked.

        Raises TamperedError naming the first bad seq."""
        ...

    async def fork(
        self,
        parent_uid: str,
        at_seq: int,
        children: Sequence[SessionRow],
        marker: common_pb2.Event,
    ) -> list[SessionRow]:
        """Create every child with the parent's records 1..at_seq (identical hashes) then
        ``marker`` at at_seq+1, all in one transaction (all or nothing)."""
        ...

    async def put_harness(self, registration: harness_registry_pb2.HarnessRegistration) -> None:
        """Insert or replace a HarnessRegistry entry, keyed by metadata.name."""
        ...

    async def get_harness(self, name: str) -> harness_registry_pb2.HarnessRegistration | None:
        """A stored registration, or None."""
        ...

    async def list_harnesses(self) -> list[harness_registry_pb2.HarnessRegistration]:
        """Every stored registration in name order."""
        ...

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> common_pb2.ToolResult | None:
        """The durable executor outcome for (session, idempotency key), if one was recorded."""
        ...

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: common_pb2.ToolResult) -> None:
        """Record an executor outcome once; a second put for the same key keeps the first."""
        ...

    async def session_uids(self) -> list[str]:
        """Every session uid with a row or events (for verify/export tooling)."""
        ...

    async def close(self) -> None:
        """Flush pending work and release connections."""
        ...
