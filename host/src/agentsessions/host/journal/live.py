"""The tables beside the journal that keep sessions live: execution leases, idempotency keys and
queued turns, and ``LiveStore``, their write programs over a ``DialectStore``.

* **Leases** (``live_leases``): who runs an execution (owner, expiry, renewed while it runs), how
  many recovery attempts it has had, when the next may start, and whether it waits at an approval
  gate (``parked``). A lease is written in the same transaction as its EXECUTION_START, so an
  execution the journal holds without an END always has one; whoever finds it expired recovers it.
* **Idempotency keys** (``live_idempotency``): what a request carrying ``idempotency-key`` did,
  keyed by the caller's scope and the key, with a digest of the request; they expire after the
  host's retention.
* **Queued turns** (``live_queue``): turns submitted with ``ON_BUSY_ENQUEUE`` while the session was
  busy, in order; one leaves the queue in the transaction that journals its EXECUTION_START.

Nothing here is a journal record: every record stays an ordinary v1 event. Each dialect supplies
the statements (:class:`LiveTransaction`) and creates the tables when it opens (``CREATE TABLE IF
NOT EXISTS``); every write and every read is a program through ``DialectStore.write``, so it
commits in order with the journal writes it goes with, inside the same group commit.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, Protocol, TypeVar, cast, runtime_checkable

from agentsessions.host.journal import rules
from agentsessions.host.journal.dialect import Transaction
from agentsessions.host.journal.engine import DialectStore, HeadView
from agentsessions.host.journal.feed import JournalFeed
from agentsessions.host.journal.store import JournalStore, StoreError
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2

__all__ = [
    "DONE",
    "PARKED",
    "PENDING",
    "QUEUED",
    "RETRY",
    "RUNNING",
    "IdempotencyKeyTaken",
    "KeyRecord",
    "Lease",
    "LiveStore",
    "LiveTransaction",
    "QueuedTurn",
    "QueuedTurnGone",
]

_T = TypeVar("_T")

# Lease states.
RUNNING: Final = "running"  # an owner drives it and renews the expiry
RETRY: Final = "retry"  # an attempt failed; the next may start at next_at
PARKED: Final = "parked"  # it waits at an approval gate for a decision

# Idempotency key states.
PENDING: Final = "pending"  # reserved: what it names (a session, children, an execution) may not exist yet
QUEUED: Final = "queued"  # a Submit that waits in the session's queue
DONE: Final = "done"  # what it names is durable

# Rows a scan returns at most (the recoverer scans again soon).
SCAN_LIMIT: Final = 256


@struct(frozen=True, slots=True)
class Lease:
    """One execution's lease row."""

    session: str
    execution_id: str
    state: str = RUNNING
    owner: str = ""
    expires_at_ns: int = 0
    attempts: int = 0  # recovery attempts so far (the first run is not one)
    next_at_ns: int = 0  # RETRY: not before this
    seen_seq: int = 0  # PARKED: the session head when the gate was last looked at
    last_error: str = ""
    cancel_reason: str | None = None  # a cancel request for the owner (another host's Cancel)


@struct(frozen=True, slots=True)
class KeyRecord:
    """What one idempotency key did."""

    scope: str  # the caller (principal) the key belongs to
    key: str
    method: str
    digest: str  # of the request, so a different request with the same key is told apart
    state: str = PENDING
    session: str = ""
    execution_id: str = ""
    result: str = ""  # JSON: what else the method returns (children, a decision seq, ...)
    created_at_ns: int = 0
    expires_at_ns: int = 0

    def value(self) -> dict[str, Any]:
        loaded = json.loads(self.result) if self.result else {}
        return cast(dict[str, Any], loaded)


@struct(frozen=True, slots=True)
class QueuedTurn:
    """A turn waiting for its session: the ExecRequest it runs, as the execution it will be."""

    session: str
    position: int
    execution_id: str
    request: bytes  # binary agentsessions.v1.ExecRequest
    submitter: str = ""  # the principal that queued it
    created_at_ns: int = 0

    def exec_request(self) -> session_pb2.ExecRequest:
        return session_pb2.ExecRequest.FromString(self.request)


class IdempotencyKeyTaken(StoreError):
    """The key already names another durable outcome (``existing``); nothing was written."""

    def __init__(self, existing: KeyRecord) -> None:
        super().__init__(f"idempotency-key {existing.key!r} is already in use")
        self.existing = existing


class QueuedTurnGone(StoreError):
    """The queued turn is no longer at the head of its session's queue; nothing was written."""


