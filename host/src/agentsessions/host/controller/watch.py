"""Watch: a session's records from any offset, exactly once and in order, then live as they become
durable; and the follow of one execution that a retried Exec streams.

Every record a follower delivers it read in seq order, either from the journal store or from the
journal feed (``journal.feed``), which this process fills after each commit and the PostgreSQL
listener fills with what other hosts committed. A follower keeps the seq of the next record it owes
and only ever delivers that one: a record the feed announces out of order, a head another host
moved, an inbox that overflowed (a slow follower) or a quiet ``poll_s`` all send it back to the
store, reading from that seq. So reconnecting with the last seq seen misses nothing and repeats
nothing, during a turn, across host restarts and across replicas, and a follower holds at most its
inbox and one page of records however far behind it is.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Final

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import pacing, sessions
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.errors import ExecutionCancelled, HarnessRunError
from agentsessions.host.controller.executions import latest_execution
from agentsessions.host.controller.state import SessionView, open_gate
from agentsessions.host.journal.feed import HeadMoved, QueueChanged, SessionDeleted, Subscription
from agentsessions.host.journal.live import RETRY, RUNNING, LiveStore, QueuedTurn
from agentsessions.host.journal.store import SessionNotFoundError
from agentsessions.sdk.extensions import RESULTS_PRINCIPAL
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2

K = common_pb2

PAGE: Final = 256  # records read from the store at a time
DEFAULT_POLL_S: Final = 2.0  # a quiet follower looks at the store this often
# Records whose append may change a session's derived state (exec state, pending approval, compute).
STATE_KINDS: Final = frozenset(
    int(k)
    for k in (
        K.EVENT_EXECUTION_START,
        K.EVENT_END,
        K.EVENT_ERROR,
        K.EVENT_APPROVAL_REQUEST,
        K.EVENT_APPROVAL_RESULT,
        K.EVENT_TOOL_RESULT,
        K.EVENT_LIFECYCLE,
    )
)
_VIEWS_KEPT: Final = 1024


@struct(frozen=True)
class QueueView:
    """A session's queued turns, as a watcher sees them."""

    uid: str
    turns: tuple[QueuedTurn, ...]


WatchItem = common_pb2.LogRecord | session_pb2.Delta | SessionView | QueueView
FollowItem = common_pb2.LogRecord | session_pb2.Delta | SessionView


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name


# Derived states a follower may see before the records that follow them (see watch()).
_SHOWN_AHEAD: Final = frozenset({session_pb2.EXEC_PENDING, session_pb2.EXEC_RUNNING})

CAUGHT_UP = _Marker("caught up")  # everything durable the follower knows of is delivered
QUIET = _Marker("quiet")  # nothing happened for poll_s (and the store has nothing new)


