"""Turns that run with no caller: Submit, queued turns, and Exec when its turns outlive the caller.

:class:`DetachedTurns` admits a turn exactly as Exec does (``turns.admit``: the same validation,
CAS and statuses) inside a task of its own, so the turn runs to its end whoever listens; a caller
may follow its updates and leave. Submit returns once the EXECUTION_START is durable.

What Submit does with a busy session (``on_busy``): REJECT answers as Exec does (ABORTED); ENQUEUE
puts the turn in the session's queue (``journal.live``, beside the journal), from which
:class:`TurnQueue` starts it as the next turn, in order, once the session is free (on this host or
any other; the queue survives restarts); INTERRUPT cancels what holds the session as Cancel does
(the running turn here or on another host, a turn parked at an approval, a turn a crash cut short)
and then runs the new turn ahead of any queued ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, Literal

from agentsessions.host import logs
from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import cancel, sessions, turns
from agentsessions.host.controller.admission import LiveAdmission, Ticket
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.drive import cancelled
from agentsessions.host.controller.errors import (
    ConcurrencyError,
    ControllerError,
    DeadlineExceededError,
    FailedPreconditionError,
    HarnessUnavailableError,
    InvalidArgumentError,
    PermissionDeniedError,
    RecordTooLargeError,
    ResourceExhaustedError,
    SessionBusyError,
    UnrecordableError,
)
from agentsessions.host.controller.executions import Execution, latest_execution
from agentsessions.host.controller.leases import LeaseKeeper
from agentsessions.host.controller.state import SessionView, open_gate
from agentsessions.host.controller.turns import ExecParams, Update
from agentsessions.host.journal.feed import SessionDeleted
from agentsessions.host.journal.live import KeyRecord, Lease, LiveStore, QueuedTurn, QueuedTurnGone
from agentsessions.host.journal.store import SessionNotFoundError, SessionRow, StoreError
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2

log = logging.getLogger("agentsessions.controller")

K = common_pb2
LK = common_pb2.Lifecycle

INTERRUPT_REASON: Final = "interrupted by a newer turn (Submit ON_BUSY_INTERRUPT)"
# How long an interrupting Submit waits for another host to end its turn, beyond the cancel grace.
INTERRUPT_MARGIN_S: Final = 5.0
POLL_S: Final = 0.5

OnBusy = Literal["reject", "enqueue", "interrupt"]
# Cancel a subagent child session (and its children) with a reason: (child, reason, caller).
CancelChild = Callable[[str, str, CallContext], Awaitable[None]]
Busy = Literal["here", "elsewhere", "parked", "queued", "interrupted"]


@struct(frozen=True)
class Submitted:
    """Where an admitted (or queued) turn stands."""

    view: SessionView
    execution_id: str  # the execution it runs as (for a queued turn: the one it will run as)
    start_seq: int  # its EXECUTION_START (0 while queued)
    queued: bool = False


class _End:
    """The end of a detached turn's updates: ``error`` is how it failed (None: it ended OK)."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


def _quiet(future: asyncio.Future[Any]) -> None:
    # Nobody may wait for a detached turn's outcome: its exception is not "never retrieved".
    if not future.cancelled():
        future.exception()


