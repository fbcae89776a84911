"""The live tables (``agentsessions.host.journal.live``) of the memory dialect, kept in dicts.

Statements never suspend, like the rest of the memory dialect: a program is atomic on the loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import field
from typing import Protocol

from agentsessions.host.journal.live import PARKED, RETRY, RUNNING, KeyRecord, Lease, QueuedTurn
from agentsessions.sdk.structs import struct

__all__ = ["LiveTables", "MemoryLiveStatements", "SessionState"]


@struct
class LiveTables:
    leases: dict[tuple[str, str], Lease] = field(default_factory=dict)
    keys: dict[tuple[str, str], KeyRecord] = field(default_factory=dict)
    queues: dict[str, list[QueuedTurn]] = field(default_factory=dict)
    next_position: int = 0


class SessionState(Protocol):
    """What the statements read of a memory session: its head and whether it is deleted."""

    @property
    def last_seq(self) -> int: ...

    @property
    def deleted(self) -> bool: ...


class MemoryLiveStatements:
    """Mixed into the memory dialect's transaction, which supplies its dicts."""

    def _live_tables(self) -> LiveTables:
        raise NotImplementedError

    def _session_states(self) -> Mapping[str, SessionState]:
        raise NotImplementedError

    async def lease_get(self, uid: str, execution_id: str) -> Lease | None:
        return self._live_tables().leases.get((uid, execution_id))

    async def lease_put(self, lease: Lease, now_ns: int) -> None:
        self._live_tables().leases[(lease.session, lease.execution_id)] = lease

    async def lease_add(self, lease: Lease, now_ns: int) -> bool:
        leases = self._live_tables().leases
        if (lease.session, lease.execution_id) in leases:
            return False
        leases[(lease.session, lease.execution_id)] = lease
        return True

    async def lease_delete(self, uid: str, execution_id: str) -> None:
        self._live_tables().leases.pop((uid, execution_id), None)

    async def lease_drop(self, uid: str, execution_id: str, owner: str) -> bool:
        leases = self._live_tables().leases
        current = leases.get((uid, execution_id))
        if current is None or (current.owner and current.owner != owner):
            return False
        del leases[(uid, execution_id)]
        return True

    async def leases_of(self, uid: str) -> list[Lease]:
        return [lease for (session, _), lease in sorted(self._live_tables().leases.items()) if session == uid]

    async def lease_renew(self, owner: str, expires_at_ns: int, now_ns: int) -> list[Lease]:
        leases = self._live_tables().leases
        renewed: list[Lease] = []
        for where, lease in leases.items():
            if lease.owner == owner and lease.state == RUNNING:
                leases[where] = lease = dataclasses.replace(lease, expires_at_ns=expires_at_ns)
                renewed.append(lease)
        return renewed

    async def lease_candidates(self, now_ns: int, local_prefix: str, limit: int) -> list[Lease]:
        found: list[Lease] = []
        for lease in self._live_tables().leases.values():
            if lease.state == RUNNING:
                due = lease.expires_at_ns < now_ns or lease.owner.startswith(local_prefix)
            elif lease.state == RETRY:
                due = lease.next_at_ns <= now_ns
            elif lease.state == PARKED:
                session = self._session_states().get(lease.session)
                due = session is None or session.deleted or session.last_seq != lease.seen_seq
            else:
                due = True
            if due:
                found.append(lease)
        return found[:limit]

    async def key_get(self, scope: str, key: str) -> KeyRecord | None:
        return self._live_tables().keys.get((scope, key))

    async def key_put(self, record: KeyRecord) -> None:
        self._live_tables().keys[(record.scope, record.key)] = record

    async def key_add(self, record: KeyRecord, now_ns: int) -> KeyRecord | None:
        keys = self._live_tables().keys
        found = keys.get((record.scope, record.key))
        if found is not None and found.expires_at_ns > now_ns:
            return found
        keys[(record.scope, record.key)] = record
        return None

    async def key_delete(self, scope: str, key: str) -> None:
        self._live_tables().keys.pop((scope, key), None)

    async def key_purge(self, now_ns: int) -> int:
        keys = self._live_tables().keys
        expired = [where for where, record in keys.items() if record.expires_at_ns <= now_ns]
        for where in expired:
            del keys[where]
        return len(expired)

    async def queue_list(self, uid: str) -> list[QueuedTurn]:
        return list(self._live_tables().queues.get(uid, ()))

    async def queue_insert(
        self, uid: str, execution_id: str, request: bytes, submitter: str, now_ns: int
    ) -> QueuedTurn:
        tables = self._live_tables()
        tables.next_position += 1
        entry = QueuedTurn(uid, tables.next_position, execution_id, request, submitter, now_ns)
        tables.queues.setdefault(uid, []).append(entry)
        return entry

    async def queue_delete(self, uid: str, execution_id: str) -> bool:
        queue = self._live_tables().queues.get(uid)
        if not queue:
            return False
        kept = [entry for entry in queue if entry.execution_id != execution_id]
        if len(kept) == len(queue):
            return False
        if kept:
            self._live_tables().queues[uid] = kept
        else:
            del self._live_tables().queues[uid]
        return True

    async def queue_idle_sessions(self, limit: int) -> list[str]:
        busy = {session for session, _ in self._live_tables().leases}
        return sorted(uid for uid in self._live_tables().queues if uid not in busy)[:limit]
