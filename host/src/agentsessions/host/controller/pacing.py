"""Reads yield to turns under load: a budget of the event loop's time for the reads Replay and
Watch stream, and a rate for the sessions ListSessions pages hold.

Every record streamed costs the host's event loop gRPC's per-message cost (30-40 us of CPU on the
benchmark machine on a good evening, more when the machine is busy), on the one loop that also
drives every turn. Forty callers reading in a loop (20 replaying whole journals, 20 paging
sessions) took 74% of a loaded host's turns (``bench/load.py --think 0``). So while executions run
and the loop is congested, the calls that stream records (``Sessions.Replay``,
``LiveSessions.Watch``) may use at most ``--max-read-loop-percent`` of the loop's time, all callers
together; at any other time they stream as fast as their clients read them. A watcher delivering
records live, as the turns append them, is not charged (see ``live``): only reads of the store are.

The budget is of time, not of records: each step such a call takes on the loop (from the moment
its task resumes until it suspends again, gRPC's serializing and queueing of each message
included, see ``LoopBudget.timed``) is measured and charged, so the share holds on a fast machine
and on a slow one alike, whatever a record costs there. (A fixed 2,000 records a second, the rule
before it, was about 7% of the loop on a fast evening and far more on a slow one.) The charge is
wall time: it counts a step's waits for the GIL and the time the machine preempts the loop in it,
so a busy machine gives readers fewer records for the same share (56-111 us charged a record where
the loop thread's CPU was 44-66 us, bench/NOTEBOOK.md). What is not charged is gRPC's completion
work for those messages, which runs in its own callbacks: with 20 replayers the turns lost a few
times the share (5%: 15-24% fewer turns beside 20 listers; 2%: 13-14%). The default is 1% since
live delivery stopped being charged: 20 replayers, 20 listers and 20 live watchers then cost a
saturated host 10.7-15.9% of its turns with every replay done within its minute (bench/NOTEBOOK.md).

The sessions ``ListSessions`` pages hold are paced by a rate of their own
(``--max-listed-sessions-per-s``, 10,000 by default: dashboards page far more often than they
replay, and a page has a latency goal, so it never waits on the replays' share); 20 listers paging
back to back made 260 pages of 100 a second, ~40% of a loaded loop.

Congested means the loop runs callbacks late: a timer set every ``PROBE_S`` fires, on average over
the last ``PROBES``, more than ``CONGESTED_LAG_S`` after its time, and stays so until that average
falls below ``RELIEVED_LAG_S``. On the benchmark machine 200 sessions turning back to back make it
3 ms (p50 of 100 ms windows; p10 0.3-1.5 ms), while 8 replays streaming 34,000 records/s on an
otherwise idle host make it 0.3 ms: reading alone never counts as load. The probe runs only while
reads ask, and stops a second after the last one.

Both follow the generic cell rate rule with a burst of ``BURST_S``: after a quiet spell a second's
worth goes at once (20 dashboards paging together are not queued behind one another at a rate they
keep under: without it their ListSessions p99 went from ~100 to 164 ms), and the rate or the share
holds over any longer stretch.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, Final, Generic, TypeVar

_T = TypeVar("_T")

PROBE_S: Final = 0.010
PROBES: Final = 10
CONGESTED_LAG_S: Final = 0.0015
RELIEVED_LAG_S: Final = 0.0005
PROBE_IDLE_S: Final = 1.0
# Records a read streams between two looks at the budget: the pacing's grain (~1 ms of the loop).
CHUNK: Final = 25
# How far ahead of the rate readers may run after a quiet spell: a second's worth passes at once,
# so 20 dashboards paging together are not queued behind each other at a rate they stay under.
BURST_S: Final = 1.0


class LagProbe:
    """How late the running event loop runs a timer, over the last probes, measured only while
    someone asks (``congested``) and for ``PROBE_IDLE_S`` after."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lags: collections.deque[float] = collections.deque(maxlen=PROBES)
        self._asked = 0.0
        self._task: asyncio.Task[None] | None = None
        self._congested = False

    def congested(self) -> bool:
        """Whether the loop is congested (see the module docstring); False until half the probes
        have run (the first call starts probing)."""
        self._asked = self._clock()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._probe(), name="agentsessions-lag-probe")
            return False
        lags = self._lags
        if len(lags) >= PROBES // 2:
            mean = sum(lags) / len(lags)
            if mean > CONGESTED_LAG_S:
                self._congested = True
            elif mean < RELIEVED_LAG_S:
                self._congested = False
        return self._congested

    async def _probe(self) -> None:
        clock = self._clock
        try:
            while clock() - self._asked < PROBE_IDLE_S:
                set_at = clock()
                await asyncio.sleep(PROBE_S)
                self._lags.append(max(0.0, clock() - set_at - PROBE_S))
        finally:
            self._lags.clear()
            self._congested = False
            self._task = None


