"""The journal cache stays exact when this host appends while a refresh read is in flight.

Under load (many turns, many readers) a refresh of a session's cached events could await the
store while the session's own turn appended a record the entry could not take (it skipped the one
being read), which drops the entry; the refresh then touched the dropped entry and failed with a
KeyError, which a caller saw as UNKNOWN (three ListSessions calls in the issue's load run). The
store here is a real memory store whose ranged reads wait for a gate the test opens, so the
interleaving is exact.
"""

from __future__ import annotations

import asyncio

from agentsessions.host.controller.journal_cache import JournalCache
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.journal.store import SessionRow
from agentsessions.v1 import common_pb2
from tests.support.host import text_output


class GatedReads(MemoryStore):
    """A memory store whose reads from past seq 1 wait until ``open`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = asyncio.Event()
        self.open = asyncio.Event()

    async def read(self, uid: str, from_seq: int = 1, to_seq: int = 0) -> list[common_pb2.LogRecord]:
        records = await super().read(uid, from_seq, to_seq)
        if from_seq > 1:
            self.waiting.set()
            await asyncio.wait_for(self.open.wait(), 30)
        return records


async def test_a_refresh_racing_this_hosts_appends_keeps_the_cache_exact() -> None:
    store = GatedReads()
    await store.create_session(SessionRow(uid="s", project="p"))
    cache = JournalCache(store)
    await store.append("s", [text_output("1")], expected_head=0, fence=0)
    assert len(await cache.events("s")) == 1
    # Another writer's record: the cache learns of it from the head and reads it...
    await store.append("s", [text_output("2")], expected_head=1, fence=0)
    refresh = asyncio.create_task(cache.events("s"))
    await asyncio.wait_for(store.waiting.wait(), 30)
    # ...while this host appends and reports its own records to the cache.
    mine = await store.append("s", [text_output("3")], expected_head=2, fence=0)
    cache.appended("s", mine)
    store.open.set()
    events = await refresh
    assert [e.message.parts[0].text.text for e in events] in (["1", "2"], ["1", "2", "3"])
    again = await cache.events("s")
    assert [e.message.parts[0].text.text for e in again] == ["1", "2", "3"]
