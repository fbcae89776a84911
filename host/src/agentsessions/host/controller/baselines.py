"""Where a journal's LIFECYCLE_BASELINEs are: a compacted session's Start.history begins at the
latest one before the turn (compaction.py)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from agentsessions.host.controller.eventlog import EventLog, last_of_kind
from agentsessions.v1 import common_pb2

_LIFECYCLE = int(common_pb2.EVENT_LIFECYCLE)
_BASELINE = int(common_pb2.Lifecycle.LIFECYCLE_BASELINE)


def is_baseline(event: common_pb2.Event) -> bool:
    return event.kind == _LIFECYCLE and event.lifecycle.kind == _BASELINE


def history_start(events: Sequence[common_pb2.Event], end: int) -> int:
    """The index of the latest LIFECYCLE_BASELINE among ``events[:end]`` (0: there is none): where
    the Start.history of a turn whose EXECUTION_START is record ``end + 1`` begins."""
    for index, event in last_of_kind(events, _LIFECYCLE, end):
        if event.lifecycle.kind == _BASELINE:
            return index
    return 0


class Baselines:
    """Where the baselines of one cached journal list are, and how many encoded bytes its events
    hold, found once per record (a turn's history start and size cost no scan of the session)."""

    __slots__ = ("events", "indexes", "scanned", "sizes")

    def __init__(self, events: Sequence[common_pb2.Event]) -> None:
        self.events = events
        self.indexes: list[int] = []
        self.scanned = 0
        # sizes[i]: the encoded bytes of events[:i], counted only once someone asks (a byte threshold).
        self.sizes: list[int] = [0]

    def start(self, end: int) -> int:
        events, indexes = self.events, self.indexes
        for index in range(self.scanned, len(events)):
            event = events[index]
            if event.kind == _LIFECYCLE and event.lifecycle.kind == _BASELINE:
                indexes.append(index)
        self.scanned = len(events)
        position = bisect_left(indexes, end) - 1
        return indexes[position] if position >= 0 else 0

    def encoded_bytes(self, start: int, end: int) -> int:
        """The encoded size of ``events[start:end]``: the sum of the events' protobuf sizes."""
        events, sizes = self.events, self.sizes
        total = sizes[-1]
        size = events.encoded_size if isinstance(events, EventLog) else (lambda i: events[i].ByteSize())
        for index in range(len(sizes) - 1, end):
            total += size(index)
            sizes.append(total)
        return sizes[end] - sizes[start]
