"""The end of a turn wakes a child's parent; a session's link (a child's, or none) is read from its
row once and remembered (labels never change, uids are never reused), so later turns' ends cost no
row read, and a session deleted before its first turn ended wakes nobody."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import cast

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.detached import Submitter
from agentsessions.host.controller.subagents import (
    CALL_LABEL,
    EXECUTION_LABEL,
    PARENT_LABEL,
    Subagents,
    SubagentSettings,
)
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.journal.store import SessionRow


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.rows_read: Counter[str] = Counter()

    async def get_session(self, uid: str) -> SessionRow | None:
        self.rows_read[uid] += 1
        return await super().get_session(uid)


def _subagents(store: CountingStore) -> Subagents:
    """The part under test, over a core that has only the store (all that ``ended`` uses)."""
    core = cast(Core, SimpleNamespace(store=store))
    return Subagents(core, cast(Submitter, None), SubagentSettings(), cast(CallContext, None), lambda: None)


async def _ended(subagents: Subagents, uid: str) -> None:
    subagents.ended(uid)
    await asyncio.gather(*subagents._looking)  # the look at the row, when one was needed


async def test_a_childs_parent_is_woken_at_every_end_with_one_row_read() -> None:
    store = CountingStore()
    labels = {PARENT_LABEL: "sess-parent", EXECUTION_LABEL: "00000000000000e1", CALL_LABEL: "call-1"}
    await store.create_session(SessionRow(uid="sess-child", project="p", labels=labels))
    await store.create_session(SessionRow(uid="sess-plain", project="p"))
    subagents = _subagents(store)

    for _ in range(3):
        await _ended(subagents, "sess-plain")
    assert subagents._waiting == set()

    for _ in range(3):
        subagents._waiting.clear()
        subagents._kick.clear()
        await _ended(subagents, "sess-child")
        assert subagents._waiting == {"sess-parent"}  # woken every time
        assert subagents._kick.is_set()

    assert store.rows_read == Counter({"sess-plain": 1, "sess-child": 1})

    await _ended(subagents, "sess-gone")  # deleted before its turn's end was looked at
    await _ended(subagents, "sess-gone")
    assert subagents._waiting == {"sess-parent"}
    assert store.rows_read["sess-gone"] == 2  # a missing row is not remembered


async def test_a_turn_that_ends_after_the_close_starts_no_look() -> None:
    store = CountingStore()
    await store.create_session(SessionRow(uid="sess-plain", project="p"))
    subagents = _subagents(store)
    await subagents.close()
    subagents.ended("sess-plain")
    assert not subagents._looking
    assert store.rows_read == Counter()