class _Paced:
    """What a pacer and a budget share: whether to pace now (``running()`` executions under way and
    the loop ``congested()``), the clock, the sleep and the burst. One made without ``running``
    counts executions through :meth:`counts`, which the controller calls."""

    def __init__(
        self,
        running: Callable[[], int] | None,
        congested: Callable[[], bool] | None,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        burst_s: float,
    ) -> None:
        self.burst_s = burst_s
        self._running: Callable[[], int] = running or (lambda: 0)
        self._counted = running is not None
        self._congested = congested or LagProbe(clock=clock).congested
        self._clock = clock
        self._sleep = sleep
        # When what was let through so far has all had its time at the rate (or the share).
        self._next = 0.0

    def counts(self, running: Callable[[], int]) -> None:
        """Count running executions with ``running``, unless made with its own."""
        if not self._counted:
            self._running, self._counted = running, True

    def _pacing(self, enabled: bool) -> bool:
        """Whether to pace now (``enabled``, executions running, the loop congested). When not, no
        waiting is carried into the next congestion and no credit the clock did not grant."""
        if enabled and self._running() and self._congested():
            return True
        self._next = min(self._next, self._clock() + self.burst_s)
        return False


class ReadPacer(_Paced):
    """Paces the sessions pages hold while ``running()`` executions are under way and the loop is
    congested: at most ``records_per_s`` for all listers together, in order of asking, after a
    burst of ``burst_s`` worth; 0 never paces. The controller that is given a pacer without
    ``running`` counts its own executions."""

    def __init__(
        self,
        records_per_s: int,
        running: Callable[[], int] | None = None,
        *,
        congested: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        burst_s: float = BURST_S,
    ) -> None:
        super().__init__(running, congested, clock, sleep, burst_s)
        self.records_per_s = records_per_s
        self.paced = 0  # records that waited for their turn (telemetry, tests)

    async def take(self, records: int) -> None:
        """Before streaming ``records`` records: wait for their share of the rate, if paced."""
        if not self._pacing(self.records_per_s > 0 and records > 0):
            return
        now = self._clock()
        # The generic cell rate rule: the records go at once while the rate's clock runs no more
        # than burst_s ahead of now, else they wait until it does; either way the clock moves on.
        start = max(now, self._next)
        self._next = start + records / self.records_per_s
        wait = start - now - self.burst_s
        if wait > 0:
            self.paced += records
            await self._sleep(wait)


