"""Live sessions: what a host with leases adds to the controller (``agentsessions.ext.v1.LiveSessions``
and the live behaviour of the v1 calls).

:class:`LiveSessions` is built by the Controller when the journal store keeps live tables and the
host asks for them (``LiveSettings``); the Controller hands it Exec admission, CreateSession, Fork,
Approve and Cancel, and the service layer calls ``watch`` and ``submit``. It composes:

* Watch and the follow of a retried Exec (``watch.py``);
* detached turns, Submit with ``on_busy`` and the turn queue (``detached.py``);
* idempotency keys (``idempotency.py``) on Exec, Submit, Fork, CreateSession, Approve and Cancel;
* leases and their renewal (``leases.py``) and automatic recovery (``recoverer.py``);
* Cancel across hosts: a turn running on another host is asked to stop through its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import field
from types import TracebackType
from typing import TYPE_CHECKING, Final, Protocol, overload

from agentsessions.host.callcontext import ANONYMOUS, CallContext
from agentsessions.host.controller import approvals, cancel, fork, sessions, turns
from agentsessions.host.controller.admission import LiveAdmission, Ticket
from agentsessions.host.controller.approvals import Decision
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.detached import (
    DetachedTurns,
    OnBusy,
    Submitted,
    Submitter,
    TurnQueue,
    close_cancelled,
)
from agentsessions.host.controller.errors import ConcurrencyError, FailedPreconditionError, SessionBusyError
from agentsessions.host.controller.executions import Execution, latest_execution
from agentsessions.host.controller.fork import MAX_FORK_CHILDREN, ForkParams
from agentsessions.host.controller.idempotency import DEFAULT_RETENTION_S, Keys, Part
from agentsessions.host.controller.leases import DEFAULT_LEASE_TTL_S, LeaseKeeper
from agentsessions.host.controller.recoverer import (
    DEFAULT_ATTEMPTS,
    DEFAULT_SCAN_S,
    Recoverer,
    RecoverySettings,
    recover_held,
)
from agentsessions.host.controller.sessions import new_session_uid
from agentsessions.host.controller.state import SessionView, open_gate
from agentsessions.host.controller.subagents import Subagents, SubagentSettings
from agentsessions.host.controller.turns import ExecParams, Update
from agentsessions.host.controller.watch import (
    DEFAULT_POLL_S,
    FollowItem,
    Views,
    WatchItem,
    follow_execution,
    watch,
)
from agentsessions.host.journal import POSTGRES_SCHEMES
from agentsessions.host.journal.feed import FeedItem, QueueChanged
from agentsessions.host.journal.live import DONE, QUEUED, IdempotencyKeyTaken, KeyRecord, LiveStore
from agentsessions.host.journal.store import SessionExistsError, SessionNotFoundError, SessionRow
from agentsessions.host.tools.task import TASK_TOOL
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

if TYPE_CHECKING:
    from agentsessions.host.journal import live_postgres

# How long a retried request waits for the original, still being admitted, to become durable.
ORIGINAL_WAIT_S: Final = 15.0
POLL_S: Final = 0.25


@struct(frozen=True)
class LiveSettings:
    """What ``agentsessions serve`` sets from its flags (docs/live.md)."""

    recover: bool = True
    attempts: int = DEFAULT_ATTEMPTS
    backoff_s: float = 1.0
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    scan_s: float = DEFAULT_SCAN_S
    key_retention_s: float = DEFAULT_RETENTION_S
    detach_exec: bool = False  # plain Exec turns outlive their caller
    watch_poll_s: float = DEFAULT_POLL_S
    host_call: CallContext = ANONYMOUS  # the host's own authority (queued turns)
    subagents: SubagentSettings = field(default_factory=SubagentSettings)  # task limits (docs/subagents.md)


class AdmittedTurn(Protocol):
    """What an admitted Exec streams: the session first (``view``), then ``run()``."""

    @property
    def view(self) -> SessionView: ...

    def run(self) -> AsyncIterator[Update]: ...


class _Following:
    """A turn the caller follows but does not hold (detached, or the one a retried key names)."""

    def __init__(self, view: SessionView, updates: AsyncIterator[Update] | AsyncIterator[FollowItem]) -> None:
        self._view = view
        self._updates = updates

    @property
    def view(self) -> SessionView:
        return self._view

    async def run(self) -> AsyncIterator[Update]:
        async for update in self._updates:
            yield update


def _exec_parts(p: ExecParams) -> list[Part]:
    # deadline_unix is left out: a per-attempt bound a retrying client may recompute.
    parts: list[Part] = [p.session, p.harness, p.config, p.resume_from_seq, p.expected_last_seq, *p.inputs]
    if p.result_schema is not None:  # only then: the digests of keys taken before stay the same
        parts.append(json.dumps(p.result_schema, sort_keys=True))
    return parts


def _row_parts(row: SessionRow) -> list[Part]:
    return [
        row.project,
        row.name,
        row.harness,
        row.model,
        json.dumps(dict(row.labels), sort_keys=True),
        json.dumps(dict(row.annotations), sort_keys=True),
        row.origin,
        row.identity,
    ]


class LiveSessions:
    """The live parts of one host's controller (see the module doc)."""

    def __init__(
        self,
        core: Core,
        live: LiveStore,
        keeper: LeaseKeeper,
        admission: LiveAdmission,
        settings: LiveSettings,
    ) -> None:
        self.core = core
        self.live = live
        self.keeper = keeper
        self.admission = admission
        self.settings = settings
        self.keys = Keys(live, settings.key_retention_s)
        self.views = Views(core)
        self.detached = DetachedTurns(core)
        self.queue = TurnQueue(core, live, admission, self.detached, settings.host_call)
        self.submitter = Submitter(core, live, keeper, self.detached, self.queue)
        self.recovery = RecoverySettings(settings.recover, settings.attempts, settings.scan_s)
        self.recoverer: Recoverer | None = None
        if settings.recover:
            self.recoverer = Recoverer(
                core, keeper, self.recovery, on_idle=self.queue.kick, purge_keys=live.purge_keys
            )
        # The task tool (subagents.py): offered to harnesses that list it; its gates only the host decides.
        self.subagents = Subagents(
            core, self.submitter, settings.subagents, settings.host_call, on_decided=self._continue_decided
        )
        core.sinks.tasks = self.subagents
        self.submitter.children = self._children_of_latest
        self.submitter.cancel_child = self._cancel_child
        core.policy.host_decided = frozenset({TASK_TOOL})
        keeper.on_ended = self._ended
        live.feed.listen(self._heard)
        self.listener: live_postgres.PostgresListener | None = None  # of other hosts' commits (PostgreSQL)
        self._drain_started: float | None = None

    # -- the host's lifetime -------------------------------------------------------------------

    async def start(self) -> None:
        """Renew leases, start the listener of other hosts (PostgreSQL) and the recoverer (which
        scans at once: start-up recovery)."""
        self.keeper.start()
        url = getattr(self.live.store, "url", None)  # a PostgreSQL store: other hosts commit too
        if isinstance(url, str) and url.startswith(POSTGRES_SCHEMES):
            # Imported here: asyncpg is loaded only by a host that journals to PostgreSQL.
            from agentsessions.host.journal.live_postgres import PostgresListener

            self.listener = PostgresListener(url, self.live.feed)
            self.listener.start()
        if self.recoverer is not None:
            self.recoverer.start()
        await self.subagents.start()

    def _continue_decided(self) -> None:
        if self.recoverer is not None:
            self.recoverer.wake()  # its next scan continues the decided parent

    def drain(self) -> None:
        """The host began to drain: nothing new starts here (recoveries, queued turns), and turns
        cut from now on are left for another attempt (another replica, or this host's next start)."""
        self._drain_started = time.monotonic()
        if self.recoverer is not None:
            self.recoverer.pause()
        self.detached.stop_launching()
        self.keeper.drain()

    async def close(self, grace_s: float = 0.0) -> None:
        await self.subagents.close()
        if self.recoverer is not None:
            await self.recoverer.close()
        await self.queue.close()
        spent = 0.0 if self._drain_started is None else time.monotonic() - self._drain_started
        await self.detached.close(max(0.0, grace_s - spent), self.keeper)
        await self.keeper.close()
        if self.listener is not None:
            await self.listener.close()

    def _ended(self, uid: str) -> None:
        self.subagents.ended(uid)
        if uid in self.admission.queued:
            self.queue.kick(uid)

    def _heard(self, uid: str, item: FeedItem) -> None:
        if isinstance(item, QueueChanged) and uid not in self.admission.queued:
            self.admission.queued.add(uid)  # another host queued a turn: look before admitting
            if not self.core.guards.busy(uid):
                self.queue.kick(uid)

    async def recover(self, core: Core, row: SessionRow, ex: Execution) -> None:
        """An Exec found ``ex`` cut short: recover it first, under the Exec's guard."""
        outcome = await recover_held(core, self.keeper, self.recovery, row, ex, None)
        if outcome == "parked":
            raise FailedPreconditionError(
                f"session {row.uid}: its interrupted turn stopped again at an approval gate; "
                "Approve it, then Resume or Exec without inputs"
            )

    # -- Exec ------------------------------------------------------------------------------------

    def admit_exec(self, p: ExecParams, call: CallContext) -> AbstractAsyncContextManager[AdmittedTurn]:
        """The Exec's turn, admitted when entered. (Context managers handed down, not wrapped in
        one more each: a turn enters this on every Exec.)"""
        asked = self.keys.request(call, "Exec", _exec_parts(p))
        if asked is None:
            return _Unkeyed(self, p, call)
        return self._keyed(p, call, asked)

    @contextlib.asynccontextmanager
    async def _keyed(self, p: ExecParams, call: CallContext, asked: KeyRecord) -> AsyncIterator[AdmittedTurn]:
        held, mine = await self._reservation(asked, p)
        if held.state == DONE:
            yield await self._replayed(held, call)
            return
        planned = await self._planned(p, held, call)
        # A reservation this call did not make is an earlier attempt's, which may have ended (its
        # host killed) before its turn started: once the session is free, this retry runs it.
        deadline = time.monotonic() + ORIGINAL_WAIT_S
        async with contextlib.AsyncExitStack() as stack:
            keyed: AdmittedTurn | None = None
            while keyed is None:
                try:
                    admitted = await stack.enter_async_context(self._admit(planned, call))
                    keyed = _KeyedTurn(admitted, self, asked, call)
                except SessionBusyError as exc:
                    if mine:
                        raise  # the key is this call's own: nothing else will run it (ABORTED)
                    keyed = await self.follow_original(
                        asked, call, exc, deadline, free=lambda: not self.core.guards.busy(planned.session)
                    )
                except (ConcurrencyError, IdempotencyKeyTaken) as exc:
                    keyed = await self.follow_original(asked, call, exc, deadline)
            yield keyed

    def _admit(self, p: ExecParams, call: CallContext) -> AbstractAsyncContextManager[AdmittedTurn]:
        if not self.settings.detach_exec:
            return turns.admit(self.core, call, p)
        return self._detached(p, call)

    @contextlib.asynccontextmanager
    async def _detached(self, p: ExecParams, call: CallContext) -> AsyncIterator[AdmittedTurn]:
        run = self.detached.launch(p, call, listen=True)
        view = await run.admitted
        try:
            yield _Following(view, run.follow())
        finally:
            run.leave()

    async def _reserved(self, asked: KeyRecord, p: ExecParams) -> KeyRecord:
        """What the key holds: what it did, or (new) the session and execution it plans."""
        held, _ = await self._reservation(asked, p)
        return held

    async def _reservation(self, asked: KeyRecord, p: ExecParams) -> tuple[KeyRecord, bool]:
        """What the key holds, and whether this call reserved it (False: an earlier or concurrent
        attempt of the same request did)."""
        held = await self.keys.existing(asked)
        if held is not None:
            return held, False
        planned = dataclasses.replace(
            asked, session=p.session or new_session_uid(), execution_id=self.core.new_id()
        )
        held = await self.keys.reserve(planned)
        return held, held.execution_id == planned.execution_id

    async def _planned(self, p: ExecParams, held: KeyRecord, call: CallContext) -> ExecParams:
        """``p`` as the key planned it: its session (created now when the request named none) and
        its execution id, with the key for the admission to record."""
        if not p.session:
            with contextlib.suppress(SessionExistsError):
                await sessions.create(
                    self.core, call, SessionRow(uid=held.session, project="", harness=p.harness)
                )
        return dataclasses.replace(
            p, session=held.session, execution_id=held.execution_id, ticket=Ticket(key=held)
        )

    async def _recovery_followed(self, p: ExecParams, call: CallContext) -> AdmittedTurn | None:
        """An Exec without inputs that found the session held by this host's own recovery of its
        approval-bearing turn (a decision it continues, a crash it recovers) asked for what that
        recovery is doing: it follows that turn (its records from its first, live until it ends,
        then the session as it left it) instead of ABORTED "busy". None when that is not the case
        (inputs, another holder, no such turn): the refusal stands."""
        uid = p.session
        if p.inputs or not uid or not self.core.guards.recovering(uid):
            return None
        view = await sessions.look(self.core, call, uid)
        events, executions = await sessions.read(self.core, view.row)
        latest = latest_execution(executions)
        if latest is None or latest.legacy or latest.inherited:
            return None
        if not any(events[i].kind == common_pb2.EVENT_APPROVAL_REQUEST for i in latest.indexes):
            return None  # an inputless Exec on any other turn starts a turn of its own: busy
        follow = self._follow(call, uid, latest.id, latest.first_index + 1)
        return _Following(view, self._then_session(call, uid, follow))

    async def _then_session(
        self, call: CallContext, uid: str, updates: AsyncIterator[FollowItem]
    ) -> AsyncIterator[FollowItem]:
        """``updates``, then the session as the turn left it, as a recovering Exec ends (once)."""
        last: object = None
        async for last in updates:
            yield last
        if not isinstance(last, SessionView):
            yield await sessions.look(self.core, call, uid)

    async def _replayed(self, held: KeyRecord, call: CallContext) -> AdmittedTurn:
        """The execution a DONE key names, streamed from its first record (live while it runs)."""
        uid, execution_id = held.session, held.execution_id
        start_seq = int(held.value().get("start_seq", 1))
        view = await sessions.look(self.core, call, uid)
        return _Following(view, self._follow(call, uid, execution_id, start_seq))

    def _follow(
        self, call: CallContext, uid: str, execution_id: str, start_seq: int
    ) -> AsyncIterator[FollowItem]:
        """What the Exec that admitted ``execution_id`` streams, from ``start_seq`` (watch.py)."""
        return follow_execution(
            self.core, self.live, call, uid, execution_id, start_seq, poll_s=self.settings.watch_poll_s
        )

    @overload
    async def follow_original(
        self, asked: KeyRecord, call: CallContext, refusal: BaseException, deadline: float
    ) -> AdmittedTurn: ...

    @overload
    async def follow_original(
        self,
        asked: KeyRecord,
        call: CallContext,
        refusal: BaseException,
        deadline: float,
        *,
        free: Callable[[], bool],
    ) -> AdmittedTurn | None: ...

    async def follow_original(
        self,
        asked: KeyRecord,
        call: CallContext,
        refusal: BaseException,
        deadline: float,
        *,
        free: Callable[[], bool] | None = None,
    ) -> AdmittedTurn | None:
        """A retry met its original still being admitted (the session busy, the key taken): wait
        (until ``deadline``) for the original's EXECUTION_START, then follow it; the refusal
        stands when it never comes. With ``free``: None as soon as ``free()`` says the session is
        free while the key's execution has not started (the caller then admits it itself)."""
        freed = False
        while True:
            held = await self.keys.existing(asked)
            if held is not None and held.state == DONE:
                return await self._replayed(held, call)
            if freed:
                return None
            if time.monotonic() >= deadline:
                raise refusal
            if held is not None and held.session:
                with self.live.feed.subscribe(held.session) as sub:
                    await sub.next(POLL_S)
            else:
                await asyncio.sleep(POLL_S)
            freed = free is not None and free()

    # -- Submit ------------------------------------------------------------------------------------

    async def submit(self, p: ExecParams, on_busy: OnBusy, call: CallContext) -> Submitted:
        asked = self.keys.request(call, "Submit", [*_exec_parts(p), on_busy])
        if asked is None:
            return await self.submitter.submit(p, on_busy, call)
        held = await self._reserved(asked, p)
        if held.state != DONE and held.state != QUEUED:
            planned = await self._planned(p, held, call)
            try:
                return await self.submitter.submit(planned, on_busy, call, key=held)
            except (SessionBusyError, ConcurrencyError, IdempotencyKeyTaken):
                again = await self.keys.existing(asked)
                if again is None or again.state not in (DONE, QUEUED):
                    raise
                held = again
        return await self._submitted(held, call)

    async def _submitted(self, held: KeyRecord, call: CallContext) -> Submitted:
        view = await sessions.look(self.core, call, held.session)
        if held.state == DONE:
            return Submitted(view, held.execution_id, int(held.value().get("start_seq", 0)))
        _, executions = await sessions.read(self.core, view.row)
        started = next((e for e in executions if e.id == held.execution_id), None)
        if started is not None:
            return Submitted(view, held.execution_id, started.first_index + 1)
        return Submitted(view, held.execution_id, 0, queued=True)

    # -- Watch -------------------------------------------------------------------------------------

    def watch(
        self, uid: str, after_seq: int, call: CallContext, *, follow: bool, include_deltas: bool
    ) -> AsyncIterator[WatchItem]:
        return watch(
            self.core,
            self.live,
            self.views,
            call,
            uid,
            after_seq,
            follow=follow,
            include_deltas=include_deltas,
            poll_s=self.settings.watch_poll_s,
        )

    # -- the other keyed calls ---------------------------------------------------------------

    async def create_session(self, requested: SessionRow, call: CallContext) -> SessionView:
        asked = self.keys.request(call, "CreateSession", _row_parts(requested))
        if asked is None:
            return await sessions.create(self.core, call, requested)
        held = await self.keys.existing(asked) or await self.keys.reserve(
            dataclasses.replace(asked, session=new_session_uid())
        )
        try:
            return await sessions.create(self.core, call, dataclasses.replace(requested, uid=held.session))
        except SessionExistsError:
            return await sessions.look(self.core, call, held.session)

    async def fork(self, uid: str, p: ForkParams, call: CallContext) -> list[SessionView]:
        parts: list[Part] = [
            uid,
            p.at_seq,
            p.count,
            *p.child_names,
            json.dumps(dict(p.labels), sort_keys=True),
        ]
        asked = self.keys.request(call, "Fork", parts)
        if asked is None or p.count > MAX_FORK_CHILDREN:
            return await fork.fork(self.core, call, uid, p)  # (the count is refused there)
        held = await self.keys.existing(asked)
        if held is None:
            planned = [new_session_uid() for _ in range(max(1, p.count))]
            held = await self.keys.reserve(
                dataclasses.replace(asked, session=uid, result=json.dumps({"children": planned}))
            )
        children: Sequence[str] = held.value()["children"]
        await sessions.row(self.core, call, uid)  # the caller may still use the parent's project
        made = await self._children(children)
        if made is not None:
            return made
        try:
            views = await fork.fork(self.core, call, uid, dataclasses.replace(p, child_uids=list(children)))
        except SessionExistsError:
            made = await self._children(children)
            if made is None:
                raise
            return made
        await self.live.put_key(dataclasses.replace(held, state=DONE))
        return views

    async def _children(self, uids: Sequence[str]) -> list[SessionView] | None:
        rows = [await self.core.store.get_session(uid) for uid in uids]
        if any(row is None for row in rows):
            return None
        return [await sessions.view(self.core, row) for row in rows if row is not None]

    async def approve(
        self, uid: str, d: Decision, call: CallContext
    ) -> tuple[SessionView, common_pb2.LogRecord]:
        parts: list[Part] = [
            uid,
            d.execution_id,
            d.tool_call_id,
            d.request_seq,
            d.approved,
            d.reason,
            d.identity,
        ]
        child = await self.subagents.waiting_child(uid, d.execution_id, d.tool_call_id)
        if child is not None:
            await sessions.row(self.core, call, uid)  # an unknown or hidden session answers NOT_FOUND first
            raise FailedPreconditionError(
                f"tool call {d.tool_call_id!r} waits for subagent session {child}; the host decides it "
                "when the child's turn ends (Cancel the session to stop waiting)"
            )
        asked = self.keys.request(call, "Approve", parts)
        if asked is None:
            return await approvals.approve(self.core, call, uid, d)
        held = await self.keys.existing(asked)
        if held is not None and held.state == DONE:
            await sessions.row(self.core, call, uid)
            seq = int(held.value()["seq"])
            (record,) = await self.core.store.read(uid, seq, seq)
            return await sessions.look(self.core, call, uid), record
        view, record = await approvals.approve(self.core, call, uid, d)
        done = dataclasses.replace(asked, state=DONE, session=uid, result=json.dumps({"seq": record.seq}))
        if held is None:
            await self.keys.reserve(done)
        else:
            await self.live.put_key(done)
        return view, record

    async def cancel(self, uid: str, execution_id: str, reason: str, call: CallContext) -> None:
        asked = self.keys.request(call, "Cancel", [uid, execution_id, reason])
        if asked is not None:
            held = await self.keys.existing(asked)
            if held is None:
                target = execution_id or await self._running_execution(uid, call)
                if not target and self.core.guards.busy(uid):
                    # A turn still being admitted: its id is known once the armed cancel ended it.
                    done = await self.cancel_cascading(uid, "", reason or cancel.DEFAULT_REASON, call)
                    await self.keys.reserve(dataclasses.replace(asked, session=uid, execution_id=done))
                    return
                held = await self.keys.reserve(dataclasses.replace(asked, session=uid, execution_id=target))
            execution_id = held.execution_id
            if not execution_id:
                await sessions.row(self.core, call, uid)
                return  # nothing ran when the key was first used: nothing to cancel, ever
        await self.cancel_cascading(uid, execution_id, reason or cancel.DEFAULT_REASON, call)

    async def cancel_cascading(self, uid: str, execution_id: str, reason: str, call: CallContext) -> str:
        """Cancel the session's turn, then its subagent children's (and theirs, docs/subagents.md);
        the execution it cancelled ("": none, or not known)."""
        links = await self.subagents.children(uid, latest_only=True)
        done = await self._cancel(uid, execution_id, reason, call)
        for link in links:
            await self._cancel_child(link.child, f"its parent session {uid} was cancelled", call)
        return done

    async def _children_of_latest(self, uid: str) -> list[str]:
        return [link.child for link in await self.subagents.children(uid, latest_only=True)]

    async def _cancel_child(self, child: str, reason: str, call: CallContext) -> None:
        """Cancel a child whose parent's turn ended (cancelled, interrupted), and its children."""
        core = self.core
        if core.driver.running.get(child) is None and core.guards.busy(child):
            # Its turn is parking at its own task call (it started children too): closed once it has.
            with contextlib.suppress(SessionBusyError):
                async with core.guards.hold_when_free(child):
                    pass
        with contextlib.suppress(SessionNotFoundError):
            await self.cancel_cascading(child, "", reason, call)

    async def _running_execution(self, uid: str, call: CallContext) -> str:
        running = self.core.driver.running.get(uid)
        if running is not None:
            return running.execution_id
        row = await sessions.row(self.core, call, uid)
        _, executions = await sessions.read(self.core, row)
        latest = latest_execution(executions)
        return latest.id if latest is not None and not latest.completed else ""

    async def _cancel(self, uid: str, execution_id: str, reason: str, call: CallContext) -> str:
        """Cancel as v1 does (this host's running turn, one it admits, a parked one); a turn on
        another host is asked through its lease, and one a crash cut short is closed here."""
        core = self.core
        if core.driver.running.get(uid) is not None or core.guards.busy(uid):
            return await cancel.cancel(core, call, uid, execution_id, reason)
        row = await sessions.row(core, call, uid)
        events, executions = await sessions.read(core, row)
        latest = latest_execution(executions)
        if (
            latest is None
            or latest.completed
            or latest.legacy
            or latest.inherited
            or (execution_id and execution_id != latest.id)
            or open_gate(events, executions) is not None
        ):
            return await cancel.cancel(core, call, uid, execution_id, reason)
        lease = await self.live.lease(uid, latest.id)
        if lease is not None and await self.keeper.live_elsewhere(lease):
            await self.live.request_cancel(uid, latest.id, reason)
            await self.submitter.wait_ended(row, latest.id, self.submitter.stop_limit_s())
            return latest.id
        if latest.error_indexes and lease is None:
            return ""  # failed for good (the reference's interrupted turn): nothing runs to cancel
        if core.driver.running.get(uid) is not None or core.guards.busy(uid):
            # Taken meanwhile (the recoverer re-driving it, say): cancelled as that holder's turn.
            return await cancel.cancel(core, call, uid, execution_id, reason)
        async with core.guards.hold(uid):
            await close_cancelled(core, self.keeper, row, latest, lease, reason)
        return latest.id


