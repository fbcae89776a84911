"""The live tables (``agentsessions.host.journal.live``) of the memory dialect, kept in dicts.

Statements never suspend, like the rest of the memory dialect: a program is atomic on the loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agentsessions.host.journal.live import PARKED, RETRY, RUNNING, KeyRecord, Lease, QueuedTurn

__all__ = ["LiveTables", "MemoryLiveStatements"]


@dataclass
class LiveTables:
    leases: dict[tuple[str, str], Lease] = field(default_factory=dict)
    keys: dict[tuple[str, str], KeyRecord] = field(default_factory=dict)
    queues: dict[str, list[QueuedTurn]] = field(default_factory=dict)
    next_position: int = 0


class _SessionState(Protocol):
    last_seq: int
    deleted: bool


class _Memory(Protocol):
    @property
    def live(self) -> LiveTables: ...

    @property
    def sessions(self) -> Mapping[str, _SessionState]: ...


class MemoryLiveStatements:
    """Mixed into the memory dialect's transaction (which holds the dicts as ``_m``)."""

    _m: _Memory

    async def lease_get(self, uid: str, execution_id: str) -> Lease | None:
        return self._m.live.leases.get((uid, execution_id))

    async def lease_put(self, lease: Lease, now_ns: int) -> None:
        self._m.live.leases[(lease.session, lease.execution_id)] = lease

    async def lease_add(self, lease: Lease, now_ns: int) -> bool:
        leases = self._m.live.leases
        if (lease.session, lease.execution_id) in leases:
            return False
        leases[(lease.session, lease.execution_id)] = lease
        return True

    async def lease_delete(self, uid: str, execution_id: str) -> None:
        self._m.live.leases.pop((uid, execution_id), None)

    async def leases_of(self, uid: str) -> list[Lease]:
        return [lease for (session, _), lease in sorted(self._m.live.leases.items()) if session == uid]

    async def lease_renew(self, owner: str, expires_at_ns: int, now_ns: int) -> list[Lease]:
        leases = self._m.live.leases
        renewed: list[Lease] = []
        for where, lease in leases.items():
            if lease.owner == owner and lease.state == RUNNING:
                leases[where] = lease = dataclasses.replace(lease, expires_at_ns=expires_at_ns)
                renewed.append(lease)
        return renewed

    async def lease_candidates(self, now_ns: int, local_prefix: str, limit: int) -> list[Lease]:
        found: list[Lease] = []
        for lease in self._m.live.leases.values():
            if lease.state == RUNNING:
                due = lease.expires_at_ns < now_ns or lease.owner.startswith(local_prefix)
            elif lease.state == RETRY:
                due = lease.next_at_ns <= now_ns
            elif lease.state == PARKED:
                session = self._m.sessions.get(lease.session)
                due = session is None or session.deleted or session.last_seq != lease.seen_seq
            else:
                due = True
            if due:
                found.append(lease)
        return found[:limit]

    async def key_get(self, scope: str, key: str) -> KeyRecord | None:
        return self._m.live.keys.get((scope, key))

    async def key_put(self, record: KeyRecord) -> None:
        self._m.live.keys[(record.scope, record.key)] = record

    async def key_add(self, record: KeyRecord, now_ns: int) -> KeyRecord | None:
        keys = self._m.live.keys
        found = keys.get((record.scope, record.key))
        if found is not None and found.expires_at_ns > now_ns:
            return found
        keys[(record.scope, record.key)] = record
        return None

    async def key_delete(self, scope: str, key: str) -> None:
        self._m.live.keys.pop((scope, key), None)

    async def key_purge(self, now_ns: int) -> int:
        keys = self._m.live.keys
        expired = [where for where, record in keys.items() if record.expires_at_ns <= now_ns]
        for where in expired:
            del keys[where]
        return len(expired)

    async def queue_list(self, uid: str) -> list[QueuedTurn]:
        return list(self._m.live.queues.get(uid, ()))

    async def queue_insert(
        self, uid: str, execution_id: str, request: bytes, submitter: str, now_ns: int
    ) -> QueuedTurn:
        tables = self._m.live
        tables.next_position += 1
        entry = QueuedTurn(uid, tables.next_position, execution_id, request, submitter, now_ns)
        tables.queues.setdefault(uid, []).append(entry)
        return entry

    async def queue_delete(self, uid: str, execution_id: str) -> bool:
        queue = self._m.live.queues.get(uid)
        if not queue:
            return False
        kept = [entry for entry in queue if entry.execution_id != execution_id]
        if len(kept) == len(queue):
            return False
        if kept:
            self._m.live.queues[uid] = kept
        else:
            del self._m.live.queues[uid]
        return True

    async def queue_idle_sessions(self, limit: int) -> list[str]:
        busy = {session for session, _ in self._m.live.leases}
        return sorted(uid for uid in self._m.live.queues if uid not in busy)[:limit]