class DetachedRun:
    """One turn in a task of its own; ``follow`` relays its updates to a caller that may leave."""

    def __init__(self, listen: bool) -> None:
        loop = asyncio.get_running_loop()
        self.admitted: asyncio.Future[SessionView] = loop.create_future()
        self.started: asyncio.Future[common_pb2.LogRecord | None] = loop.create_future()
        for future in (self.admitted, self.started):
            future.add_done_callback(_quiet)
        self._updates: asyncio.Queue[Update | _End] | None = asyncio.Queue() if listen else None
        self.task: asyncio.Task[None] | None = None

    def _relay(self, item: Update | _End) -> None:
        if self._updates is not None:
            self._updates.put_nowait(item)

    def leave(self) -> None:
        """The caller went away: the turn goes on, its updates go nowhere."""
        self._updates = None

    async def follow(self) -> AsyncIterator[Update]:
        """The turn's updates from its first, raising how it failed."""
        updates = self._updates
        assert updates is not None, "this run was started without a listener"
        try:
            while True:
                item = await updates.get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            self.leave()

    async def run(self, core: Core, call: CallContext, p: ExecParams) -> None:
        try:
            async with turns.admit(core, call, p) as turn:
                if not self.admitted.done():  # a caller that left during the admission cancelled it
                    self.admitted.set_result(turn.view)
                async for update in turn.run():
                    if isinstance(update, common_pb2.LogRecord) and not self.started.done():
                        self.started.set_result(update)
                    self._relay(update)
        except BaseException as exc:
            for future in (self.admitted, self.started):
                if not future.done():
                    future.set_exception(exc)
            self._relay(_End(exc))
            if isinstance(exc, asyncio.CancelledError):
                raise
            if self._updates is None and not isinstance(exc, ControllerError | StoreError):
                log.exception("detached turn failed", extra=logs.fields(session=p.session))
            return
        if not self.started.done():
            self.started.set_result(None)
        self._relay(_End(None))


