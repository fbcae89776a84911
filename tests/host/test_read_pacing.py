"""Reads yield to turns under load (controller/pacing.py): the readers' budget of the event loop,
the listing's rate, the loop probe, and Replay, Watch and ListSessions going through them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from agentsessions.host.controller import pacing, watch
from agentsessions.host.controller.pacing import LagProbe, LoopBudget, ReadPacer
from agentsessions.host.journal.feed import JournalFeed
from agentsessions.host.journal.memory import MemoryStore
from agentsessions.host.journal.store import SessionRow
from agentsessions.v1 import common_pb2, session_pb2
from tests.support.host import HostUnderTest, running_host, text_input


class Fakes:
    """A clock that moves only when told (or by ``tick`` at every look), a sleep that records,
    and the two conditions."""

    def __init__(self) -> None:
        self.now = 100.0
        self.tick = 0.0
        self.slept: list[float] = []
        self.running = 1
        self.congested = True

    def clock(self) -> float:
        self.now += self.tick
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 6))

    def pacer(self, rate: int, burst_s: float = 0.0, *, counted_here: bool = True) -> ReadPacer:
        """With ``counted_here`` False the controller given the pacer counts its executions."""
        return ReadPacer(
            rate,
            (lambda: self.running) if counted_here else None,
            congested=lambda: self.congested,
            clock=self.clock,
            sleep=self.sleep,
            burst_s=burst_s,
        )

    def budget(self, share: float, burst_s: float = 0.0, *, counted_here: bool = True) -> LoopBudget:
        return LoopBudget(
            share,
            (lambda: self.running) if counted_here else None,
            congested=lambda: self.congested,
            clock=self.clock,
            sleep=self.sleep,
            burst_s=burst_s,
        )


# -- the readers' budget of the loop -------------------------------------------------------------


async def test_reads_wait_for_their_share_only_while_turns_run_on_a_congested_loop() -> None:
    f = Fakes()
    budget = f.budget(0.1)
    for running, congested in ((0, True), (1, False), (0, False)):
        f.running, f.congested = running, congested
        for _ in range(3):
            budget.spend(0.005)
            await budget.take()
    assert f.slept == [] and budget.paced == 0
    f.running, f.congested = 3, True
    await budget.take()  # unpaced until now: at most a burst (here none) was carried over
    budget.spend(0.005)  # 5 ms of the loop at 10%: the readers owe 50 ms
    await budget.take()
    budget.spend(0.002)
    f.now += 0.010  # 10 ms pass while the reader is elsewhere
    await budget.take()
    assert f.slept == [0.05, 0.06] and budget.paced == 2
    assert budget.spent == pytest.approx(0.052)


async def test_the_share_is_of_time_whatever_a_record_costs() -> None:
    # The same records, cheap on one machine and dear on another: the dear ones wait longer.
    waits: list[list[float]] = []
    for cost in (0.00002, 0.00008):
        f = Fakes()
        budget = f.budget(0.05)
        for _ in range(4):
            await budget.take()
            for _ in range(pacing.CHUNK):
                budget.spend(cost)
        waits.append(f.slept)
    assert waits == [[0.01, 0.02, 0.03], [0.04, 0.08, 0.12]]


async def test_a_burst_passes_at_once_and_the_share_holds_after_it() -> None:
    f = Fakes()
    budget = f.budget(0.1, burst_s=0.5)
    for _ in range(6):
        await budget.take()
        budget.spend(0.01)  # 0.1 s worth each: what fits in the burst goes at once
    await budget.take()
    assert f.slept == [0.1] and budget.paced == 1
    f.now += 2.0  # quiet for longer than the burst: the credit is a burst again, no more
    for _ in range(7):
        await budget.take()
        budget.spend(0.01)
    assert f.slept == [0.1, 0.1]


async def test_relief_keeps_at_most_a_burst_of_what_the_readers_owe() -> None:
    f = Fakes()
    budget = f.budget(0.1, burst_s=0.5)
    await budget.take()
    budget.spend(0.3)  # 3 s owed
    f.congested = False
    await budget.take()  # relieved for a moment: unpaced, and 0.5 s of the debt is kept
    f.congested = True
    await budget.take()
    assert f.slept == []  # owes exactly a burst: no wait yet
    budget.spend(0.01)
    await budget.take()
    assert f.slept == [0.1]  # as if the burst had been spent, not granted afresh


async def test_a_share_of_zero_never_paces_but_still_counts() -> None:
    f = Fakes()
    budget = f.budget(0.0)
    for _ in range(5):
        await budget.take()
        budget.spend(1.0)
    assert f.slept == [] and budget.paced == 0 and budget.spent == 5.0


async def test_timed_charges_the_steps_on_the_loop_not_the_waits_between_them() -> None:
    f = Fakes()
    budget = f.budget(0.1)
    go = asyncio.Event()

    async def read() -> str:
        f.now += 0.002  # a step's own work
        await go.wait()
        f.now += 0.003
        return "read"

    async def call() -> str:
        return await budget.timed(read())

    task = asyncio.create_task(call())
    await asyncio.sleep(0)
    assert budget.spent == pytest.approx(0.002) and not task.done()
    f.now += 10.0  # the read waits: no loop time of its own
    go.set()
    assert await task == "read"
    assert budget.spent == pytest.approx(0.005)


async def test_timed_hands_cancels_and_errors_through_and_charges_the_cleanup() -> None:
    f = Fakes()
    budget = f.budget(0.1)
    parked = asyncio.Event()
    cleaned: list[str] = []

    async def read() -> None:
        try:
            parked.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            f.now += 0.004
            cleaned.append("cancelled")
            raise

    async def call() -> None:
        await budget.timed(read())

    task = asyncio.create_task(call())
    await parked.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["cancelled"] and budget.spent == pytest.approx(0.004)

    async def fails() -> None:
        f.now += 0.001
        raise ValueError("bad page")

    with pytest.raises(ValueError, match="bad page"):
        await budget.timed(fails())
    assert budget.spent == pytest.approx(0.005)


async def test_only_steps_spent_wholly_on_live_records_go_uncharged() -> None:
    f = Fakes()
    budget = f.budget(0.1)
    stored, new = asyncio.Event(), asyncio.Event()

    async def follower() -> None:
        f.now += 0.002  # the last page from the store, then live
        pacing.live(True)
        await stored.wait()
        f.now += 0.007  # a record as a turn appended it
        await new.wait()
        f.now += 0.003
        pacing.live(False)  # behind again: reading the store
        pacing.live(True)

    async def replay() -> None:
        await stored.wait()
        f.now += 0.005  # another call, in a task (and a context) of its own: charged

    async def timed(read: Coroutine[Any, Any, None]) -> None:
        await budget.timed(read)

    following = asyncio.create_task(timed(follower()))
    replaying = asyncio.create_task(timed(replay()))
    await asyncio.sleep(0)
    assert budget.spent == pytest.approx(0.002)  # the step began catching up: charged
    stored.set()
    await replaying
    await asyncio.sleep(0)
    assert budget.spent == pytest.approx(0.007)  # the replay's step; the live one not
    new.set()
    await following
    assert budget.spent == pytest.approx(0.010)  # live at both ends, but it read the store


async def test_a_watch_following_live_is_charged_for_its_catch_up_only(
    host: HostUnderTest, fakes: Fakes
) -> None:
    uid = await _long_session(host)
    budget = host.controller._core.reads
    feed = JournalFeed()
    fakes.tick = 0.001  # every look at the clock finds a millisecond gone: every step costs
    got: list[int] = []
    delivered = {RECORDS: asyncio.Event(), RECORDS + 1: asyncio.Event()}

    async def follow() -> None:
        with feed.subscribe(uid) as sub:
            async for item in watch._follow(host.controller._core, uid, 1, sub, 60.0):
                if isinstance(item, common_pb2.LogRecord):
                    got.append(item.seq)
                    if item.seq in delivered:
                        delivered[item.seq].set()
                    if item.seq == RECORDS + 2:
                        return

    async def timed() -> None:
        await budget.timed(follow())

    following = asyncio.create_task(timed())
    await delivered[RECORDS].wait()
    caught_up = budget.spent
    assert caught_up > 0  # the stored records, read to catch up
    for seq in (RECORDS + 1, RECORDS + 2):
        record = common_pb2.LogRecord(seq=seq, event=common_pb2.Event(kind=common_pb2.EVENT_INPUT))
        feed.appended(uid, [record])
        if seq in delivered:
            await delivered[seq].wait()
    await following
    assert got == list(range(1, RECORDS + 3))
    assert budget.spent == caught_up  # the two live records cost the budget nothing


# -- the listing's rate ----------------------------------------------------------------------------


async def test_listing_is_paced_only_while_turns_run_on_a_congested_loop() -> None:
    f = Fakes()
    pacer = f.pacer(1000)
    for running, congested in ((0, True), (1, False), (0, False)):
        f.running, f.congested = running, congested
        for _ in range(3):
            await pacer.take(100)
    assert f.slept == [] and pacer.paced == 0
    f.running, f.congested = 3, True
    for _ in range(3):
        await pacer.take(100)
    # The first chunk goes at once; each next one waits for the time the ones before it took.
    assert f.slept == [0.1, 0.2] and pacer.paced == 200


async def test_no_backlog_outlives_the_congestion_and_time_passing_repays_it() -> None:
    f = Fakes()
    pacer = f.pacer(1000)
    await pacer.take(500)
    await pacer.take(100)
    assert f.slept == [0.5]
    f.congested = False
    await pacer.take(100)  # relieved: the reservations so far are forgotten
    f.congested = True
    await pacer.take(100)
    f.now += 10.0  # long after the last reservation
    await pacer.take(100)
    assert f.slept == [0.5]


async def test_a_burst_passes_at_once_and_the_rate_holds_after_it() -> None:
    f = Fakes()
    pacer = f.pacer(1000, burst_s=0.5)
    for _ in range(7):
        await pacer.take(100)  # 0.7 s worth: what fits in the burst goes at once
    assert f.slept == [0.1] and pacer.paced == 100
    f.now += 2.0  # quiet for longer than the burst: the credit is a burst again, no more
    for _ in range(8):
        await pacer.take(100)
    assert f.slept == [0.1, 0.1, 0.2]


async def test_a_congestion_that_comes_and_goes_grants_no_credit_the_clock_did_not() -> None:
    f = Fakes()
    pacer = f.pacer(1000, burst_s=0.5)
    for _ in range(5):
        await pacer.take(100)  # the burst
    f.congested = False
    await pacer.take(100)  # relieved for a moment: unpaced
    f.congested = True
    await pacer.take(100)
    await pacer.take(100)
    assert f.slept == [0.1]  # as if it had never been relieved


async def test_a_listing_rate_of_zero_never_paces() -> None:
    f = Fakes()
    pacer = f.pacer(0)
    for _ in range(5):
        await pacer.take(1000)
    assert f.slept == [] and pacer.paced == 0


async def test_the_probe_sees_a_loop_that_runs_its_timers_late() -> None:
    probe = LagProbe()
    assert not probe.congested()  # the first ask starts probing: no measurement yet
    for _ in range(200):
        time.sleep(0.005)  # noqa: ASYNC251 - the loop is held, as by a callback that runs long
        await asyncio.sleep(0)
        if probe.congested():
            break
    assert probe.congested()


async def test_the_probe_stops_when_nobody_asks() -> None:
    now = [0.0]
    probe = LagProbe(clock=lambda: now[0])
    probe.congested()
    task = probe._task
    assert task is not None
    now[0] += pacing.PROBE_IDLE_S + 1  # nobody asked since
    await asyncio.wait_for(task, timeout=5)
    assert not probe.congested()  # asking again starts it again
    assert probe._task is not None and probe._task is not task


# -- Replay and Watch through the pacer ----------------------------------------------------------


RECORDS = 350


@pytest.fixture
def fakes() -> Fakes:
    return Fakes()


@pytest.fixture
async def host(fakes: Fakes) -> AsyncIterator[HostUnderTest]:
    async with running_host(MemoryStore(), read_budget=fakes.budget(0.01, counted_here=False)) as h:
        yield h


async def _long_session(host: HostUnderTest) -> str:
    row = await host.store.create_session(SessionRow(uid="sess-long", project="default"))
    events = [
        common_pb2.Event(kind=common_pb2.EVENT_INPUT, message=text_input(f"m{i}")) for i in range(RECORDS)
    ]
    await host.store.append(row.uid, events, expected_head=0, fence=0)
    return row.uid


async def test_a_replay_is_charged_its_loop_time_and_paced_while_an_execution_runs(
    host: HostUnderTest, fakes: Fakes
) -> None:
    uid = await _long_session(host)
    budget = host.controller._core.reads
    fakes.tick = 0.001  # every look at the clock finds a millisecond gone: every step costs
    unpaced = [r.seq async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid))]
    assert unpaced == list(range(1, RECORDS + 1))
    assert fakes.slept == [] and budget.spent > 0  # charged, but no execution runs: never held
    with host.controller._core.slots.hold("default"):
        paced = [r.seq async for r in host.sessions.Replay(session_pb2.ReplayRequest(session=uid))]
    assert paced == unpaced
    assert fakes.slept and len(fakes.slept) == budget.paced  # at 1%, a look found it owing


async def test_a_watch_catching_up_looks_at_the_budget_as_a_replay_does(
    host: HostUnderTest, fakes: Fakes
) -> None:
    uid = await _long_session(host)
    budget = host.controller._core.reads
    budget.spend(0.01)  # the readers owe a second at 1%
    with host.controller._core.slots.hold("default"):
        seqs = [r.seq async for r in watch._pages(host.controller._core, uid, 1)]
    assert seqs == list(range(1, RECORDS + 1))
    # A look every 25 records within pages of 256: 11 in the first page, 4 in the 94 left.
    assert watch.PAGE == 256 and pacing.CHUNK == 25 and fakes.slept == [1.0] * 15


async def test_listing_is_paced_by_sessions_listed_while_an_execution_runs(fakes: Fakes) -> None:
    async with running_host(MemoryStore(), list_pacer=fakes.pacer(1000, counted_here=False)) as host:
        for i in range(250):
            await host.store.create_session(SessionRow(uid=f"sess-{i:03d}", project="default"))

        async def every_page() -> list[str]:
            uids: list[str] = []
            token = ""
            while True:
                request = session_pb2.ListSessionsRequest(page_size=100, page_token=token)
                page = await host.sessions.ListSessions(request)
                uids += [s.metadata.uid for s in page.sessions]
                token = page.next_page_token
                if not token:
                    return uids

        unpaced = await every_page()
        assert len(unpaced) == 250 and fakes.slept == []  # no execution runs
        with host.controller._core.slots.hold("default"):
            assert await every_page() == unpaced
    # Pages of 100, 100 and 50 at 1,000 sessions/s: the 2nd and 3rd waited 0.1 and 0.2 s.
    assert fakes.slept == [0.1, 0.2]