class Views:
    """Derived session views shared by the followers of a session: one derivation serves every
    follower that has delivered no record past it."""

    def __init__(self, core: Core) -> None:
        self._core = core
        self._views: OrderedDict[str, tuple[int, SessionView]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    async def at_least(self, uid: str, seq: int) -> SessionView:
        """The session's view derived at a head of at least ``seq`` (SessionNotFoundError once deleted)."""
        known = self._views.get(uid)
        if known is not None and known[0] >= seq:
            return known[1]
        lock = self._locks.setdefault(uid, asyncio.Lock())
        async with lock:
            known = self._views.get(uid)
            if known is not None and known[0] >= seq:
                return known[1]
            row = await self._core.store.get_session(uid)
            if row is None:
                self._views.pop(uid, None)
                self._locks.pop(uid, None)
                raise SessionNotFoundError(f"session {uid!r} was deleted")
            view = await sessions.view(self._core, row)
            self._views[uid] = (row.last_seq, view)
            self._views.move_to_end(uid)
            while len(self._views) > _VIEWS_KEPT:
                gone, _ = self._views.popitem(last=False)
                self._locks.pop(gone, None)
            return view


def _state(view: SessionView) -> tuple[int, str, tuple[str, str, int] | None]:
    ref = view.pending_approval
    pending = None if ref is None else (ref.execution_id, ref.tool_call_id, ref.request_seq)
    return view.exec_state, view.row.compute_state, pending


async def _pages(core: Core, uid: str, next_seq: int) -> AsyncIterator[common_pb2.LogRecord]:
    """The stored records from ``next_seq`` on, a page at a time."""
    while True:
        page = await core.store.read(uid, next_seq, next_seq + PAGE - 1)
        async for record in core.reads.stream(page):  # yields to turns under load (pacing.py)
            if record.seq != next_seq:
                return  # a gap (a purge moved the journal): read again from here next time
            yield record
            next_seq += 1
        if len(page) < PAGE:
            return


FeedOut = common_pb2.LogRecord | session_pb2.Delta | QueueChanged | _Marker


async def _follow(
    core: Core, uid: str, next_seq: int, sub: Subscription | None, poll_s: float
) -> AsyncIterator[FeedOut]:
    """Records from ``next_seq`` on, exactly once and in order, then (with ``sub``) live, with the
    feed's deltas and queue changes between them, CAUGHT_UP after each burst and QUIET after each
    quiet ``poll_s``. Raises SessionNotFoundError when the session is deleted."""
    while True:
        pacing.live(False)  # reading the store to catch up: charged to the readers' budget
        async for record in _pages(core, uid, next_seq):
            yield record
            next_seq = record.seq + 1
        yield CAUGHT_UP
        if sub is None:
            return
        pacing.live(True)  # records as the turns append them: not charged (pacing.live)
        reread = False
        while not reread:
            items = await sub.next(poll_s)
            if sub.take_overflow():
                break  # behind: everything missed is in the store
            if items is None:
                row = await core.store.get_session(uid)
                if row is None:
                    raise SessionNotFoundError(f"session {uid!r} was deleted")
                if row.last_seq >= next_seq:
                    break
                yield QUIET
                continue
            for item in items:
                if isinstance(item, common_pb2.LogRecord):
                    if item.seq == next_seq:
                        yield item
                        next_seq += 1
                    elif item.seq > next_seq:
                        reread = True  # announced out of order: read the gap from the store
                        break
                elif isinstance(item, session_pb2.Delta):
                    yield item
                elif isinstance(item, HeadMoved):
                    if item.seq >= next_seq:
                        reread = True
                elif isinstance(item, SessionDeleted):
                    raise SessionNotFoundError(f"session {uid!r} was deleted")
                elif isinstance(item, QueueChanged):
                    yield item
            if not reread:
                yield CAUGHT_UP


async def watch(
    core: Core,
    live: LiveStore,
    views: Views,
    call: CallContext,
    uid: str,
    after_seq: int,
    *,
    follow: bool,
    include_deltas: bool,
    poll_s: float = DEFAULT_POLL_S,
) -> AsyncIterator[WatchItem]:
    """The session first, its records with seq > ``after_seq``, then (``follow``) every new record,
    each change of its derived state, its queue, and (``include_deltas``) live deltas."""
    row = await sessions.row(core, call, uid)
    sub = live.feed.subscribe(uid) if follow else None
    try:
        view = await sessions.view(core, row)
        yield view
        shown = _state(view)
        queue: tuple[QueuedTurn, ...] = ()
        if follow:
            queue = tuple(await live.queue(uid))
            if queue:
                yield QueueView(uid, queue)
        seen = after_seq
        state_dirty = queue_dirty = False
        async for item in _follow(core, uid, after_seq + 1, sub, poll_s):
            if isinstance(item, common_pb2.LogRecord):
                yield item
                seen = item.seq
                state_dirty = state_dirty or item.event.kind in STATE_KINDS
            elif isinstance(item, session_pb2.Delta):
                if include_deltas:
                    yield item
            elif isinstance(item, QueueChanged):
                queue_dirty = True
            elif item is CAUGHT_UP and follow:
                if state_dirty:
                    view = await views.at_least(uid, seen)
                    # A view derived past the records delivered so far shows a turn running as it
                    # is; a settled or parked one waits for those records, so a follower never sees
                    # COMPLETED before the OUTPUT and END that made it.
                    if view.row.last_seq <= seen or view.exec_state in _SHOWN_AHEAD:
                        state_dirty = False
                        if _state(view) != shown:
                            shown = _state(view)
                            yield view
                if queue_dirty:
                    queue_dirty = False
                    now = tuple(await live.queue(uid))
                    if now != queue:
                        queue = now
                        yield QueueView(uid, queue)
    finally:
        if sub is not None:
            sub.close()


async def follow_execution(
    core: Core,
    live: LiveStore,
    call: CallContext,
    uid: str,
    execution_id: str,
    start_seq: int,
    *,
    poll_s: float = DEFAULT_POLL_S,
) -> AsyncIterator[FollowItem]:
    """What the Exec that admitted ``execution_id`` streams, from its first record: its records and
    deltas, live while it runs, and its ending as that Exec ends (OK; a final Session frame after a
    park; ExecutionCancelled; HarnessRunError for a failure nothing will recover)."""
    last = start_seq - 1  # the newest record of the execution delivered
    ended: common_pb2.HarnessEnd | None = None
    end_seq = 0
    look = False  # something happened that may have settled how the execution stands
    # An EXECUTION_START right after this execution's END: the settling's corrective turn, when the
    # record after it is the host's results INPUT (controller/results.py, one append with the END).
    pending: common_pb2.LogRecord | None = None
    with live.feed.subscribe(uid) as sub:
        async for item in _follow(core, uid, start_seq, sub, poll_s):
            if isinstance(item, common_pb2.LogRecord):
                event = item.event
                if pending is not None:
                    start, pending = pending, None
                    if (
                        item.seq == start.seq + 1
                        and event.kind == K.EVENT_INPUT
                        and event.execution_id == start.event.execution_id
                        and event.actor.principal == RESULTS_PRINCIPAL
                    ):
                        # The Exec that admitted the turn streams its corrective turns too.
                        execution_id, ended, end_seq = event.execution_id, None, 0
                        yield start
                        yield item
                        last = item.seq
                        continue
                if ended is not None and event.kind == K.EVENT_EXECUTION_START and item.seq == end_seq + 1:
                    pending = item
                    continue
                if event.execution_id == execution_id:
                    yield item
                    last = item.seq
                    if event.kind == K.EVENT_END:
                        ended, end_seq = event.end, item.seq
                    elif event.kind in (K.EVENT_ERROR, K.EVENT_APPROVAL_REQUEST):
                        look = True
                elif event.kind == K.EVENT_LIFECYCLE and item.seq == last + 1 and _marks(ended):
                    yield item  # its marker: the park's SUSPEND, the cancellation's CANCEL, RESUME
                    last = item.seq
                    look = True
                elif event.kind == K.EVENT_EXECUTION_START and ended is None:
                    look = True  # a newer turn: this one may have been superseded
                continue
            if isinstance(item, session_pb2.Delta):
                if item.execution_id == execution_id:
                    yield item
                continue
            if not isinstance(item, _Marker):
                continue
            if ended is not None:
                if ended.state == "CANCELED" and last == end_seq and item is CAUGHT_UP:
                    continue  # its CANCEL marker comes next (or a quiet spell says it will not)
                _raise_ending(ended)
                return
            if look or item is QUIET:
                look = False
                final = await _standing(core, live, call, uid, execution_id)
                if final is not None:
                    yield final
                    return


def _marks(ended: common_pb2.HarnessEnd | None) -> bool:
    """Whether a marker right after the followed records is still the execution's: any marker
    before its END; after it only a cancellation's CANCEL. (A recovery's RESUME after a finished
    END is not what the Exec that admitted the turn streamed, which ended with the END; before,
    whether a follower saw it depended on whether it arrived before the follower caught up.)"""
    return ended is None or ended.state == "CANCELED"


def _raise_ending(end: common_pb2.HarnessEnd) -> None:
    if end.state in ("", "COMPLETED"):
        return
    description = end.error.description or end.state
    if end.state == "CANCELED":
        raise ExecutionCancelled(description)
    raise HarnessRunError(description)


async def _standing(
    core: Core, live: LiveStore, call: CallContext, uid: str, execution_id: str
) -> SessionView | None:
    """How a followed execution without an END stands: the final Session frame when it is parked
    at an approval; raises when nothing will ever finish it; None while it runs or will be recovered."""
    row = await sessions.row(core, call, uid)
    events, executions = await sessions.read(core, row)
    ex = next((e for e in executions if e.id == execution_id), None)
    if ex is None or ex.completed:
        return None
    gate = open_gate(events, executions)
    if gate is not None and gate.execution is ex and not gate.decided:
        return await sessions.view(core, row)
    if ex is not latest_execution(executions):
        raise HarnessRunError(f"execution {execution_id} was superseded by a newer turn before its END")
    if ex.error_indexes:
        lease = await live.lease(uid, execution_id)
        if lease is None or lease.state not in (RETRY, RUNNING):
            raise HarnessRunError(events[ex.error_indexes[-1]].error.description or "the turn failed")
    return None
