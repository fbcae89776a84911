"""The bound on each wait of a Connect bridge's task (agentsessions.host.harnesslink._WaitBound):
one timer for the whole stream, moved only when a wait's deadline is nearer than its own, firing
only into a wait still in progress, and taking back only the cancel it made itself.

A bound of 0 expires at the loop's next pass, so these tests wait on events, never on the clock.
"""

from __future__ import annotations

import asyncio

import pytest

from agentsessions.host.harnesslink import _WaitBound


def live_timers() -> list[asyncio.TimerHandle]:
    loop = asyncio.get_running_loop()
    return [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]


async def waiter(started: asyncio.Event, release: asyncio.Future[None]) -> str:
    started.set()
    try:
        await release
    except asyncio.CancelledError:
        return "cancelled"
    return "released"


async def waiting() -> tuple[asyncio.Task[str], asyncio.Future[None], _WaitBound]:
    """A task waiting until ``release`` is set, and a bound on its waits."""
    started, release = asyncio.Event(), asyncio.get_running_loop().create_future()
    task = asyncio.create_task(waiter(started, release))
    await started.wait()
    return task, release, _WaitBound(task)


async def test_one_timer_serves_every_wait_of_the_stream() -> None:
    task, release, bound = await waiting()
    scheduled = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
    before = len(scheduled)
    for _ in range(100):
        bound.arm(600.0)
        bound.disarm()
    assert len(scheduled) == before + 1, "one timer made, for the first wait"
    assert len(live_timers()) == 1
    bound.arm(5.0)  # nearer than the timer's: it moves
    timers = live_timers()
    assert len(timers) == 1 and timers[0].when() - asyncio.get_running_loop().time() <= 5.0
    bound.arm(None)  # unbounded: no deadline, the timer stays until it fires or the stream ends
    bound.close()
    assert live_timers() == []
    release.set_result(None)
    assert await task == "released"


async def test_an_expired_wait_is_cancelled_and_said_so() -> None:
    task, _release, bound = await waiting()
    bound.arm(0.0)
    assert await task == "cancelled"
    assert bound.expired()
    assert task.cancelling() == 0  # the bound's cancel is taken back
    assert not bound.expired()  # said once


async def test_a_timer_that_fires_between_waits_cancels_nothing() -> None:
    task, release, bound = await waiting()
    bound.arm(0.0)
    bound.disarm()  # the wait ended before the timer's pass
    fired = asyncio.Event()
    asyncio.get_running_loop().call_later(0.0, fired.set)  # queued after the bound's timer
    await fired.wait()
    assert live_timers() == [] and not task.done()
    assert not bound.expired()
    release.set_result(None)
    assert await task == "released"


async def test_a_later_deadline_keeps_the_timer_and_is_set_again_when_it_fires() -> None:
    task, release, bound = await waiting()
    bound.arm(0.0)  # the timer: the next pass
    bound.arm(600.0)  # a new wait, far off: the timer stays where it was
    fired = asyncio.Event()
    asyncio.get_running_loop().call_later(0.0, fired.set)
    await fired.wait()
    (timer,) = live_timers()  # set again for the wait in progress
    assert timer.when() - asyncio.get_running_loop().time() > 500
    assert not task.done()
    bound.close()
    release.set_result(None)
    assert await task == "released"


@pytest.mark.parametrize("cancel_first", [True, False])
async def test_a_cancel_from_elsewhere_in_the_same_pass_is_not_taken_back(cancel_first: bool) -> None:
    """The bound expires and someone else cancels the task before it runs again: the task is
    still cancelled (asyncio.timeout's rule), whichever came first."""
    task, _release, bound = await waiting()
    if cancel_first:
        task.cancel()
        bound.arm(0.0)
    else:
        bound.arm(0.0)
        asyncio.get_running_loop().call_later(0.0, task.cancel)  # in the timer's pass, after it
    assert await task == "cancelled"
    assert not bound.expired()
    assert task.cancelling() >= 1


async def test_a_finished_task_is_left_alone() -> None:
    task, release, bound = await waiting()
    bound.arm(0.0)
    release.set_result(None)
    assert await task == "released"
    await asyncio.sleep(0)  # the timer's pass
    assert not bound.expired()
