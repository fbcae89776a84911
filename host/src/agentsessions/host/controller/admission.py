"""How Exec admits a new turn: what it checks first, and how the turn's first records are written.

``turns.py`` asks its Core's :class:`Admission` three things: whether the session may take a new
turn now (``check``, before the guard), the journal the turn starts from and its CAS head
(``prepare``, under the guard), and to append EXECUTION_START and the INPUTs (``start``). The plain
host (no live tables) checks nothing more than the reference does and appends through the writer.

:class:`LiveAdmission` is the host with leases (``leases.py``): the EXECUTION_START goes in one
transaction with the execution's lease, the idempotency key that admitted it and the queue entry it
leaves (``journal.live.LiveStore.admit``); a session whose last execution was cut short (no END, no
ERROR) first has it recovered (or, with recovery off, is refused naming Resume); one whose turn
runs on another host is busy (ABORTED), as it is when it runs here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from agentsessions.host.controller.errors import (
    ConcurrencyError,
    FailedPreconditionError,
    SessionBusyError,
)
from agentsessions.host.controller.executions import Execution, latest_execution
from agentsessions.host.controller.sink import DeltaHold, DeltaSink
from agentsessions.host.controller.state import open_gate
from agentsessions.host.journal.feed import JournalFeed
from agentsessions.host.journal.live import RETRY, KeyRecord, LiveStore
from agentsessions.host.journal.store import ConflictError, FencedError, SessionRow
from agentsessions.host.telemetry.genai import journal_append
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2

if TYPE_CHECKING:  # the Core holds an Admission: no import cycle at run time
    from agentsessions.host.controller.core import Core
    from agentsessions.host.controller.leases import LeaseKeeper
    from agentsessions.host.controller.turns import ExecParams


@struct(frozen=True)
class Ticket:
    """What a turn's admission carries besides its request (set by the host, never by a client)."""

    key: KeyRecord | None = None  # the idempotency key that admits it
    queued: str = ""  # the queued turn it takes off its session's queue
    ahead_of_queue: bool = False  # an interrupting turn runs before the queued ones


def busy_elsewhere(uid: str, owner: str) -> SessionBusyError:
    """The session's turn runs on another host (its lease is held and renewed)."""
    host = owner.split("/", 1)[0] or "another host"
    return SessionBusyError(uid, f"with a turn that runs on host {host}")


class Admission:
    """The plain host's admission: the reference's checks, the writer's append."""

    async def check(
        self,
        core: Core,
        row: SessionRow,
        events: Sequence[common_pb2.Event],
        executions: list[Execution],
        p: ExecParams,
    ) -> Execution | None:
        """Before the guard: raise when the session may not take a turn now; the interrupted
        execution to recover first, if any."""
        return None

    async def prepare(
        self,
        core: Core,
        row: SessionRow,
        p: ExecParams,
        events: Sequence[common_pb2.Event],
        interrupted: Execution | None,
    ) -> tuple[Sequence[common_pb2.Event], int]:
        """Under the guard: the journal the turn starts from and the head its EXECUTION_START extends."""
        return events, p.expected_last_seq if p.expected_last_seq is not None else len(events)

    async def start(
        self, core: Core, row: SessionRow, p: ExecParams, events: Sequence[common_pb2.Event], expected: int
    ) -> list[common_pb2.LogRecord]:
        """EXECUTION_START and the INPUTs at ``expected`` (CAS), under a fence minted with them."""
        return await core.writer.append(row.uid, events, expected, 0, mint_fence=True)

    def deltas(self, uid: str, relay: DeltaSink, hold: DeltaHold) -> tuple[DeltaSink, DeltaHold]:
        """Where a live turn's deltas go: the Exec stream (``relay``, held by ``hold``)."""
        return relay, hold

    async def follow_on(
        self, core: Core, uid: str, events: Sequence[common_pb2.Event], head: int, fence: int
    ) -> list[common_pb2.LogRecord]:
        """One execution's END and the next one's EXECUTION_START and INPUTs (a corrective turn,
        ``results.py``) in one append at ``head``; the records carry the fence the next one runs under."""
        return await core.writer.append(uid, events, head, fence)


# Recovers an interrupted execution under the guard its caller holds (recoverer.py).
Recover = Callable[["Core", SessionRow, Execution], Awaitable[object]]