@runtime_checkable
class LiveTransaction(Protocol):
    """The statements on the live tables, inside a dialect's write transaction."""

    async def lease_get(self, uid: str, execution_id: str) -> Lease | None: ...

    async def lease_put(self, lease: Lease, now_ns: int) -> None:
        """Insert or replace the row."""
        ...

    async def lease_add(self, lease: Lease, now_ns: int) -> bool:
        """Insert the row unless the execution has one (then write nothing); whether it did."""
        ...

    async def lease_delete(self, uid: str, execution_id: str) -> None: ...

    async def lease_drop(self, uid: str, execution_id: str, owner: str) -> bool:
        """Delete the row unless another owner holds it (one statement); whether it did."""
        ...

    async def leases_of(self, uid: str) -> list[Lease]: ...

    async def lease_renew(self, owner: str, expires_at_ns: int, now_ns: int) -> list[Lease]:
        """Move the expiry of every RUNNING lease of ``owner``; those leases, renewed."""
        ...

    async def lease_candidates(self, now_ns: int, local_prefix: str, limit: int) -> list[Lease]:
        """Leases someone may have to act on: RUNNING ones expired (or owned by a process of this
        machine, which the caller checks), RETRY ones due, PARKED ones whose session head moved
        past ``seen_seq`` (or whose session is gone)."""
        ...

    async def key_get(self, scope: str, key: str) -> KeyRecord | None: ...

    async def key_put(self, record: KeyRecord) -> None:
        """Insert or replace the row."""
        ...

    async def key_add(self, record: KeyRecord, now_ns: int) -> KeyRecord | None:
        """Insert the row unless the key holds one that has not expired; None when it inserted,
        else the row the key holds (concurrent adds of one key: exactly one inserts)."""
        ...

    async def key_delete(self, scope: str, key: str) -> None: ...

    async def key_purge(self, now_ns: int) -> int:
        """Delete expired keys; how many."""
        ...

    async def queue_list(self, uid: str) -> list[QueuedTurn]:
        """The session's queued turns, in order."""
        ...

    async def queue_insert(
        self, uid: str, execution_id: str, request: bytes, submitter: str, now_ns: int
    ) -> QueuedTurn:
        """Queue a turn behind the session's last one."""
        ...

    async def queue_delete(self, uid: str, execution_id: str) -> bool: ...

    async def queue_idle_sessions(self, limit: int) -> list[str]:
        """Sessions with queued turns and no lease row (nothing in flight)."""
        ...


def _live(tx: Transaction) -> LiveTransaction:
    # One attribute, not the protocol's isinstance (which checks every method): it runs per turn.
    if getattr(tx, "lease_put", None) is None:
        raise StoreError("this journal store keeps no live tables")
    return cast(LiveTransaction, tx)


def _owned_by_other(lease: Lease, owner: str) -> bool:
    return bool(lease.owner) and lease.owner != owner


