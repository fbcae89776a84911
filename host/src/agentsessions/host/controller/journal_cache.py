"""A bounded per-session cache of decoded journal events, refreshed from the store's head.

Exec hands the harness the whole history every turn; re-reading and re-decoding every
record each turn would make turn cost grow with the session. The store stays the authority:
every load checks the head and reads only what is new, and a head that does not extend the
cached chain (another writer, a purge) drops the entry.
"""

from __future__ import annotations

from collections import OrderedDict

from agentsessions.host.journal.store import JournalStore
from agentsessions.v1 import common_pb2


class JournalCache:
    def __init__(self, store: JournalStore, max_sessions: int = 256) -> None:
        self._store = store
        self._max = max_sessions
        self._entries: OrderedDict[str, tuple[list[common_pb2.Event], str]] = OrderedDict()

    async def events(self, uid: str) -> list[common_pb2.Event]:
        """Every event of the session in seq order (the list is shared: do not mutate it)."""
        head = await self._store.head(uid)
        entry = self._entries.get(uid)
        if entry is not None:
            events, last_hash = entry
            if len(events) == head.seq and last_hash == head.hash:
                self._entries.move_to_end(uid)
                return events
            if len(events) < head.seq:
                fresh = await self._store.read(uid, len(events) + 1, 0)
                if fresh and fresh[0].prev_hash == last_hash:
                    events.extend(r.event for r in fresh)
                    self._remember(uid, events, fresh[-1].content_hash)
                    return events
        records = await self._store.read(uid, 1, 0)
        events = [r.event for r in records]
        self._remember(uid, events, records[-1].content_hash if records else "")
        return events

    def appended(self, uid: str, records: list[common_pb2.LogRecord]) -> None:
        """Extend a cached entry with records this host just made durable."""
        entry = self._entries.get(uid)
        if entry is None or not records:
            return
        events, last_hash = entry
        if records[0].prev_hash != last_hash or records[0].seq != len(events) + 1:
            del self._entries[uid]
            return
        events.extend(r.event for r in records)
        self._entries[uid] = (events, records[-1].content_hash)

    def forget(self, uid: str) -> None:
        self._entries.pop(uid, None)

    def _remember(self, uid: str, events: list[common_pb2.Event], last_hash: str) -> None:
        self._entries[uid] = (events, last_hash)
        self._entries.move_to_end(uid)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
