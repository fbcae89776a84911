"""A session's journal events as the journal cache keeps them: encoded, the latest few also decoded.

The cache holds every event of every cached session for as long as the session stays cached.
Kept as protobuf messages, each event is an object the cyclic collector walks at every
collection of its generation, and on a busy host they were most of what the collector walked:
~5 a turn, 72,000 of the 98,000 objects a middle collection found under the load benchmark's
readers, which made that collection take 110-170 ms (bench/NOTEBOOK.md, "The collector's pauses").
Bytes are not walked at all. So :class:`EventLog` keeps each event's encoding, and the decoded
message of only the last :data:`RECENT` events: a turn reads its own records and the latest
execution's, which are among them. An older event is decoded each time it is read (about a
microsecond for a small one); every reader of old events (replay, recovery, a fork's copy, a
harness's history) reads it once per request.

Each event's kind is kept too, one byte an event (a bytearray, also never walked), so a search
for a rare kind (a baseline, a suspend marker) from the end of a long journal decodes only the
records of that kind (:func:`last_of_kind`).

The log only grows at its end, so a reader may keep the log and a length as a snapshot
(:class:`agentsessions.host.controller.journal_cache.Prefix`), and the encoded bytes go to a
harness's ``Start.history`` as they are (``harnesslink``), without encoding the event again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from agentsessions.v1 import common_pb2

# Decoded events kept at the log's end: a few turns' records (an echo turn journals 5).
RECENT = 32

_decode = common_pb2.Event.FromString
_OTHER_KIND = 255  # a kind number that does not fit a byte (none does today): always decoded


class Events(Sequence[common_pb2.Event]):
    """A read-only sequence of events defined by its length and :meth:`_at` (a valid index's event)."""

    __slots__ = ()

    def _at(self, index: int) -> common_pb2.Event:
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> common_pb2.Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[common_pb2.Event]: ...

    def __getitem__(self, index: int | slice) -> common_pb2.Event | list[common_pb2.Event]:
        count = len(self)
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(count))]
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("event index out of range")
        return self._at(index)


class EventLog(Events):
    """Append-only events in seq order (index = seq - 1); read like a list of ``Event``.

    Each read of an event older than the last :data:`RECENT` returns a freshly decoded message:
    equal to the one appended, never the same object, and changing it changes nothing here."""

    __slots__ = ("_blobs", "_kinds", "_recent")

    def __init__(self, events: Iterable[common_pb2.Event] = ()) -> None:
        self._blobs: list[bytes] = []
        self._kinds = bytearray()
        self._recent: list[common_pb2.Event] = []
        self.extend(events)

    def extend(self, events: Iterable[common_pb2.Event]) -> None:
        """Append ``events`` (which the log keeps: callers do not change them afterwards)."""
        blobs, kinds, recent = self._blobs, self._kinds, self._recent
        for event in events:
            blobs.append(event.SerializeToString())
            kind = event.kind
            kinds.append(kind if 0 <= kind < _OTHER_KIND else _OTHER_KIND)
            recent.append(event)
        excess = len(recent) - RECENT
        if excess > 0:
            del recent[:excess]

    def blob(self, index: int) -> bytes:
        """The encoded event at ``index`` (as ``Event.SerializeToString`` wrote it)."""
        return self._blobs[index]

    def last_of_kind(self, kind: int, end: int) -> int:
        """The index of the last event of ``kind`` before ``end`` that may be one (-1: none);
        an event whose kind does not fit a byte is a candidate for every kind."""
        other = self._kinds.rfind(_OTHER_KIND, 0, end)
        if not 0 <= kind < _OTHER_KIND:
            return other
        return max(self._kinds.rfind(kind, 0, end), other)

    def encoded_size(self, index: int) -> int:
        """``self[index].ByteSize()``, without decoding it."""
        return len(self._blobs[index])

    def __len__(self) -> int:
        return len(self._blobs)

    def _at(self, index: int) -> common_pb2.Event:
        back = len(self._blobs) - index  # 1 for the last event
        recent = self._recent
        if back <= len(recent):
            return recent[-back]
        return _decode(self._blobs[index])

    def __iter__(self) -> Iterator[common_pb2.Event]:
        return self.between(0, len(self._blobs))

    def between(self, start: int, end: int) -> Iterator[common_pb2.Event]:
        """Events ``start`` to ``end`` (indexes within the log), in order."""
        for index in range(start, end):
            yield self._at(index)


def last_of_kind(
    events: Sequence[common_pb2.Event], kind: int, end: int
) -> Iterator[tuple[int, common_pb2.Event]]:
    """The events of ``kind`` below index ``end`` with their indexes, last first (an
    :class:`EventLog` decodes no event of another kind to find them)."""
    if isinstance(events, EventLog):
        index = events.last_of_kind(kind, end)
        while index >= 0:
            event = events[index]
            if event.kind == kind:
                yield index, event
            index = events.last_of_kind(kind, index)
        return
    for index in range(min(end, len(events)) - 1, -1, -1):
        event = events[index]
        if event.kind == kind:
            yield index, event


def blob_of(events: Sequence[common_pb2.Event], index: int) -> bytes:
    """The encoding of ``events[index]``: kept by an :class:`EventLog`, made for anything else."""
    if isinstance(events, EventLog):
        return events.blob(index)
    return events[index].SerializeToString()
