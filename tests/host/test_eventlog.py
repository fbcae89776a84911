"""The journal cache's event log: it reads like the list of events it was given, keeps them
encoded (the collector walks none but the last few), and hands their encoding to a harness's
Start.history as it is (bench/README.md, "The journal cache's events kept encoded")."""

from __future__ import annotations

import gc

import pytest

from agentsessions.host.controller.eventlog import RECENT, EventLog, blob_of
from agentsessions.host.controller.journal_cache import Prefix
from agentsessions.host.harnesslink import _HistoryEncoder
from agentsessions.v1 import common_pb2, harness_pb2

K = common_pb2


def _events(count: int, start: int = 0) -> list[common_pb2.Event]:
    return [
        K.Event(
            execution_id=f"e{i // 5}",
            kind=K.EVENT_INPUT,
            message=K.Message(role="user", parts=[K.Part(text=K.TextPart(text=f"text {i}"))]),
        )
        for i in range(start, start + count)
    ]


def test_reads_like_the_list_it_was_given() -> None:
    events = _events(RECENT * 3)
    log = EventLog(events[:10])
    log.extend(events[10:])
    assert len(log) == len(events)
    assert list(log) == events
    assert [log[i] for i in range(len(events))] == events
    assert log[-1] == events[-1] and log[-len(events)] == events[0]
    assert log[5:9] == events[5:9] and log[::-7] == events[::-7]
    assert list(log.between(3, 40)) == events[3:40]
    for bad in (len(events), -len(events) - 1):
        with pytest.raises(IndexError):
            log[bad]
    assert [log.blob(i) for i in range(len(events))] == [e.SerializeToString() for e in events]
    assert [log.encoded_size(i) for i in range(len(events))] == [e.ByteSize() for e in events]
    assert blob_of(log, 4) == blob_of(events, 4) == events[4].SerializeToString()


def test_an_older_event_is_a_fresh_copy_and_the_latest_are_the_messages_given() -> None:
    events = _events(RECENT + 5)
    log = EventLog(events)
    assert log[-1] is events[-1] and log[-RECENT] is events[-RECENT]
    old = log[0]
    assert old == events[0] and old is not events[0]
    old.message.parts[0].text.text = "changed"
    assert log[0] == events[0]


def test_the_collector_walks_no_event_but_the_latest() -> None:
    log = EventLog(_events(2_000))
    seen: set[int] = set()
    found = others = 0
    pending: list[object] = [log]
    while pending:
        item = pending.pop()
        if id(item) in seen or not gc.is_tracked(item):
            continue
        seen.add(id(item))
        if isinstance(item, common_pb2.Event):
            found += 1
        elif not isinstance(item, type):
            others += 1
            pending.extend(gc.get_referents(item))
    assert found == RECENT
    assert others == 3  # the log, its list of encodings, its list of the latest events


def _start_history(encoded: bytes | bytearray | memoryview) -> list[common_pb2.Event]:
    return list(harness_pb2.Start.FromString(bytes(encoded)).history)


def test_a_harness_history_frames_the_logs_encodings_once_and_follows_the_log_as_it_grows() -> None:
    events = _events(40)
    log = EventLog(events[:20])
    encoder = _HistoryEncoder(max_sessions=4)
    first = encoder.update("s", Prefix(log, 12))
    assert _start_history(first.encoded) == events[:12]
    log.extend(events[20:])
    again = encoder.update("s", Prefix(log, 35))
    assert again is first  # extended, not encoded afresh
    assert _start_history(again.encoded) == events[:35]
    # The same events in another log (the entry was read again) or from another start (a
    # compaction's baseline) are encoded afresh.
    other = encoder.update("s", Prefix(EventLog(events), 38))
    assert other is not again and _start_history(other.encoded) == events[:38]
    later = encoder.update("s", Prefix(EventLog(events), 38, start=6))
    assert later is not other and _start_history(later.encoded) == events[6:38]
    # A plain list of events still works, by the identity of its ends.
    plain = encoder.update("t", events[:10])
    assert encoder.update("t", events[:15]) is plain and _start_history(plain.encoded) == events[:15]
    assert encoder.update("t", [*_events(10), *events[10:15]]) is not plain