class LoopBudget(_Paced):
    """The event loop's time reads may take while ``running()`` executions are under way and the
    loop is congested: ``share`` of it (0.05: 5%) for all readers together, after a burst of
    ``burst_s`` worth; 0 never paces. A read charges the time its steps take on the loop
    (``spend``, or everything ``timed`` measures) and looks at the budget (``take``) between
    chunks of what it streams; a look that finds the readers ahead of their share waits until they
    are not. The controller that is given a budget without ``running`` counts its own executions."""

    def __init__(
        self,
        share: float,
        running: Callable[[], int] | None = None,
        *,
        congested: Callable[[], bool] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        burst_s: float = BURST_S,
    ) -> None:
        super().__init__(running, congested, clock, sleep, burst_s)
        self.share = share
        self.spent = 0.0  # loop time charged, in seconds (telemetry, tests)
        self.paced = 0  # looks at the budget that waited (telemetry, tests)

    def spend(self, seconds: float) -> None:
        """Charge ``seconds`` of the loop's time, taken by a read."""
        self.spent += seconds
        if self.share > 0:
            self._next = max(self._next, self._clock()) + seconds / self.share

    async def take(self) -> None:
        """Before streaming more: wait while the readers are ahead of their share, if paced."""
        if not self._pacing(self.share > 0):
            return
        wait = self._next - self._clock() - self.burst_s
        if wait > 0:
            self.paced += 1
            await self._sleep(wait)

    async def stream(self, items: Sequence[_T]) -> AsyncIterator[_T]:
        """``items`` one by one, each ``CHUNK`` of them after a ``take``."""
        for at in range(0, len(items), CHUNK):
            await self.take()
            for item in items[at : at + CHUNK]:
                yield item

    def timed(self, work: Coroutine[Any, Any, _T]) -> Awaitable[_T]:
        """``work``, awaited with every step it takes on the loop charged (``spend``): a read's
        own code and whatever it awaits without suspending, such as gRPC's serializing and
        queueing of each message it writes. Not charged: what runs outside the call's task (gRPC's
        completion callbacks, a journal thread's decoding)."""
        return _Timed(work, self.spend, self._clock)


class _Timed(Generic[_T]):
    __slots__ = ("_clock", "_spend", "_work")

    def __init__(
        self, work: Coroutine[Any, Any, _T], spend: Callable[[float], None], clock: Callable[[], float]
    ) -> None:
        self._work, self._spend, self._clock = work, spend, clock

    def __await__(self) -> Generator[Any, Any, _T]:
        return _steps(self._work, self._spend, self._clock)


class _Charge:
    """Whether a timed read delivers live records now, and whether its current step did anything
    else (see ``live``)."""

    __slots__ = ("live", "other")

    def __init__(self) -> None:
        self.live = False
        self.other = False

    def begin_step(self) -> None:
        self.other = not self.live

    def owed(self) -> bool:
        """Whether the step just taken is charged: it did anything but deliver live records."""
        return self.other or not self.live


# The charge of the timed read running in this task (a context variable: each call its own).
_CHARGE: Final[contextvars.ContextVar[_Charge | None]] = contextvars.ContextVar(
    "agentsessions_read_charge", default=None
)


def live(delivering: bool) -> None:
    """Say whether the calling read now delivers live records (True) or stored ones (False).

    A live follower (``LiveSessions.Watch`` caught up with its session) delivers each record once,
    as the session's own turn appends it: its cost grows with the turns' rate, not with a journal's
    length, and it never waits on the budget (a follower waits only between pages it reads from the
    store). Charged, it only moved the budget's clock ahead of the reads that do wait: under the
    load suite, 20 watchers following live left 20 whole-journal replays a fraction of the share,
    and replays ran past their callers' one-minute deadline (bench/NOTEBOOK.md). So a step spent
    wholly on live delivery is not charged; any step that reads the store to catch up is, as a
    Replay's are."""
    charge = _CHARGE.get()
    if charge is not None:
        charge.live = delivering
        charge.other = charge.other or not delivering


def _steps(
    work: Coroutine[Any, Any, _T], spend: Callable[[float], None], clock: Callable[[], float]
) -> Generator[Any, Any, _T]:
    """Drive ``work`` as the awaiting task would, timing each step: what it yields (the future it
    waits on) goes up to the task unchanged, and what the task sends or throws comes back down.
    A step is charged unless the read delivered live records all through it (``live``)."""
    sent: Any = None
    thrown: BaseException | None = None
    charge = _Charge()
    _CHARGE.set(charge)  # this task's context: what ``live`` finds from within ``work``
    while True:
        began = clock()
        charge.begin_step()
        try:
            waits_on = work.send(sent) if thrown is None else work.throw(thrown)
        except StopIteration as done:
            if charge.owed():
                spend(clock() - began)
            result: _T = done.value
            return result
        except BaseException:
            if charge.owed():
                spend(clock() - began)
            raise
        if charge.owed():
            spend(clock() - began)
        sent, thrown = None, None
        try:
            sent = yield waits_on
        except GeneratorExit:
            work.close()
            raise
        except BaseException as exc:  # a cancel, or whatever the task throws: into the work
            thrown = exc
