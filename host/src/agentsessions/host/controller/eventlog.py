"""A session's journal events as the journal cache keeps them: encoded, the latest few also decoded.

The cache holds every event of every cached session for as long as the session stays cached.
Kept as protobuf messages, each event is an object the cyclic collector walks at every
collection of its generation, and on a busy host they were most of what the collector walked:
~5 a turn, 72,000 of the 98,000 objects a middle collection found under the load benchmark's
readers, which made that collection take 110-170 ms (bench/README.md, "The collector's pauses").
Bytes are not walked at all. So :class:`EventLog` keeps each event's encoding, and the decoded
message of only the last :data:`RECENT` events: a turn reads its own records and the latest
execution's, which are among them. An older event is decoded each time it is read (about a
microsecond for a small one); every reader of old events (replay, recovery, a fork's copy, a
harness's history) reads it once per request.

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


class EventLog(Sequence[common_pb2.Event]):
    """Append-only events in seq order (index = seq - 1); read like a list of ``Event``.

    Each read of an event older than the last :data:`RECENT` returns a freshly decoded message:
    equal to the one appended, never the same object, and changing it changes nothing here."""

    __slots__ = ("_blobs", "_recent")

    def __init__(self, events: Iterable[common_pb2.Event] = ()) -> None:
        self._blobs: list[bytes] = []
        self._recent: list[common_pb2.Event] = []
        self.extend(events)

    def extend(self, events: Iterable[common_pb2.Event]) -> None:
        """Append ``events`` (which the log keeps: callers do not change them afterwards)."""
        blobs, recent = self._blobs, self._recent
        for event in events:
            blobs.append(event.SerializeToString())
            recent.append(event)
        excess = len(recent) - RECENT
        if excess > 0:
            del recent[:excess]

    def blob(self, index: int) -> bytes:
        """The encoded event at ``index`` (as ``Event.SerializeToString`` wrote it)."""
        return self._blobs[index]

    def encoded_size(self, index: int) -> int:
        """``self[index].ByteSize()``, without decoding it."""
        return len(self._blobs[index])

    def __len__(self) -> int:
        return len(self._blobs)

    @overload
    def __getitem__(self, index: int) -> common_pb2.Event: ...

    @overload
    def __getitem__(self, index: slice) -> list[common_pb2.Event]: ...

    def __getitem__(self, index: int | slice) -> common_pb2.Event | list[common_pb2.Event]:
        if isinstance(index, slice):
            return [self._at(i) for i in range(*index.indices(len(self._blobs)))]
        count = len(self._blobs)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("event index out of range")
        return self._at(index)

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


def blob_of(events: Sequence[common_pb2.Event], index: int) -> bytes:
    """The encoding of ``events[index]``: kept by an :class:`EventLog`, made for anything else."""
    if isinstance(events, EventLog):
        return events.blob(index)
    return events[index].SerializeToString()
