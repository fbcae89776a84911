"""A bounded per-session cache of journal events and their execution index, refreshed from the
store's head. The events are kept encoded (``eventlog.EventLog``: the collector walks none of them).

Exec hands the harness the whole history every turn and inspects the latest execution; re-reading,
re-decoding and re-indexing every record each turn would make turn cost grow with the session.
The store stays the authority: every load checks the head and reads only what is new, and a head
that does not extend the cached chain (another writer, a purge) drops the entry.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import field

from agentsessions.host.controller.baselines import Baselines
from agentsessions.host.controller.eventlog import EventLog, Events, blob_of
from agentsessions.host.controller.executions import Execution, ExecutionIndex
from agentsessions.host.journal.store import Head, JournalStore
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2


@struct
class _Entry:
    events: EventLog
    last_hash: str
    index: ExecutionIndex | None = field(default=None)
    baselines: Baselines | None = field(default=None)


class JournalCache:
    def __init__(self, store: JournalStore, max_sessions: int = 256) -> None:
        self._store = store
        self._max = max_sessions
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    async def events(self, uid: str) -> EventLog:
        """Every event of the session in seq order (the log is shared and only ever grows)."""
        return (await self._entry(uid)).events

    async def executions(
        self, uid: str, fork_seq: int, head: Head | None = None
    ) -> tuple[EventLog, list[Execution]]:
        """The events and their executions in first-seen order (InvalidExecutionLogError if malformed).

        ``head``: the session's head as just read with its row; a cached entry that ends there is
        current without asking the store again."""
        entry = await self._entry(uid, head)
        if entry.index is None or entry.index.fork_seq != fork_seq:
            entry.index = ExecutionIndex(fork_seq)
        try:
            entry.index.feed(entry.events)
        except Exception:
            entry.index = None
            raise
        return entry.events, entry.index.order

    def written(self, uid: str) -> EventLog | None:
        """The session's events as this host last read and wrote them, without asking the store
        (None: nothing cached). For a turn looking back at its own records under its fence: a
        record another writer added meanwhile makes the turn's next append fail anyway."""
        entry = self._entries.get(uid)
        return None if entry is None else entry.events

    def baselines(self, uid: str, events: Sequence[common_pb2.Event]) -> Baselines:
        """Where the LIFECYCLE_BASELINEs of ``events`` (the session's cached list) are, kept with
        the entry so each record is looked at once (compaction.py)."""
        entry = self._entries.get(uid)
        if entry is None or entry.events is not events:
            return Baselines(events)
        if entry.baselines is None:
            entry.baselines = Baselines(events)
        return entry.baselines

    async def _entry(self, uid: str, at: Head | None = None) -> _Entry:
        entry = self._entries.get(uid)
        if entry is not None and at is not None and (len(entry.events), entry.last_hash) == (at.seq, at.hash):
            self._entries.move_to_end(uid)
            return entry
        if entry is not None and await self._current(uid, entry):
            self._entries.move_to_end(uid)
            return entry
        # Nothing cached (or nothing the store's head extends): the whole journal is read.
        records = await self._store.read(uid, 1, 0)
        entry = _Entry(EventLog(r.event for r in records), records[-1].content_hash if records else "")
        self._remember(uid, entry)
        return entry

    async def _current(self, uid: str, entry: _Entry) -> bool:
        """Bring ``entry`` up to the store's head; False when the head does not extend it."""
        head = await self._store.head(uid)
        if self._entries.get(uid) is not entry:
            return False
        if len(entry.events) == head.seq and entry.last_hash == head.hash:
            return True
        if len(entry.events) >= head.seq:
            return False
        fresh = await self._store.read(uid, len(entry.events) + 1, 0)
        # While the read was in flight this host's own appends may have extended the entry, or
        # dropped it: only what follows the entry as it is now is added, and only to it.
        if self._entries.get(uid) is not entry:
            return False
        known = len(entry.events)
        fresh = [r for r in fresh if r.seq > known]
        linked = bool(fresh) and fresh[0].seq == known + 1 and fresh[0].prev_hash == entry.last_hash
        if linked:
            entry.events.extend(r.event for r in fresh)
            entry.last_hash = fresh[-1].content_hash
        return linked or (not fresh and known >= head.seq)

    def appended(self, uid: str, records: list[common_pb2.LogRecord]) -> None:
        """Extend a cached entry with records this host just made durable."""
        entry = self._entries.get(uid)
        if entry is None or not records:
            return
        if records[0].prev_hash != entry.last_hash or records[0].seq != len(entry.events) + 1:
            del self._entries[uid]
            return
        entry.events.extend(r.event for r in records)
        entry.last_hash = records[-1].content_hash

    def forget(self, uid: str) -> None:
        self._entries.pop(uid, None)

    def _remember(self, uid: str, entry: _Entry) -> None:
        self._entries[uid] = entry
        self._entries.move_to_end(uid)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)


class Prefix(Events):
    """Events ``start`` to ``length`` of a cached journal log, as they are now, without a copy
    (the cache only appends, so the prefix never changes): a turn's Start.history at turn
    10,000 would otherwise copy 50,000 references. ``start``: a compacted session's history
    begins at its latest baseline (compaction.py)."""

    __slots__ = ("_events", "_length", "_start")

    def __init__(self, events: Sequence[common_pb2.Event], length: int | None = None, start: int = 0) -> None:
        self._events = events
        self._start = start
        self._length = (len(events) if length is None else length) - start

    @property
    def source(self) -> Sequence[common_pb2.Event]:
        """The log this is a prefix of (it only grows at its end)."""
        return self._events

    @property
    def start(self) -> int:
        """Where in :attr:`source` the prefix begins."""
        return self._start

    def blob(self, index: int) -> bytes:
        """The encoding of ``self[index]`` (0 <= index < len(self))."""
        return blob_of(self._events, self._start + index)

    def __len__(self) -> int:
        return self._length

    def _at(self, index: int) -> common_pb2.Event:
        return self._events[self._start + index]

    def __iter__(self) -> Iterator[common_pb2.Event]:
        end = self._start + self._length
        if isinstance(self._events, EventLog):
            return self._events.between(self._start, end)
        return itertools.islice(self._events, self._start, end)