class _Unkeyed:
    """An Exec without an idempotency key: its own turn, or the turn this host's recovery is
    running for the session when that is what an Exec without inputs asks for
    (``LiveSessions._recovery_followed``). A class: it is entered on every Exec."""

    __slots__ = ("_call", "_entered", "_live", "_p")

    def __init__(self, live: LiveSessions, p: ExecParams, call: CallContext) -> None:
        self._live = live
        self._p = p
        self._call = call
        self._entered: AbstractAsyncContextManager[AdmittedTurn] | None = None

    async def __aenter__(self) -> AdmittedTurn:
        admission = self._live._admit(self._p, self._call)
        try:
            turn = await admission.__aenter__()
        except SessionBusyError:
            followed = await self._live._recovery_followed(self._p, self._call)
            if followed is None:
                raise
            return followed
        self._entered = admission
        return turn

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        entered, self._entered = self._entered, None
        if entered is None:
            return None
        return await entered.__aexit__(kind, exc, tb)


class _KeyedTurn:
    """A keyed Exec's own turn: if its admission finds the key taken meanwhile (a retry won on
    another host), it streams the execution the key names instead."""

    def __init__(self, turn: AdmittedTurn, live: LiveSessions, asked: KeyRecord, call: CallContext) -> None:
        self._turn = turn
        self._live = live
        self._asked = asked
        self._call = call

    @property
    def view(self) -> SessionView:
        return self._turn.view

    async def run(self) -> AsyncIterator[Update]:
        started = False
        try:
            async for update in self._turn.run():
                started = True
                yield update
        except (IdempotencyKeyTaken, ConcurrencyError) as exc:
            if started:
                raise
            deadline = time.monotonic() + ORIGINAL_WAIT_S
            original = await self._live.follow_original(self._asked, self._call, exc, deadline)
            async for update in original.run():
                yield update
