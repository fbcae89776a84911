"""In-process journal store: the reference behaviour of the store seam, kept in dicts.

Nothing is durable beyond the process. Each operation runs without awaiting in between, so on
one event loop every append is atomic and appends are totally ordered. Events are kept as their
serialized bytes, as the database stores keep them, so ``verify`` recomputes from what is stored.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

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
    SessionExistsError,
    SessionNotFoundError,
    SessionRow,
    StoreError,
    TamperedError,
)
from agentsessions.v1 import common_pb2, harness_registry_pb2

__all__ = ["MemoryStore"]


@dataclass(frozen=True)
class _Record:
    seq: int
    prev_hash: str
    hash: str
    fence: int
    event: bytes  # binary agentsessions.v1.Event, as stored


@dataclass
class _Session:
    row: SessionRow  # its update_time_ns, compute_state and last_seq are superseded by the fields below
    fence: int = 0
    compute_state: str = COMPUTE_NONE
    update_time_ns: int = 0
    deleted: bool = False
    # The head as of the last append: verify notices the newest records going missing.
    last_seq: int = 0
    last_hash: str = ""


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


def _log_record(rec: _Record) -> common_pb2.LogRecord:
    out = common_pb2.LogRecord(seq=rec.seq, prev_hash=rec.prev_hash, content_hash=rec.hash, fence=rec.fence)
    out.event.ParseFromString(rec.event)
    return out


class MemoryStore:
    """JournalStore kept in process memory."""

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        # Records are immutable, so a fork's children share the parent's prefix records.
        self._journals: dict[str, list[_Record]] = {}
        self._harnesses: dict[str, bytes] = {}
        self._receipts: dict[tuple[str, str], bytes] = {}
        self._closed = False

    # -- session rows ----------------------------------------------------------------------

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise StoreError(f"{what}: store is closed")

    def _records(self, uid: str) -> list[_Record]:
        return self._journals.get(uid, [])

    def _public_row(self, uid: str, session: _Session) -> SessionRow:
        return _own_row(
            dataclasses.replace(
                session.row,
                update_time_ns=session.update_time_ns,
                compute_state=session.compute_state,
                last_seq=len(self._records(uid)),
            )
        )

    def _live(self, uid: str) -> _Session:
        session = self._sessions.get(uid)
        if session is None or session.deleted:
            raise SessionNotFoundError(f"session {uid} not found")
        return session

    async def create_session(self, row: SessionRow) -> SessionRow:
        self._check_open("create session")
        if row.uid in self._sessions:
            raise SessionExistsError(f"session {row.uid} already exists")
        created = row.create_time_ns or time.time_ns()
        stored = dataclasses.replace(
            row,
            create_time_ns=created,
            update_time_ns=row.update_time_ns or created,
            compute_state=COMPUTE_NONE,
            last_seq=0,
        )
        self._sessions[row.uid] = _Session(row=_own_row(stored), update_time_ns=stored.update_time_ns)
        return self._public_row(row.uid, self._sessions[row.uid])

    async def get_session(self, uid: str) -> SessionRow | None:
        self._check_open("get session")
        session = self._sessions.get(uid)
        if session is None or session.deleted:
            return None
        return self._public_row(uid, session)

    async def list_sessions(
        self, project: str, page_size: int, page_token: str
    ) -> tuple[list[SessionRow], str]:
        self._check_open("list sessions")
        size = clamp_page_size(page_size)
        after = decode_page_token(page_token) if page_token else None
        keyed = sorted(
            (-s.row.create_time_ns, uid)
            for uid, s in self._sessions.items()
            if not s.deleted and s.row.project == project
        )
        if after is not None:
            cursor = (-after[0], after[1])
            keyed = [k for k in keyed if k > cursor]
        page = keyed[: size + 1]
        rows = [self._public_row(uid, self._sessions[uid]) for _, uid in page[:size]]
        token = ""
        if len(page) > size:
            token = encode_page_token(rows[-1].create_time_ns, rows[-1].uid)
        return rows, token

    async def delete_session(self, uid: str, *, purge: bool) -> SessionRow:
        self._check_open("delete session")
        session = self._live(uid)
        session.update_time_ns = time.time_ns()
        deleted = self._public_row(uid, session)
        session.deleted = True
        if purge:
            self._journals.pop(uid, None)
            session.last_seq, session.last_hash = 0, ""
            for key in [k for k in self._receipts if k[0] == uid]:
                del self._receipts[key]
        return deleted

    async def new_fence(self, uid: str, expected_head: int | None = None) -> int:
        self._check_open("new fence")
        if expected_head is not None:
            head = (await self.head(uid)).seq
            if head != expected_head:
                raise ConflictError(
                    f"expected head {expected_head} does not match head {head} of session {uid}"
                )
        session = self._sessions.get(uid)
        if session is None:
            now = time.time_ns()
            session = _Session(row=SessionRow(uid=uid, project="", create_time_ns=now), update_time_ns=now)
            self._sessions[uid] = session
        session.fence += 1
        return session.fence

    # -- journal ---------------------------------------------------------------------------

    async def append(
        self,
        uid: str,
        events: Sequence[common_pb2.Event],
        *,
        expected_head: int,
        fence: int,
        mint_fence: bool = False,
    ) -> list[common_pb2.LogRecord]:
        self._check_open("append")
        normalized = [normalize_event(ev) for ev in events]
        session = self._live(uid)
        records = self._journals.setdefault(uid, [])
        head = len(records)
        if expected_head != head:
            raise ConflictError(
                f"expected_last_seq {expected_head} does not match head {head} of session {uid}"
            )
        if mint_fence:
            fence = session.fence + 1
            session.fence = fence
        elif fence < session.fence:
            raise FencedError(f"fence {fence} is superseded by fence {session.fence} of session {uid}")
        prev = records[-1].hash if records else ""
        out: list[common_pb2.LogRecord] = []
        state = session.compute_state
        for seq, ev in enumerate(normalized, start=head + 1):
            digest = chain_hash(canonical_event(ev), prev, seq)
            records.append(_Record(seq, prev, digest, fence, ev.SerializeToString()))
            out.append(
                common_pb2.LogRecord(seq=seq, prev_hash=prev, content_hash=digest, fence=fence, event=ev)
            )
            state = project_compute_state(state, ev)
            prev = digest
        if out:
            session.compute_state = state
            session.update_time_ns = time.time_ns()
            session.last_seq, session.last_hash = out[-1].seq, out[-1].content_hash
        return out

    async def read(self, uid: str, from_seq: int = 1, to_seq: int = 0) -> list[common_pb2.LogRecord]:
        self._check_open("read")
        start = max(1, from_seq)
        return [_log_record(r) for r in self._records(uid)[start - 1 :] if to_seq <= 0 or r.seq <= to_seq]

    async def head(self, uid: str) -> Head:
        self._check_open("head")
        records = self._records(uid)
        if not records:
            return Head(seq=0, hash="")
        return Head(seq=records[-1].seq, hash=records[-1].hash)

    async def verify(self, uid: str) -> int:
        self._check_open("verify")
        prev = ""
        for expected, rec in enumerate(self._records(uid), start=1):
            if rec.seq != expected:
                raise TamperedError(
                    uid, expected, f"seq {expected} is missing (next stored seq is {rec.seq})"
                )
            if rec.prev_hash != prev:
                raise TamperedError(uid, rec.seq, "prev_hash does not link to the previous record")
            try:
                ev = common_pb2.Event.FromString(rec.event)
            except Exception:
                raise TamperedError(uid, rec.seq, "stored event does not decode") from None
            if content_hash(ev, prev, rec.seq) != rec.hash:
                raise TamperedError(uid, rec.seq, "content_hash does not match the recomputed hash")
            prev = rec.hash
        session = self._sessions.get(uid)
        if session is not None and (session.last_seq, session.last_hash) != (len(self._records(uid)), prev):
            seq = min(session.last_seq, len(self._records(uid)) + 1)
            raise TamperedError(
                uid,
                seq,
                f"the journal ends at seq {len(self._records(uid))}, not at the head "
                f"recorded when seq {session.last_seq} was appended",
            )
        return len(self._records(uid))

    async def fork(
        self,
        parent_uid: str,
        at_seq: int,
        children: Sequence[SessionRow],
        marker: common_pb2.Event,
    ) -> list[SessionRow]:
        self._check_open("fork")
        if not children:
            return []
        self._live(parent_uid)
        records = self._records(parent_uid)
        if at_seq < 0 or at_seq > len(records):
            raise ConflictError(f"fork at_seq {at_seq} is beyond head {len(records)} of session {parent_uid}")
        require_distinct_uids(children)
        uids = [c.uid for c in children]
        for uid in uids:
            if uid in self._sessions:
                raise SessionExistsError(f"session {uid} already exists")
        marker = normalize_event(marker)
        prev = records[at_seq - 1].hash if at_seq > 0 else ""
        marker_seq = at_seq + 1
        marker_record = _Record(
            marker_seq,
            prev,
            chain_hash(canonical_event(marker), prev, marker_seq),
            0,
            marker.SerializeToString(),
        )
        state = project_compute_state(COMPUTE_NONE, marker)
        now = time.time_ns()
        stored: list[SessionRow] = []
        for child in children:
            row = dataclasses.replace(
                child,
                parent_uid=parent_uid,
                fork_seq=at_seq,
                create_time_ns=child.create_time_ns or now,
                update_time_ns=now,
            )
            self._sessions[child.uid] = _Session(
                row=_own_row(row),
                compute_state=state,
                update_time_ns=now,
                last_seq=marker_seq,
                last_hash=marker_record.hash,
            )
            self._journals[child.uid] = [*records[:at_seq], marker_record]
            stored.append(self._public_row(child.uid, self._sessions[child.uid]))
        return stored

    async def import_records(self, row: SessionRow, records: Sequence[common_pb2.LogRecord]) -> SessionRow:
        """Create ``row`` holding ``records`` verbatim (stored hashes and fences), atomically.

        The records must run from seq 1 and link; their hashes are not recomputed (``verify`` does)."""
        self._check_open("import")
        state, fence = imported_chain_state(row.uid, records)
        if row.uid in self._sessions:
            raise SessionExistsError(f"session {row.uid} already exists")
        now = time.time_ns()
        stored = dataclasses.replace(row, create_time_ns=row.create_time_ns or now, update_time_ns=now)
        self._sessions[row.uid] = _Session(
            row=_own_row(stored),
            fence=fence,
            compute_state=state,
            update_time_ns=now,
            last_seq=len(records),
            last_hash=records[-1].content_hash if records else "",
        )
        self._journals[row.uid] = [
            _Record(r.seq, r.prev_hash, r.content_hash, r.fence, r.event.SerializeToString()) for r in records
        ]
        return self._public_row(row.uid, self._sessions[row.uid])

    def corrupt_record(
        self, uid: str, seq: int, *, event: bytes | None = None, hash: str | None = None
    ) -> None:
        """Test hook: overwrite a stored record's event bytes and/or hash, as an attacker with
        write access to the storage could."""
        records = self._records(uid)
        rec = records[seq - 1]
        if event is not None:
            rec = dataclasses.replace(rec, event=event)
        if hash is not None:
            rec = dataclasses.replace(rec, hash=hash)
        records[seq - 1] = rec

    def drop_newest_record(self, uid: str) -> None:
        """Test hook: delete a session's newest stored record, as an attacker could."""
        self._records(uid).pop()

    def stored_event(self, uid: str, seq: int) -> bytes:
        """Test hook: the stored bytes of a record's event."""
        return self._records(uid)[seq - 1].event

    # -- harness registry and tool receipts ------------------------------------------------

    async def put_harness(self, registration: harness_registry_pb2.HarnessRegistration) -> None:
        self._check_open("put harness")
        name = registration.metadata.name
        if not name:
            raise StoreError("put_harness: registration has no metadata.name")
        self._harnesses[name] = registration.SerializeToString()

    async def get_harness(self, name: str) -> harness_registry_pb2.HarnessRegistration | None:
        self._check_open("get harness")
        blob = self._harnesses.get(name)
        return None if blob is None else harness_registry_pb2.HarnessRegistration.FromString(blob)

    async def list_harnesses(self) -> list[harness_registry_pb2.HarnessRegistration]:
        self._check_open("list harnesses")
        return [
            harness_registry_pb2.HarnessRegistration.FromString(self._harnesses[n])
            for n in sorted(self._harnesses)
        ]

    async def get_tool_receipt(self, uid: str, idempotency_key: str) -> common_pb2.ToolResult | None:
        self._check_open("get tool receipt")
        blob = self._receipts.get((uid, idempotency_key))
        return None if blob is None else common_pb2.ToolResult.FromString(blob)

    async def put_tool_receipt(self, uid: str, idempotency_key: str, result: common_pb2.ToolResult) -> None:
        self._check_open("put tool receipt")
        self._receipts.setdefault((uid, idempotency_key), result.SerializeToString())

    async def session_uids(self) -> list[str]:
        self._check_open("list session uids")
        return sorted(set(self._sessions) | {uid for uid, records in self._journals.items() if records})

    async def close(self) -> None:
        self._closed = True