class DetachedTurns:
    """The turns this host runs with no caller holding them."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    def __len__(self) -> int:
        return len(self._tasks)

    def stop_launching(self) -> None:
        """The host drains: no new detached turn (a Submit now answers UNAVAILABLE)."""
        self._closing = True

    def launch(self, p: ExecParams, call: CallContext, *, listen: bool = False) -> DetachedRun:
        if self._closing:
            raise HarnessUnavailableError("the host is shutting down")
        run = DetachedRun(listen)
        task = asyncio.get_running_loop().create_task(run.run(self.core, call, p))
        run.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return run

    async def start(
        self, p: ExecParams, call: CallContext
    ) -> tuple[SessionView, common_pb2.LogRecord | None]:
        """Admit ``p`` detached; once its EXECUTION_START is durable, the session at admission and
        that record (None for a turn that journaled none, a recovery). Admission errors raise."""
        run = self.launch(p, call)
        view = await run.admitted
        return view, await run.started

    async def close(self, grace_s: float, keeper: LeaseKeeper | None) -> None:
        """Let detached turns finish for ``grace_s``, then cut them (left for another attempt)."""
        self._closing = True
        if self._tasks and grace_s > 0:
            await asyncio.wait(list(self._tasks), timeout=grace_s)
        if keeper is not None:
            keeper.drain()
        await cancelled(list(self._tasks))


def exec_request(p: ExecParams) -> session_pb2.ExecRequest:
    """The ExecRequest of ``p`` (what a queued turn keeps)."""
    request = session_pb2.ExecRequest(
        session=p.session,
        inputs=list(p.inputs),
        harness=p.harness,
        config=p.config,
        resume_from_seq=p.resume_from_seq,
        deadline_unix=p.deadline_unix,
    )
    if p.expected_last_seq is not None:
        request.expected_last_seq = p.expected_last_seq
    return request


def exec_params(request: session_pb2.ExecRequest) -> ExecParams:
    return ExecParams(
        session=request.session,
        inputs=list(request.inputs),
        harness=request.harness,
        config=request.config,
        resume_from_seq=request.resume_from_seq,
        expected_last_seq=request.expected_last_seq if request.HasField("expected_last_seq") else None,
        deadline_unix=request.deadline_unix,
    )


class TurnQueue:
    """Starts each session's queued turns, one after the other, when the session is free."""

    def __init__(
        self,
        core: Core,
        live: LiveStore,
        admission: LiveAdmission,
        detached: DetachedTurns,
        host: CallContext,
    ) -> None:
        self.core = core
        self.live = live
        self.admission = admission
        self.detached = detached
        self.host = host  # queued turns run with the host's authority (the submitter's was checked)
        self.interrupting: set[str] = set()  # sessions an INTERRUPT holds: nothing queued starts
        self._advancing: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._closed = False

    def kick(self, uid: str) -> None:
        """The session may be free: start its next queued turn, if it has one."""
        if self._closed:
            return  # the host is stopping: queued turns stay queued for the next start
        if uid in self._advancing:
            self._again.add(uid)
            return
        task = asyncio.get_running_loop().create_task(self._advance(uid))
        self._advancing[uid] = task
        task.add_done_callback(lambda _: self._advanced(uid))

    def _advanced(self, uid: str) -> None:
        self._advancing.pop(uid, None)
        if uid in self._again:
            self._again.discard(uid)
            self.kick(uid)

    async def close(self) -> None:
        self._closed = True  # a turn that ends during the drain advances no queue after this
        await cancelled(list(self._advancing.values()))

    async def _advance(self, uid: str) -> None:
        core = self.core
        try:
            while uid not in self.interrupting:
                if core.guards.busy(uid) or uid in core.driver.running:
                    # Free in a moment (a turn ending releases its guard after its last frame).
                    async with core.guards.hold_when_free(uid):
                        pass
                    continue  # looked at again: an interrupting Submit may hold the session now
                waiting = await self.live.queue(uid)
                if not waiting:
                    self.admission.queued.discard(uid)
                    return
                self.admission.queued.add(uid)
                if not await self._start(uid, waiting[0]):
                    return
        except (SessionBusyError, StoreError) as exc:
            log.info("queued turn not started yet", extra=logs.fields(session=uid, error=type(exc).__name__))
        except Exception:  # the queue is kicked again (a turn's end, the recovery scan); it is logged
            log.exception("queued turn not started", extra=logs.fields(session=uid))

    async def _start(self, uid: str, head: QueuedTurn) -> bool:
        """Start ``head``; False when the queue must wait (True: look at the next one)."""
        p = dataclasses.replace(
            exec_params(head.exec_request()),
            session=uid,
            expected_last_seq=None,
            execution_id=head.execution_id,
            ticket=Ticket(queued=head.execution_id),
        )
        try:
            await self.detached.start(p, self.host)
        except QueuedTurnGone:
            return True  # another host started it
        except (
            InvalidArgumentError,
            FailedPreconditionError,
            DeadlineExceededError,
            PermissionDeniedError,
            SessionNotFoundError,
            RecordTooLargeError,  # its inputs make a record the journal refuses: never admitted
            UnrecordableError,
        ) as exc:
            # It can never run: dropped, so the turns behind it do not wait forever.
            what = logs.fields(session=uid, execution_id=head.execution_id, error=type(exc).__name__)
            log.warning("queued turn dropped: it cannot be admitted", extra=what)
            await self.live.dequeue(uid, head.execution_id)
            return True
        except (SessionBusyError, ConcurrencyError, HarnessUnavailableError, ResourceExhaustedError) as exc:
            # Busy, or the execution limits are full: the next look (a turn ending, the recovery scan).
            what = logs.fields(session=uid, execution_id=head.execution_id, error=type(exc).__name__)
            log.info("queued turn waits", extra=what)
            return False
        return False  # it runs; its end starts the next


