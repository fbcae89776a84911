"""The journal's rules as pure functions: what every store checks and computes, spelled once.

Nothing here does I/O (the only state is a ChainCheck's place in the chain it checks). A
store's dialect fetches what a rule needs (sessions' heads under its write lock, the record a
fork continues from, stored records) and writes what the rule planned. Every refusal's type and
message is made here, so every store refuses the same operation the same way
(tests/journal/test_store_conformance.py holds them to it):

* append: compare-and-swap on the expected head, the fence check (or mint), prev-hash chaining
  (the hash formula itself is ``canon.chain_hash``) and the compute_state projection;
* fence mint: monotonic per session, optionally only at an expected head;
* verify: an unbroken chain from genesis that ends at the head the session row recorded;
* fork: the parent is live, the fork point is within its head and its record is stored, the
  children are new; the marker continues the parent's chain;
* import: the records form one chain from seq 1, the session is new.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from agentsessions.host.journal import execstate
from agentsessions.host.journal.canon import canonical_event, chain_hash, content_hash, normalize_event
from agentsessions.host.journal.execstate import ExecProjection
from agentsessions.host.journal.store import (
    COMPUTE_COLD,
    COMPUTE_LIVE,
    COMPUTE_NONE,
    ConflictError,
    FencedError,
    SessionExistsError,
    SessionNotFoundError,
    SessionRow,
    StoreError,
    TamperedError,
)
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

__all__ = [
    "UNKNOWN_EXEC",
    "AppendRequest",
    "Appended",
    "ChainCheck",
    "ForkPlan",
    "ImportPlan",
    "MintRequest",
    "NewSession",
    "PreparedEvents",
    "RunPlan",
    "SessionHead",
    "StoredRecord",
    "appended_records",
    "check_head_anchor",
    "check_import_chain",
    "head_conflict",
    "log_record",
    "not_found",
    "plan_fork",
    "plan_import",
    "plan_new_session",
    "plan_run",
    "prepare_events",
    "project_compute_state",
    "require_distinct_uids",
    "session_exists",
]

_L = common_pb2.Lifecycle


# -- values the rules work on -----------------------------------------------------------------


class SessionHead(NamedTuple):
    """A session as a writer sees it inside its transaction (``exists`` False: no row)."""

    uid: str
    exists: bool = False
    deleted: bool = False
    fence: int = 0
    compute_state: str = COMPUTE_NONE
    seq: int = 0
    hash: str = ""
    # The execution state the row projects (journal.execstate); UNKNOWN_EXEC when it has none.
    exec: ExecProjection = execstate.EMPTY


# A row whose projection is missing or unreadable: appends keep it so, readers use the journal.
UNKNOWN_EXEC: ExecProjection = execstate.fold((), start=ExecProjection(unknown=True))


class StoredRecord(NamedTuple):
    """One stored journal record: a row of the reference ``events`` table (spec 3.5), in its
    column order."""

    session: str
    seq: int
    prev_hash: str
    hash: str
    fence: int
    event: bytes  # binary agentsessions.v1.Event


class PreparedEvents(NamedTuple):
    """Events as they will be stored: normalized (spec 3.3), serialized, and in canonical form."""

    events: tuple[common_pb2.Event, ...]
    blobs: tuple[bytes, ...]
    canonical: tuple[bytes, ...]


def prepare_events(events: Iterable[common_pb2.Event], *, normalized: bool = False) -> PreparedEvents:
    """The work an append needs no lock for. ``normalized``: the events are as the journal stores
    them already (``normalize_event``), not looked at again."""
    stored = tuple(events) if normalized else tuple(normalize_event(ev) for ev in events)
    return PreparedEvents(
        stored,
        tuple(ev.SerializeToString() for ev in stored),
        tuple(canonical_event(ev) for ev in stored),
    )


class AppendRequest(NamedTuple):
    uid: str
    prepared: PreparedEvents
    expected_head: int
    fence: int
    mint: bool = False


class MintRequest(NamedTuple):
    uid: str
    expected_head: int | None = None


class Appended(NamedTuple):
    """An accepted append: the fence its records carry and each record's (seq, prev, hash)."""

    fence: int
    chain: tuple[tuple[int, str, str], ...]


