"""The journal's writer never leaves a caller waiting forever: a commit that fails in a way nobody
foresaw settles every write of its batch with a StoreError, and a batch task cancelled before its
first step does not stop ``drain`` (which once spun without yielding, freezing the event loop)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentsessions.host.journal.groupcommit import GroupCommit
from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.host.journal.store import SessionRow, StoreError


async def test_a_commit_that_fails_unexpectedly_settles_its_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await SqliteStore.open(tmp_path / "journal.db")
    try:

        def broken(*args: object) -> None:
            raise RuntimeError("a bug after the transaction")

        monkeypatch.setattr(store, "_remember", broken)
        with pytest.raises(StoreError, match="outcome unknown"):
            async with asyncio.timeout(30):
                await store.create_session(SessionRow(uid="s-1", project="p"))
    finally:
        monkeypatch.undo()
        await store.close()


async def test_drain_ends_when_a_batch_was_cancelled_before_its_first_step() -> None:
    committed: list[list[int]] = []

    async def commit(batch: list[int]) -> None:
        committed.append(batch)

    writes: GroupCommit[int] = GroupCommit(commit, max_batch=10)
    writes.submit(1)
    for task in list(writes._in_flight):  # the batch's task, not yet stepped
        task.cancel()
    async with asyncio.timeout(30):
        await writes.drain()  # the write is taken by a batch started again
    assert committed == [[1]]
