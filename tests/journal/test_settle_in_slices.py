"""A committed batch wakes its writers a slice at a time (engine._settle_in_turns): callbacks that
became ready meanwhile run between slices instead of behind the whole batch, and a cancellation
between slices still hands every writer its own outcome."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Any

from agentsessions.host.journal import engine
from agentsessions.host.journal.sqlite import SqliteStore
from agentsessions.host.journal.store import SessionRow, StoreError

WRITERS = 3 * engine.SETTLE_PER_TURN + 5


def _futures(loop: asyncio.AbstractEventLoop, woke: list[str]) -> list[asyncio.Future[Any]]:
    futures: list[asyncio.Future[Any]] = []
    for i in range(WRITERS):
        future: asyncio.Future[Any] = loop.create_future()
        future.add_done_callback(functools.partial(_woke, woke, f"writer {i}"))
        futures.append(future)
    return futures


def _woke(woke: list[str], name: str, _: object) -> None:
    woke.append(name)


async def test_a_callback_ready_during_the_first_slice_runs_before_the_second() -> None:
    loop = asyncio.get_running_loop()
    woke: list[str] = []
    futures = _futures(loop, woke)
    all_ran = asyncio.Event()
    futures[-1].add_done_callback(lambda _: loop.call_soon(all_ran.set))  # after the last writer's
    ran = asyncio.Event()

    def bystander() -> None:
        woke.append("bystander")
        ran.set()

    # Became ready while the first slice's writers ran: a new call's acceptance, say.
    futures[0].add_done_callback(lambda _: loop.call_soon(bystander))
    await engine._settle_in_turns([(future, i) for i, future in enumerate(futures)])
    async with asyncio.timeout(30):
        await ran.wait()
        await all_ran.wait()
    assert [future.result() for future in futures] == list(range(WRITERS))
    slice_ = engine.SETTLE_PER_TURN
    assert woke.index("bystander") < woke.index(f"writer {slice_}")
    assert woke.index("bystander") > woke.index(f"writer {slice_ - 1}")
    assert [w for w in woke if w != "bystander"] == [f"writer {i}" for i in range(WRITERS)]


async def test_cancelled_between_slices_every_writer_still_gets_its_own_outcome() -> None:
    loop = asyncio.get_running_loop()
    woke: list[str] = []
    futures = _futures(loop, woke)
    refused = StoreError("refused: this one only")
    outcomes: list[Any] = [refused if i == WRITERS - 1 else i for i in range(WRITERS)]
    settling = asyncio.create_task(engine._settle_in_turns(list(zip(futures, outcomes, strict=True))))
    await asyncio.sleep(0)  # the first slice is woken, the task waits for its next turn
    assert sum(future.done() for future in futures) == engine.SETTLE_PER_TURN
    settling.cancel()
    await asyncio.gather(settling, return_exceptions=True)
    assert all(future.done() for future in futures)
    assert [future.result() for future in futures[:-1]] == list(range(WRITERS - 1))
    assert futures[-1].exception() is refused


async def test_a_large_batch_is_still_one_commit(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "journal.db")
    try:
        before = store.stats.commits
        async with asyncio.timeout(30):
            await asyncio.gather(
                *(store.create_session(SessionRow(uid=f"s-{i}", project="p")) for i in range(WRITERS))
            )
        assert store.stats.commits - before == 1
        assert len(await store.session_uids()) == WRITERS
    finally:
        await store.close()