class LiveAdmission(Admission):
    """Admission on a host with leases, idempotency keys and queued turns."""

    def __init__(self, live: LiveStore, keeper: LeaseKeeper, *, recover: Recover | None) -> None:
        self.live = live
        self.keeper = keeper
        self._recover = recover  # None: recovery off, an interrupted turn is refused naming Resume
        # Sessions this host knows have queued turns: a new turn does not jump their queue.
        self.queued: set[str] = set()

    async def check(
        self,
        core: Core,
        row: SessionRow,
        events: Sequence[common_pb2.Event],
        executions: list[Execution],
        p: ExecParams,
    ) -> Execution | None:
        uid = row.uid
        ticket = p.ticket
        if uid in self.queued and (ticket is None or not (ticket.queued or ticket.ahead_of_queue)):
            waiting = await self.live.queue(uid)
            if waiting:
                raise SessionBusyError(uid, f"with {len(waiting)} queued turn(s) that run first")
            self.queued.discard(uid)
        latest = latest_execution(executions)
        if latest is None or latest.completed or latest.legacy or latest.inherited:
            return None
        if uid in core.driver.running or core.guards.busy(uid):
            return None  # running here: the guard answers ABORTED
        lease = await self.live.lease(uid, latest.id)
        if lease is not None and await self.keeper.live_elsewhere(lease):
            raise busy_elsewhere(uid, lease.owner)
        # Cut short: no END and no ERROR, or a failed attempt that recovery has not given up on.
        if latest.error_indexes and (lease is None or lease.state != RETRY):
            return None
        if _awaits_decision(events, executions):
            return None  # a parked turn: the approval gate decides what may happen
        if self._recover is None:
            raise FailedPreconditionError(
                f"session {uid}: execution {latest.id} was interrupted before its END; "
                "Resume completes it before a new turn can start"
            )
        return latest

    async def prepare(
        self,
        core: Core,
        row: SessionRow,
        p: ExecParams,
        events: Sequence[common_pb2.Event],
        interrupted: Execution | None,
    ) -> tuple[Sequence[common_pb2.Event], int]:
        if interrupted is None or self._recover is None:
            return await super().prepare(core, row, p, events, interrupted)
        # The caller's CAS is against the journal it saw: before the recovery appends to it.
        if p.expected_last_seq is not None and p.expected_last_seq != len(events):
            raise ConcurrencyError(
                f"expected_last_seq {p.expected_last_seq} does not match head {len(events)} "
                f"of session {row.uid}"
            )
        await self._recover(core, row, interrupted)
        events = await core.cache.events(row.uid)
        return events, len(events)

    async def start(
        self, core: Core, row: SessionRow, p: ExecParams, events: Sequence[common_pb2.Event], expected: int
    ) -> list[common_pb2.LogRecord]:
        ticket = p.ticket
        return await self._admitted(
            core,
            row.uid,
            events,
            expected,
            events[0].execution_id,
            key=ticket.key if ticket is not None else None,
            queued=ticket.queued if ticket is not None else "",
        )

    async def _admitted(
        self,
        core: Core,
        uid: str,
        events: Sequence[common_pb2.Event],
        expected: int,
        execution_id: str,
        *,
        key: KeyRecord | None = None,
        queued: str = "",
    ) -> list[common_pb2.LogRecord]:
        """Append ``events`` at ``expected`` with ``execution_id``'s lease (and the key or queue row
        it takes) in the same transaction, under a fence minted there."""
        lease = self.keeper.fresh(uid, execution_id)
        try:
            with journal_append(uid, len(events)) as span:
                # Normalized by the store, as it prepares the append (spec 3.3).
                records = await self.live.admit(uid, events, expected, lease, key=key, queued=queued)
                span.wrote(records)
        except ConflictError as exc:
            raise ConcurrencyError(f"session {uid}: {exc}") from exc
        except FencedError as exc:
            raise ConcurrencyError(f"session {uid}: superseded by a newer writer: {exc}") from exc
        self.keeper.adopted(uid, execution_id)
        core.cache.appended(uid, records)
        return records

    def deltas(self, uid: str, relay: DeltaSink, hold: DeltaHold) -> tuple[DeltaSink, DeltaHold]:
        """The Exec stream and the session's followers (Watch, a retried Exec)."""
        feed = self.live.feed

        async def both(delta: session_pb2.Delta) -> None:
            feed.delta(uid, delta)
            await relay(delta)

        return both, _HeldWithFollowers(feed, uid, hold)

    async def follow_on(
        self, core: Core, uid: str, events: Sequence[common_pb2.Event], head: int, fence: int
    ) -> list[common_pb2.LogRecord]:
        """As a new turn is admitted: the next execution's lease in the transaction of its
        EXECUTION_START (under a fence minted there), so a crash right after it leaves an
        execution the recoverer finds by its lease."""
        execution_id = next(e.execution_id for e in events if e.kind == common_pb2.EVENT_EXECUTION_START)
        return await self._admitted(core, uid, events, head, execution_id)


def _awaits_decision(events: Sequence[common_pb2.Event], executions: list[Execution]) -> bool:
    return open_gate(events, executions) is not None


@struct(frozen=True)
class _HeldWithFollowers:
    """Holds a model call's frames for the Exec stream and for the session's followers alike."""

    feed: JournalFeed
    uid: str
    stream: DeltaHold

    def hold(self, model_call_id: str) -> None:
        self.feed.hold_deltas(self.uid, model_call_id)
        self.stream.hold(model_call_id)

    def release(self) -> None:
        self.feed.release_deltas(self.uid)
        self.stream.release()
