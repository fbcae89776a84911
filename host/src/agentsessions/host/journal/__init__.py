"""The journal: durable session rows and per-session hash-chained event logs.

``open_store`` picks a backend from a URL or path; every backend implements
``agentsessions.host.journal.store.JournalStore``. The rules every backend shares (the ListSessions
cursor, the compute_state projection, page size bounds) live here so they are spelled once.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any, Final

from agentsessions.host.journal.store import (
    COMPUTE_COLD,
    COMPUTE_LIVE,
    COMPUTE_NONE,
    ConflictError,
    FencedError,
    Head,
    InvalidPageTokenError,
    JournalStore,
    SchemaError,
    SessionExistsError,
    SessionNotFoundError,
    SessionRow,
    StoreError,
    TamperedError,
)
from agentsessions.v1 import common_pb2

__all__ = [
    "COMPUTE_COLD",
    "COMPUTE_LIVE",
    "COMPUTE_NONE",
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "ConflictError",
    "FencedError",
    "Head",
    "InvalidPageTokenError",
    "JournalStore",
    "SchemaError",
    "SessionExistsError",
    "SessionNotFoundError",
    "SessionRow",
    "StoreError",
    "TamperedError",
    "clamp_page_size",
    "decode_page_token",
    "encode_page_token",
    "imported_chain_state",
    "open_store",
    "project_compute_state",
    "require_distinct_uids",
]

DEFAULT_PAGE_SIZE: Final = 50
MAX_PAGE_SIZE: Final = 500

_MEMORY: Final = "memory:"
_SQLITE_SCHEME: Final = "sqlite://"
_POSTGRES_SCHEMES: Final = ("postgres://", "postgresql://")


async def open_store(target: str, **opts: Any) -> JournalStore:
    """Open the journal store ``target`` names.

    * ``"memory:"`` — a fresh in-process store (nothing survives the process);
    * ``"sqlite:///var/lib/agentsessions/journal.db"`` or a plain path — SQLite (``opts``: see
      ``SqliteStore.open``); the URL's path is taken verbatim, so ``sqlite:///x.db`` is ``/x.db``;
    * ``"postgres://..."`` / ``"postgresql://..."`` — PostgreSQL (``opts``: see ``PostgresStore.open``).
    """
    if target == _MEMORY:
        from agentsessions.host.journal.memory import MemoryStore

        if opts:
            raise TypeError(f"the memory store takes no options, got {sorted(opts)}")
        return MemoryStore()
    if target.startswith(_POSTGRES_SCHEMES):
        from agentsessions.host.journal.postgres import PostgresStore

        return await PostgresStore.open(target, **opts)
    from agentsessions.host.journal.sqlite import SqliteStore

    path = target[len(_SQLITE_SCHEME) :] if target.startswith(_SQLITE_SCHEME) else target
    if not path:
        raise SchemaError(f"journal target {target!r} names no SQLite file")
    return await SqliteStore.open(path, **opts)


def clamp_page_size(page_size: int) -> int:
    """ListSessions page size: <=0 means the default, larger than the maximum is clamped."""
    if page_size <= 0:
        return DEFAULT_PAGE_SIZE
    return min(page_size, MAX_PAGE_SIZE)


def encode_page_token(create_time_ns: int, uid: str) -> str:
    """The reference's ListSessions cursor: unpadded base64url of ``"<created_at_ns>\\x00<uid>"``."""
    raw = f"{create_time_ns}\x00{uid}".encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_page_token(token: str) -> tuple[int, str]:
    """(create_time_ns, uid) of a cursor ``encode_page_token`` made; InvalidPageTokenError otherwise."""
    bad = InvalidPageTokenError(f"page_token {token!r} is not a cursor this server issued")
    try:
        raw = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_", validate=True)
        text = raw.decode("utf-8")
    except (binascii.Error, ValueError):
        raise bad from None
    nanos, sep, uid = text.partition("\x00")
    if not sep or not uid or not nanos.isdigit() or not nanos.isascii():
        raise bad
    # Only the canonical spelling round-trips; anything else was not issued by us.
    if encode_page_token(int(nanos), uid) != token:
        raise bad
    return int(nanos), uid


def project_compute_state(current: str, event: common_pb2.Event) -> str:
    """compute_state after appending ``event`` (spec 1.1, maintained in the append transaction).

    Any non-lifecycle event makes compute LIVE except host approval requests and decisions;
    LIFECYCLE_SUSPEND and LIFECYCLE_FORK make it COLD, LIFECYCLE_RESUME LIVE; other lifecycle kinds
    leave it as it was."""
    kind = event.kind
    if kind == common_pb2.EVENT_LIFECYCLE:
        lifecycle = event.lifecycle.kind
        if (
            lifecycle == common_pb2.Lifecycle.LIFECYCLE_SUSPEND
            or lifecycle == common_pb2.Lifecycle.LIFECYCLE_FORK
        ):
            return COMPUTE_COLD
        if lifecycle == common_pb2.Lifecycle.LIFECYCLE_RESUME:
            return COMPUTE_LIVE
        return current
    if kind == common_pb2.EVENT_APPROVAL_REQUEST or kind == common_pb2.EVENT_APPROVAL_RESULT:
        return current
    return COMPUTE_LIVE


def require_distinct_uids(children: Sequence[SessionRow]) -> None:
    """A fork's children must not share a uid (all or nothing: checked before anything is written)."""
    uids = [c.uid for c in children]
    if len(set(uids)) != len(uids):
        raise SessionExistsError("fork children must have distinct uids")


def imported_chain_state(uid: str, records: Sequence[common_pb2.LogRecord]) -> tuple[str, int]:
    """Check that records to import form one chain from seq 1 (hashes are taken as stored) and
    return the session's compute_state projection and highest fence after them."""
    prev = ""
    for i, rec in enumerate(records, start=1):
        if rec.seq != i or rec.prev_hash != prev:
            raise TamperedError(uid, rec.seq, "records to import do not form a chain from seq 1")
        prev = rec.content_hash
    state = COMPUTE_NONE
    for rec in records:
        state = project_compute_state(state, rec.event)
    return state, max((r.fence for r in records), default=0)