class LiveStore:
    """The live tables of one ``DialectStore``, and the journal feed it announces to."""

    def __init__(self, store: DialectStore) -> None:
        self.store = store
        self.feed: JournalFeed = store.feed

    @classmethod
    def of(cls, store: JournalStore) -> LiveStore | None:
        """The live tables of ``store``, None for a store that keeps none."""
        return cls(store) if isinstance(store, DialectStore) else None

    async def _run(self, what: str, body: Callable[[LiveTransaction, HeadView], Awaitable[_T]]) -> _T:
        async def program(tx: Transaction, view: HeadView) -> _T:
            return await body(_live(tx), view)

        return await self.store.write(what, program)

    # -- admission: EXECUTION_START with its lease, key and queue entry, in one transaction -----

    async def admit(
        self,
        uid: str,
        events: Sequence[common_pb2.Event],
        expected_head: int,
        lease: Lease,
        *,
        key: KeyRecord | None = None,
        queued: str = "",
    ) -> list[common_pb2.LogRecord]:
        """Append a new execution's first records at ``expected_head`` under a fence minted in the
        same transaction, with its lease; with ``key``, record what the key did (refused with
        IdempotencyKeyTaken when the key already names something else); with ``queued``, take
        that turn off the head of the session's queue (QueuedTurnGone when it is not there)."""
        prepared = rules.prepare_events(events)

        async def body(live: LiveTransaction, view: HeadView) -> rules.Appended:
            now = time.time_ns()
            if queued:
                waiting = await live.queue_list(uid)
                if not waiting or waiting[0].execution_id != queued:
                    raise QueuedTurnGone(f"queued turn {queued} of session {uid} is no longer next")
            # The key first: of two admissions racing with one key (on any host) exactly one adds it.
            added = False
            if key is not None:
                pending = dataclasses.replace(key, state=PENDING, execution_id=lease.execution_id)
                found = await live.key_add(pending, now)
                if found is not None:
                    reserved_for_this = found.state != DONE and found.execution_id == lease.execution_id
                    if not reserved_for_this or found.digest != key.digest:
                        raise IdempotencyKeyTaken(found)
                added = found is None
            tx = cast(Transaction, live)
            head = view.get(uid)
            if head is None:
                head = (await tx.heads([uid]))[uid]
                view.set(head)
            request = rules.AppendRequest(uid, prepared, expected_head, 0, True)
            plan = rules.plan_run([request], {uid: head}, now)
            outcome = plan.outcomes[0]
            if isinstance(outcome, StoreError):
                if added and key is not None:
                    await live.key_delete(key.scope, key.key)  # refused: the write leaves nothing
                raise outcome
            assert isinstance(outcome, rules.Appended)
            await tx.append_rows(plan.rows, list(plan.moved.values()), now)
            for moved in plan.moved.values():
                view.moved(moved, now)
            await live.lease_put(lease, now)
            if key is not None:
                start_seq = outcome.chain[0][0]
                await live.key_put(
                    dataclasses.replace(
                        key,
                        state=DONE,
                        session=uid,
                        execution_id=lease.execution_id,
                        result=json.dumps({"start_seq": start_seq}),
                    )
                )
            if queued:
                await live.queue_delete(uid, queued)
            return outcome

        def announced(appended: rules.Appended) -> list[common_pb2.LogRecord]:
            # At commit, not after our await: watchers learn of the turn even if its caller left.
            records = rules.appended_records(prepared, appended)
            self.feed.appended(uid, records)
            if queued:
                self.feed.queue_changed(uid)
            return records

        async def program(tx: Transaction, view: HeadView) -> rules.Appended:
            return await body(_live(tx), view)

        return await self.store.write("admit turn", program, announced)

    # -- leases ------------------------------------------------------------------------------

    async def lease(self, uid: str, execution_id: str) -> Lease | None:
        async def body(live: LiveTransaction, view: HeadView) -> Lease | None:
            return await live.lease_get(uid, execution_id)

        return await self._run("read lease", body)

    async def leases_of(self, uid: str) -> list[Lease]:
        async def body(live: LiveTransaction, view: HeadView) -> list[Lease]:
            return await live.leases_of(uid)

        return await self._run("read leases", body)

    async def put_lease(self, lease: Lease) -> None:
        async def body(live: LiveTransaction, view: HeadView) -> None:
            await live.lease_put(lease, time.time_ns())

        await self._run("write lease", body)

    async def claim(self, expected: Lease | None, claimed: Lease) -> bool:
        """Replace the lease row with ``claimed`` if it is still ``expected`` (None: absent), so of
        several hosts taking the same lease exactly one does."""

        async def body(live: LiveTransaction, view: HeadView) -> bool:
            if expected is None:
                return await live.lease_add(claimed, time.time_ns())
            current = await live.lease_get(claimed.session, claimed.execution_id)
            if current is None or not _same_version(current, expected):
                return False
            await live.lease_put(claimed, time.time_ns())
            return True

        return await self._run("claim lease", body)

    async def release(self, lease: Lease, owner: str) -> bool:
        """Write ``lease`` (a new state) if ``owner`` still holds the row; False when another
        host took it meanwhile."""

        async def body(live: LiveTransaction, view: HeadView) -> bool:
            current = await live.lease_get(lease.session, lease.execution_id)
            if current is None or _owned_by_other(current, owner):
                return False
            await live.lease_put(lease, time.time_ns())
            return True

        return await self._run("release lease", body)

    async def drop_lease(self, uid: str, execution_id: str, owner: str | None = None) -> bool:
        """Delete the lease (only while ``owner`` holds it, when given)."""

        async def body(live: LiveTransaction, view: HeadView) -> bool:
            if owner is not None:
                return await live.lease_drop(uid, execution_id, owner)
            if await live.lease_get(uid, execution_id) is None:
                return False
            await live.lease_delete(uid, execution_id)
            return True

        return await self._run("drop lease", body)

    async def renew(self, owner: str, ttl_ns: int, finished: Sequence[tuple[str, str]] = ()) -> list[Lease]:
        """Drop the leases of ``finished`` executions (session, execution) ``owner`` still holds,
        then extend every RUNNING lease it holds; those leases (cancel requests included)."""

        async def body(live: LiveTransaction, view: HeadView) -> list[Lease]:
            for uid, execution_id in finished:
                await live.lease_drop(uid, execution_id, owner)
            now = time.time_ns()
            return await live.lease_renew(owner, now + ttl_ns, now)

        return await self._run("renew leases", body)

    async def request_cancel(self, uid: str, execution_id: str, reason: str) -> Lease | None:
        """Ask the owner of a RUNNING lease to cancel its execution; the lease, None without one."""

        async def body(live: LiveTransaction, view: HeadView) -> Lease | None:
            current = await live.lease_get(uid, execution_id)
            if current is None or current.state != RUNNING:
                return current
            asked = dataclasses.replace(current, cancel_reason=reason)
            await live.lease_put(asked, time.time_ns())
            return asked

        lease = await self._run("request cancel", body)
        if lease is not None and lease.cancel_reason is not None:
            self.feed.cancel_requested(uid, execution_id)
        return lease

    async def candidates(self, local_prefix: str, limit: int = SCAN_LIMIT) -> list[Lease]:
        return (await self.scan(local_prefix, limit))[0]

    async def scan(self, local_prefix: str, limit: int = SCAN_LIMIT) -> tuple[list[Lease], list[str]]:
        """In one transaction: the leases someone may have to act on, and the sessions whose
        queued turns wait with nothing in flight."""

        async def body(live: LiveTransaction, view: HeadView) -> tuple[list[Lease], list[str]]:
            due = await live.lease_candidates(time.time_ns(), local_prefix, limit)
            return due, await live.queue_idle_sessions(limit)

        return await self._run("scan leases and queues", body)

    # -- idempotency keys ----------------------------------------------------------------------

    async def key(self, scope: str, key: str) -> KeyRecord | None:
        """The key's record, None when there is none or it expired."""

        async def body(live: LiveTransaction, view: HeadView) -> KeyRecord | None:
            found = await live.key_get(scope, key)
            if found is None or found.expires_at_ns <= time.time_ns():
                return None
            return found

        return await self._run("read idempotency key", body)

    async def reserve_key(self, record: KeyRecord) -> KeyRecord:
        """Record ``record`` unless the key names something already (and has not expired); the
        record the key holds afterwards."""

        async def body(live: LiveTransaction, view: HeadView) -> KeyRecord:
            found = await live.key_add(record, time.time_ns())
            return record if found is None else found

        return await self._run("reserve idempotency key", body)

    async def put_key(self, record: KeyRecord) -> None:
        async def body(live: LiveTransaction, view: HeadView) -> None:
            await live.key_put(record)

        await self._run("write idempotency key", body)

    async def purge_keys(self) -> int:
        async def body(live: LiveTransaction, view: HeadView) -> int:
            return await live.key_purge(time.time_ns())

        return await self._run("purge idempotency keys", body)

    # -- queued turns ----------------------------------------------------------------------------

    async def queue(self, uid: str) -> list[QueuedTurn]:
        async def body(live: LiveTransaction, view: HeadView) -> list[QueuedTurn]:
            return await live.queue_list(uid)

        return await self._run("read turn queue", body)

    async def enqueue(
        self, uid: str, execution_id: str, request: bytes, submitter: str, key: KeyRecord | None = None
    ) -> QueuedTurn:
        """Queue a turn behind the session's others; with ``key``, record it as that key's outcome
        (IdempotencyKeyTaken when the key already names something)."""

        async def body(live: LiveTransaction, view: HeadView) -> QueuedTurn:
            now = time.time_ns()
            if key is not None:
                queued = dataclasses.replace(key, state=QUEUED, session=uid, execution_id=execution_id)
                found = await live.key_add(queued, now)
                if found is not None:
                    reserved_for_this = found.state == PENDING and found.execution_id == execution_id
                    if not reserved_for_this or found.digest != key.digest:
                        raise IdempotencyKeyTaken(found)
                    await live.key_put(queued)
            return await live.queue_insert(uid, execution_id, request, submitter, now)

        entry = await self._run("queue turn", body)
        self.feed.queue_changed(uid)
        return entry

    async def dequeue(self, uid: str, execution_id: str) -> bool:
        """Drop a queued turn that will never run (its session is gone, it cannot be admitted)."""

        async def body(live: LiveTransaction, view: HeadView) -> bool:
            return await live.queue_delete(uid, execution_id)

        dropped = await self._run("drop queued turn", body)
        if dropped:
            self.feed.queue_changed(uid)
        return dropped

    async def idle_queues(self, limit: int = SCAN_LIMIT) -> list[str]:
        async def body(live: LiveTransaction, view: HeadView) -> list[str]:
            return await live.queue_idle_sessions(limit)

        return await self._run("scan turn queues", body)


def _same_version(a: Lease, b: Lease) -> bool:
    return (a.state, a.owner, a.attempts, a.expires_at_ns, a.next_at_ns) == (
        b.state,
        b.owner,
        b.attempts,
        b.expires_at_ns,
        b.next_at_ns,
    )