class Submitter:
    """Submit: admit a turn detached, or queue it, or interrupt what holds the session."""

    def __init__(
        self,
        core: Core,
        live: LiveStore,
        keeper: LeaseKeeper,
        detached: DetachedTurns,
        queue: TurnQueue,
    ) -> None:
        self.core = core
        self.live = live
        self.keeper = keeper
        self.detached = detached
        self.queue = queue
        # The subagent children of a session's latest turn, and how one is cancelled with theirs
        # (LiveSessions sets both: the subagents need this Submitter, so they cannot be handed in here).
        self.children: Callable[[str], Awaitable[list[str]]] | None = None
        self.cancel_child: CancelChild | None = None

    async def submit(
        self, p: ExecParams, on_busy: OnBusy, call: CallContext, key: KeyRecord | None = None
    ) -> Submitted:
        if on_busy == "enqueue" and p.expected_last_seq is not None:
            raise InvalidArgumentError(
                "exec.expected_last_seq",
                "cannot be combined with on_busy ON_BUSY_ENQUEUE: "
                "a queued turn starts at a head not known yet",
            )
        ticket = Ticket(key=key)
        if p.session and on_busy != "reject":
            busy = await self.busy(p.session, call)
            if busy is not None and (on_busy == "interrupt" or busy != "interrupted"):
                if on_busy == "enqueue":
                    return await self._enqueue(p, call, key)
                self.queue.interrupting.add(p.session)
                try:
                    # Read before the cancel: the children of the turn it ends (not of the next one).
                    children = (
                        await self.children(p.session)
                        if self.children is not None and busy != "queued"
                        else []
                    )
                    p = await self._interrupt(p, busy, call)
                    ticket = Ticket(key=key, ahead_of_queue=True)
                    try:
                        return await self._start(dataclasses.replace(p, ticket=ticket), call)
                    finally:
                        # Once the new turn holds the session (or failed to): a child's end then finds
                        # the session busy or the interrupted turn ended, and decides nothing.
                        await self._cancel_children(p.session, children, call)
                finally:
                    self.queue.interrupting.discard(p.session)
                    self.queue.kick(p.session)
        try:
            return await self._start(dataclasses.replace(p, ticket=ticket), call)
        except SessionBusyError:
            if on_busy == "enqueue" and p.session:
                return await self._enqueue(p, call, key)
            raise

    async def _start(self, p: ExecParams, call: CallContext) -> Submitted:
        view, start = await self.detached.start(p, call)
        uid = view.row.uid
        now = await sessions.look(self.core, call, uid)
        if start is None:
            return Submitted(now, "", 0)
        return Submitted(now, start.event.execution_id, start.seq)

    async def _enqueue(self, p: ExecParams, call: CallContext, key: KeyRecord | None) -> Submitted:
        core = self.core
        row = await sessions.row(core, call, p.session)
        execution_id = p.execution_id or core.new_id()
        submitter = call.principal.principal if call.principal is not None else ""
        request = exec_request(dataclasses.replace(p, expected_last_seq=None)).SerializeToString(
            deterministic=True
        )
        await self.live.enqueue(row.uid, execution_id, request, submitter, key)
        self.queue.admission.queued.add(row.uid)
        self.queue.kick(row.uid)  # the session may have become free meanwhile
        return Submitted(await sessions.view(core, row), execution_id, 0, queued=True)

    async def busy(self, uid: str, call: CallContext) -> Busy | None:
        """What holds the session, if anything."""
        core = self.core
        row = await sessions.row(core, call, uid)
        if core.guards.busy(uid) or uid in core.driver.running:
            return "here"
        events, executions = await sessions.read(core, row)
        if open_gate(events, executions) is not None:
            return "parked"
        latest = latest_execution(executions)
        if latest is not None and not (latest.completed or latest.legacy or latest.inherited):
            lease = await self.live.lease(uid, latest.id)
            if lease is not None and await self.keeper.live_elsewhere(lease):
                return "elsewhere"
            if not latest.error_indexes or lease is not None:
                return "interrupted"
        if uid in self.queue.admission.queued or await self.live.queue(uid):
            return "queued"
        return None

    async def _interrupt(self, p: ExecParams, busy: Busy, call: CallContext) -> ExecParams:
        """Cancel what holds the session (as Cancel does); the request to run next (its CAS checked
        against the head the caller saw, before anything was cancelled)."""
        core, uid = self.core, p.session
        if p.expected_last_seq is not None:
            head = (await core.store.head(uid)).seq
            if head != p.expected_last_seq:
                raise ConcurrencyError(f"expected_last_seq {p.expected_last_seq} does not match head {head}")
        if busy == "here":
            # A running turn is stopped; one still being admitted ends CANCELED once driven.
            await cancel.cancel(core, call, uid, "", INTERRUPT_REASON)
            async with core.guards.hold_when_free(uid):
                pass
            # A turn that was parking (or being cut) as it was looked at stands there now.
            now = await self.busy(uid, call)
            busy = now if now in ("parked", "elsewhere", "interrupted") else busy
        if busy == "parked":
            await cancel.cancel(core, call, uid, "", INTERRUPT_REASON)
        elif busy in ("elsewhere", "interrupted"):
            await self._end_elsewhere(uid, call, INTERRUPT_REASON)
        return dataclasses.replace(p, expected_last_seq=None)

    async def _cancel_children(self, uid: str, children: list[str], call: CallContext) -> None:
        """Cancel the subagent children of the interrupted turn (and theirs), naming their parent; a
        failure is logged: the new turn is admitted, and the Submit answers for it."""
        if self.cancel_child is None:
            return
        for child in children:
            try:
                await self.cancel_child(child, f"its parent session {uid} was {INTERRUPT_REASON}", call)
            except (ControllerError, StoreError) as exc:
                what = logs.fields(session=child, parent=uid, error=type(exc).__name__)
                log.warning("subagent of an interrupted turn not cancelled", extra=what)

    async def _end_elsewhere(self, uid: str, call: CallContext, reason: str) -> None:
        """Ask the host running the session's turn to cancel it and wait (bounded) for its END; a
        turn nobody runs any more (its lease expired) is closed here, END{CANCELED} and CANCEL."""
        core = self.core
        row = await sessions.row(core, call, uid)
        _, executions = await sessions.read(core, row)
        latest = latest_execution(executions)
        if latest is None or latest.completed:
            return
        lease = await self.live.lease(uid, latest.id)
        if lease is not None and await self.keeper.live_elsewhere(lease):
            await self.live.request_cancel(uid, latest.id, reason)
            limit = self.stop_limit_s()
            if await self.wait_ended(row, latest.id, limit):
                return
            raise SessionBusyError(uid, f"with a turn on another host that did not stop within {limit:g} s")
        async with core.guards.hold(uid):
            await close_cancelled(core, self.keeper, row, latest, lease, reason)

    def stop_limit_s(self) -> float:
        """How long another host may take to stop a turn it was asked to cancel: it hears at its
        next lease renewal at the latest, then has the cancel grace."""
        return self.core.cancel_grace_s + self.keeper.settings.ttl_s / 3 + INTERRUPT_MARGIN_S

    async def wait_ended(self, row: SessionRow, execution_id: str, limit_s: float) -> bool:
        """Wait (bounded) until the execution has an END in the journal."""
        core = self.core
        deadline = time.monotonic() + limit_s
        with self.live.feed.subscribe(row.uid) as sub:
            while time.monotonic() < deadline:
                _, executions = await sessions.read(core, row)
                ex = next((e for e in executions if e.id == execution_id), None)
                if ex is None or ex.completed:
                    return True
                items = await sub.next(min(POLL_S, max(0.0, deadline - time.monotonic())))
                if items and any(isinstance(i, SessionDeleted) for i in items):
                    raise SessionNotFoundError(f"session {row.uid!r} was deleted")
        return False


async def close_cancelled(
    core: Core, keeper: LeaseKeeper, row: SessionRow, ex: Execution, lease: Lease | None, reason: str
) -> None:
    """END{CANCELED} and the CANCEL marker for an execution nobody runs (the caller holds the guard)."""
    uid = row.uid
    claimed = keeper.fresh(uid, ex.id, attempts=lease.attempts if lease is not None else 0)
    if not await keeper.live.claim(lease, claimed):
        raise SessionBusyError(uid, "with a turn another host took meanwhile")
    keeper.adopted(uid, ex.id)
    events = await core.cache.events(uid)
    fence = await core.writer.mint(uid, len(events))
    end = common_pb2.Event(
        execution_id=ex.id,
        kind=K.EVENT_END,
        end=common_pb2.HarnessEnd(state="CANCELED", error=common_pb2.Error(code=1, description=reason)),
    )
    await core.writer.append(uid, [end], len(events), fence)
    await core.writer.marker(uid, fence, common_pb2.Lifecycle(kind=LK.LIFECYCLE_CANCEL, detail=reason))
    await keeper.ended(uid, ex.id)