@struct(frozen=True, slots=True)
class NewSession:
    """A session row to insert, with the head anchor and fence it starts with."""

    row: SessionRow
    fence: int = 0
    last_hash: str = ""


# -- refusals ---------------------------------------------------------------------------------


def not_found(uid: str) -> SessionNotFoundError:
    return SessionNotFoundError(f"session {uid} not found")


def session_exists(uid: str) -> SessionExistsError:
    return SessionExistsError(f"session {uid} already exists")


def head_conflict(uid: str, expected: int, head: int) -> ConflictError:
    """The compare-and-swap rule: a write names the head it expects, and only that head will do."""
    return ConflictError(f"expected_last_seq {expected} does not match head {head} of session {uid}")


def _fenced(uid: str, fence: int, current: int) -> FencedError:
    return FencedError(f"fence {fence} is superseded by fence {current} of session {uid}")


# -- compute_state ----------------------------------------------------------------------------


def project_compute_state(current: str, event: common_pb2.Event) -> str:
    """compute_state after appending ``event`` (spec 1.1, maintained in the append transaction).

    Any non-lifecycle event makes compute LIVE except host approval requests and decisions;
    LIFECYCLE_SUSPEND and LIFECYCLE_FORK make it COLD, LIFECYCLE_RESUME LIVE; other lifecycle kinds
    leave it as it was."""
    kind = event.kind
    if kind == common_pb2.EVENT_LIFECYCLE:
        lifecycle = event.lifecycle.kind
        if lifecycle == _L.LIFECYCLE_SUSPEND or lifecycle == _L.LIFECYCLE_FORK:
            return COMPUTE_COLD
        if lifecycle == _L.LIFECYCLE_RESUME:
            return COMPUTE_LIVE
        return current
    if kind == common_pb2.EVENT_APPROVAL_REQUEST or kind == common_pb2.EVENT_APPROVAL_RESULT:
        return current
    return COMPUTE_LIVE


# -- append and fence mint ----------------------------------------------------------------------


class RunPlan(NamedTuple):
    """What one run of appends and fence mints (applied in order, in one transaction) does."""

    # Per request, in order: Appended for an append, the fence for a mint, or the refusal.
    outcomes: list[Appended | int | StoreError]
    rows: list[StoredRecord]
    # Sessions with no row that a mint creates (the reference's NewFence creates the row).
    created: list[NewSession]
    # The final head of every session whose row changed (chained records or a new fence).
    moved: dict[str, SessionHead]


def plan_run(
    requests: Sequence[AppendRequest | MintRequest], heads: Mapping[str, SessionHead], now_ns: int
) -> RunPlan:
    """Check and chain each request against its session's head as the requests before it left it.

    ``heads`` holds every requested session's head as read under the write lock. A refused
    request changes nothing; the others still apply."""
    outcomes: list[Appended | int | StoreError] = []
    rows: list[StoredRecord] = []
    moved: dict[str, SessionHead] = {}
    current = dict(heads)
    created: set[str] = set()
    add_row = rows.append
    for req in requests:
        uid = req.uid
        head = current[uid]
        if type(req) is MintRequest:
            if req.expected_head is not None and req.expected_head != head.seq:
                outcomes.append(head_conflict(uid, req.expected_head, head.seq))
                continue
            if not head.exists:
                created.add(uid)
            head = SessionHead(
                uid, True, head.deleted, head.fence + 1, head.compute_state, head.seq, head.hash, head.exec
            )
            current[uid] = moved[uid] = head
            outcomes.append(head.fence)
            continue
        assert type(req) is AppendRequest
        if not head.exists or head.deleted:
            outcomes.append(not_found(uid))
            continue
        if req.expected_head != head.seq:
            outcomes.append(head_conflict(uid, req.expected_head, head.seq))
            continue
        fence = req.fence
        if req.mint:
            fence = head.fence + 1
        elif fence < head.fence:
            outcomes.append(_fenced(uid, fence, head.fence))
            continue
        seq, prev, state, projected = head.seq, head.hash, head.compute_state, head.exec
        chain: list[tuple[int, str, str]] = []
        prepared = req.prepared
        for ev, blob, canonical in zip(prepared.events, prepared.blobs, prepared.canonical, strict=True):
            seq += 1
            digest = chain_hash(canonical, prev, seq)
            add_row(StoredRecord(uid, seq, prev, digest, fence, blob))
            chain.append((seq, prev, digest))
            state = project_compute_state(state, ev)
            projected = execstate.advance(projected, ev, seq)
            prev = digest
        # Only a mint moves the session's fence: a greater fence is accepted, not recorded.
        if chain or req.mint:
            head = SessionHead(
                uid, True, False, fence if req.mint else head.fence, state, seq, prev, projected
            )
            current[uid] = moved[uid] = head
        outcomes.append(Appended(fence, tuple(chain)))
    new = [
        NewSession(
            SessionRow(
                uid=uid,
                project="",
                create_time_ns=now_ns,
                update_time_ns=now_ns,
                exec_projection=current[uid].exec,
            )
        )
        for uid in sorted(created)
    ]
    return RunPlan(outcomes, rows, new, moved)


