"""How the host waits for a turn it stops (``controller/drive.py``): bounded by the grace, never
raising the turn's own outcome, and never swallowing a cancel of the waiter itself. A swallowed cancel
once kept the subagent scan running after its owner had cancelled it (a cascade's Cancel was
waiting on a child's turn at that moment), and the host's close then waited for it forever."""

from __future__ import annotations

import asyncio

import pytest

from agentsessions.host.controller.drive import RunningTurn, cancelled, settled
from agentsessions.sdk import EventSink, Start


class Unheeding:
    """A harness without a cancel of its own (the host cuts its task instead)."""

    async def run(self, start: Start, sink: EventSink) -> None:
        raise NotImplementedError


async def stubborn(entered: asyncio.Event, release: asyncio.Event) -> str:
    """A turn that takes its time to end once cut (it journals its cancellation, say)."""
    try:
        entered.set()
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        await release.wait()
        raise
    return "never"


async def test_a_cancel_of_whoever_waits_for_a_stopping_turn_reaches_it() -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    turn_task = asyncio.create_task(stubborn(entered, release))
    await entered.wait()
    turn = RunningTurn("ex-1", turn_task, Unheeding())  # type: ignore[arg-type]
    stopping = asyncio.create_task(turn.stop("stop", grace_s=3600))
    while not turn_task.cancelling():  # noqa: ASYNC110 - one loop step: stop has cut the turn
        await asyncio.sleep(0)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    assert not turn_task.done()  # the turn itself goes on ending as it will
    release.set()
    await settled(turn_task)
    assert turn_task.cancelled()
    assert turn.cancel_reason == "stop"


async def test_stop_waits_no_longer_than_the_grace_and_raises_nothing_of_the_turn() -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    turn_task = asyncio.create_task(stubborn(entered, release))
    await entered.wait()
    await RunningTurn("ex-1", turn_task, Unheeding()).stop("stop", grace_s=0.01)  # type: ignore[arg-type]
    assert not turn_task.done()
    release.set()
    await settled(turn_task)


async def test_settled_sees_a_failure_without_raising_it_and_passes_a_cancel_of_the_waiter() -> None:
    async def fails() -> None:
        raise RuntimeError("the turn's own failure")

    failing = asyncio.create_task(fails())
    await settled(failing)  # not raised here
    assert isinstance(failing.exception(), RuntimeError)

    never = asyncio.create_task(asyncio.Event().wait())
    waiter = asyncio.create_task(settled(never))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not never.done()  # the waiter's cancel is not passed on to the task waited for
    await cancelled([never])
    assert never.cancelled()


class FailingCancel(Unheeding):
    """A harness whose own cancel fails."""

    async def cancel(self, execution_id: str, reason: str) -> bool:
        raise RuntimeError("the harness's cancel broke")


async def test_a_harness_cancel_that_fails_cuts_the_turn_instead() -> None:
    entered, release = asyncio.Event(), asyncio.Event()
    release.set()
    turn_task = asyncio.create_task(stubborn(entered, release))
    await entered.wait()
    await RunningTurn("ex-1", turn_task, FailingCancel()).stop("stop", grace_s=3600)  # type: ignore[arg-type]
    assert turn_task.cancelled()
