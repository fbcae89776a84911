"""The journal cache's event log: it reads like the list of events it was given, keeps them
encoded (the collector walks none but the last few), and hands their encoding to a harness's
Start.history as it is (bench/NOTEBOOK.md, "The journal cache's events kept encoded")."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import pytest

from agentsessions.host.controller import eventlog
from agentsessions.host.controller.baselines import history_start
from agentsessions.host.controller.eventlog import RECENT, EventLog, blob_of, last_of_kind
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


@contextlib.contextmanager
def _counting_decodes() -> Iterator[list[int]]:
    """How many events the logs decode meanwhile (in the list's one item once the block ends)."""
    decoded = [0]
    original = eventlog._decode

    def counting(blob: bytes) -> common_pb2.Event:
        decoded[0] += 1
        return original(blob)

    eventlog._decode = counting  # type: ignore[assignment]
    try:
        yield decoded
    finally:
        eventlog._decode = original


def _lifecycle(kind: int) -> common_pb2.Event:
    return K.Event(kind=K.EVENT_LIFECYCLE, lifecycle=K.Lifecycle(kind=kind))  # type: ignore[arg-type]


def test_a_search_for_a_rare_kind_from_the_end_decodes_only_that_kind() -> None:
    events = _events(3_000)
    events[100] = _lifecycle(K.Lifecycle.LIFECYCLE_BASELINE)
    events[200] = _lifecycle(K.Lifecycle.LIFECYCLE_SUSPEND)
    events[2_000] = K.Event(kind=300)  # type: ignore[arg-type]  # a kind from a newer contract
    log = EventLog(events)
    for end in (0, 100, 101, 250, 2_500, len(events)):
        want = [i for i in range(end - 1, -1, -1) if events[i].kind == K.EVENT_LIFECYCLE]
        assert [i for i, _ in last_of_kind(log, K.EVENT_LIFECYCLE, end)] == want
        assert [i for i, _ in last_of_kind(events, K.EVENT_LIFECYCLE, end)] == want
    assert list(last_of_kind(log, 300, len(events))) == [(2_000, events[2_000])]
    # A turn's history starts at the latest baseline before it (compaction), found the same way.
    assert history_start(log, 2_500) == history_start(events, 2_500) == 100
    assert history_start(log, 100) == history_start(events, 100) == 0
    with _counting_decodes() as decoded:
        assert history_start(log, 2_900) == 100
    assert decoded == [3]  # the event of a newer kind, the suspend marker and the baseline


def test_a_replay_decodes_each_event_a_few_times_not_once_per_turn() -> None:
    # A controller replay re-runs every turn of the session with the history before it: with the
    # events kept encoded, reading that history whole for each turn decoded the journal once per
    # turn (a 1,000-turn replay took 8.3 s against 0.17 s; bench/NOTEBOOK.md).
    import asyncio

    from agentsessions.harnesses.echo import EchoHarness
    from agentsessions.host.controller.controller import Controller
    from agentsessions.host.controller.harnesses import HarnessCatalog, StaticHarness
    from agentsessions.host.controller.turns import ExecParams
    from agentsessions.host.harnesslink import RemoteHarness
    from agentsessions.host.journal import open_store
    from agentsessions.host.journal.store import JournalStore, SessionRow
    from agentsessions.host.models.echo import EchoModel
    from agentsessions.sdk.harness import text_message

    def echo_host(store: JournalStore) -> Controller:
        catalog = HarnessCatalog({"echo": StaticHarness(EchoHarness())}, store, RemoteHarness)
        return Controller(store, catalog, EchoModel(), stream_deltas=False)

    turns = 60

    async def replayed() -> tuple[int, int]:
        store = await open_store("memory:")
        try:
            controller = echo_host(store)
            view = await controller.create_session(SessionRow(uid="", project="", harness="echo"))
            for i in range(turns):
                params = ExecParams(session=view.row.uid, inputs=[text_message("user", f"turn {i}")])
                async with controller.admit_exec(params) as turn:
                    async for _ in turn.run():
                        pass
            with _counting_decodes() as decoded:
                report = await echo_host(store).replay(view.row.uid)
            return report.executions, decoded[0]
        finally:
            await store.close()

    executions, decoded = asyncio.run(replayed())
    assert executions == turns
    # ~5 records a turn, each read a few times (its turn's start, inputs, effects, settlement);
    # the journal decoded once per turn would be 60 x 300 = 18,000.
    assert decoded <= 5 * 5 * turns