def appended_records(prepared: PreparedEvents, appended: Appended) -> list[common_pb2.LogRecord]:
    """The LogRecords an accepted append made durable."""
    fence = appended.fence
    return [
        common_pb2.LogRecord(seq=seq, prev_hash=prev, content_hash=digest, fence=fence, event=ev)
        for (seq, prev, digest), ev in zip(appended.chain, prepared.events, strict=True)
    ]


def log_record(rec: StoredRecord) -> common_pb2.LogRecord:
    """A stored record as returned by reads: hashes verbatim."""
    out = common_pb2.LogRecord(seq=rec.seq, prev_hash=rec.prev_hash, content_hash=rec.hash, fence=rec.fence)
    out.event.ParseFromString(rec.event)
    return out


# -- session rows -------------------------------------------------------------------------------


def plan_new_session(row: SessionRow, now_ns: int) -> NewSession:
    """CreateSession's row: create time defaults to now, nothing journaled yet."""
    created = row.create_time_ns or now_ns
    return NewSession(
        dataclasses.replace(
            row,
            create_time_ns=created,
            update_time_ns=row.update_time_ns or created,
            compute_state=COMPUTE_NONE,
            last_seq=0,
            exec_projection=execstate.EMPTY,
        )
    )


def require_distinct_uids(children: Sequence[SessionRow]) -> None:
    """A fork's children must not share a uid (all or nothing: checked before anything is written)."""
    uids = [c.uid for c in children]
    if len(set(uids)) != len(uids):
        raise SessionExistsError("fork children must have distinct uids")


# -- verify -------------------------------------------------------------------------------------


class ChainCheck:
    """Recomputes a session's chain from genesis, one stored record at a time (spec 3.2)."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.checked = 0
        self.prev = ""

    def feed(self, seq: int, prev_hash: str, digest: str, event: bytes) -> None:
        """Check the next stored record (records come in seq order); raises TamperedError."""
        expected = self.checked + 1
        if seq != expected:
            raise TamperedError(
                self.uid, expected, f"seq {expected} is missing (the next stored record is seq {seq})"
            )
        if prev_hash != self.prev:
            raise TamperedError(self.uid, seq, "prev_hash does not link to the previous record")
        try:
            ev = common_pb2.Event.FromString(event)
        except Exception:
            raise TamperedError(self.uid, seq, "stored event does not decode") from None
        if content_hash(ev, prev_hash, seq) != digest:
            raise TamperedError(self.uid, seq, "content_hash does not match the recomputed hash")
        self.checked = seq
        self.prev = digest

    def finish(self, anchor: tuple[int, str] | None) -> int:
        """After the last stored record: the chain must end at the session row's head anchor
        (None: the session has no row). Returns the number of records checked."""
        if anchor is not None:
            check_head_anchor(self.uid, self.checked, self.prev, anchor)
        return self.checked


def check_head_anchor(uid: str, seq: int, digest: str, anchor: tuple[int, str]) -> None:
    """The head-anchor rule: each append records the session's new head in its row, so a journal
    whose newest records went missing (what is left still links) or gained records is caught."""
    head_seq, head_hash = anchor
    if seq < head_seq:
        raise TamperedError(uid, seq + 1, f"seq {seq + 1} is missing (the session's head is seq {head_seq})")
    if seq > head_seq:
        raise TamperedError(
            uid, head_seq + 1, f"seq {head_seq + 1} is stored beyond the session's head (seq {head_seq})"
        )
    if digest != head_hash:
        raise TamperedError(uid, seq, "the newest record is not the head recorded when it was appended")


# -- fork ---------------------------------------------------------------------------------------


@struct(frozen=True)
class ForkPlan:
    sessions: list[NewSession]
    markers: list[StoredRecord]


def plan_fork(
    parent: SessionHead,
    at_seq: int,
    anchor: tuple[int, str] | None,
    children: Sequence[SessionRow],
    taken: Iterable[str],
    marker: PreparedEvents,
    now_ns: int,
    prefix: ExecProjection = UNKNOWN_EXEC,
) -> ForkPlan:
    """Check a fork and plan its children: each shares the parent's records 1..at_seq (identical
    hashes) and starts its own chain with ``marker`` at at_seq+1, linked to the parent's record
    at_seq. ``anchor`` is that record's (seq, hash) as stored, None if it is not stored;
    ``taken`` the children's uids that already have a row; ``prefix`` the execution state of the
    parent's records 1..at_seq (``execstate.fold`` with fork_seq at_seq)."""
    require_distinct_uids(children)
    if not parent.exists or parent.deleted:
        raise not_found(parent.uid)
    if at_seq < 0 or at_seq > parent.seq:
        raise ConflictError(
            f"fork at_seq {at_seq} is not within 0..{parent.seq}, the head of session {parent.uid}"
        )
    prev = ""
    if at_seq > 0:
        if anchor is None:
            raise TamperedError(
                parent.uid, at_seq, f"the record at seq {at_seq} a fork continues from is missing"
            )
        if at_seq == parent.seq:
            check_head_anchor(parent.uid, anchor[0], anchor[1], (parent.seq, parent.hash))
        prev = anchor[1]
    taken_set = set(taken)
    for child in children:
        if child.uid in taken_set:
            raise session_exists(child.uid)
    (event,), (blob,), (canonical,) = marker.events, marker.blobs, marker.canonical
    marker_seq = at_seq + 1
    digest = chain_hash(canonical, prev, marker_seq)
    state = project_compute_state(COMPUTE_NONE, event)
    sessions = [
        NewSession(
            dataclasses.replace(
                child,
                parent_uid=parent.uid,
                fork_seq=at_seq,
                create_time_ns=child.create_time_ns or now_ns,
                update_time_ns=now_ns,
                compute_state=state,
                last_seq=marker_seq,
                exec_projection=execstate.advance(prefix, event, marker_seq),
            ),
            fence=0,
            last_hash=digest,
        )
        for child in children
    ]
    markers = [StoredRecord(child.uid, marker_seq, prev, digest, 0, blob) for child in children]
    return ForkPlan(sessions, markers)


# -- import -------------------------------------------------------------------------------------


def check_import_chain(uid: str, records: Sequence[common_pb2.LogRecord]) -> str:
    """Records to import must run from seq 1 and each link to the one before; returns the last hash."""
    prev = ""
    for i, rec in enumerate(records, start=1):
        if rec.seq != i or rec.prev_hash != prev:
            raise TamperedError(uid, rec.seq, "records to import do not form a chain from seq 1")
        prev = rec.content_hash
    return prev


@struct(frozen=True)
class ImportPlan:
    session: NewSession
    records: list[StoredRecord]


def plan_import(
    row: SessionRow, records: Sequence[common_pb2.LogRecord], taken: bool, now_ns: int
) -> ImportPlan:
    """Records taken verbatim (stored hashes and fences) into a new session: they must run from
    seq 1 and link (their hashes are not recomputed here; verify does)."""
    prev = check_import_chain(row.uid, records)
    if taken:
        raise session_exists(row.uid)
    state = COMPUTE_NONE
    for rec in records:
        state = project_compute_state(state, rec.event)
    stored = dataclasses.replace(
        row,
        create_time_ns=row.create_time_ns or now_ns,
        update_time_ns=now_ns,
        compute_state=state,
        last_seq=len(records),
        exec_projection=execstate.fold((r.event for r in records), fork_seq=row.fork_seq),
    )
    return ImportPlan(
        NewSession(stored, fence=max((r.fence for r in records), default=0), last_hash=prev),
        [
            StoredRecord(row.uid, r.seq, r.prev_hash, r.content_hash, r.fence, r.event.SerializeToString())
            for r in records
        ],
    )
