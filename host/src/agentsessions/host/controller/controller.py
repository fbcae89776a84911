"""The controller: one writer per session on this host (guard) and across hosts (fence + CAS).

:class:`Controller` is the surface the servicers call. It builds the parts once and hands each
request to the one that owns it: sessions (rows, views, create/list/delete), turns (Exec),
recovery (Suspend, Resume), replay, fork, approvals and cancel. Every method takes the call's
:class:`~agentsessions.host.callcontext.CallContext` explicitly (``call=``); without one the call is
anonymous, which an authenticating host refuses. It knows the journal store, harnesses, the model
and tools; not gRPC.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from agentsessions.host.callcontext import ANONYMOUS, CallContext
from agentsessions.host.controller import (
    approvals,
    cancel,
    compaction,
    fork,
    recovery,
    replay,
    sessions,
    turns,
)
from agentsessions.host.controller.access import OPEN_ACCESS, SessionAccess
from agentsessions.host.controller.admission import Admission, LiveAdmission
from agentsessions.host.controller.approval_policy import ApprovalPolicy
from agentsessions.host.controller.approvals import Decision
from agentsessions.host.controller.compaction import Compacted, CompactionSettings, Compactor
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.deltas import DeltaBatching
from agentsessions.host.controller.drive import Driver, RunningTurns
from agentsessions.host.controller.executions import Execution
from agentsessions.host.controller.fork import ForkParams
from agentsessions.host.controller.guard import SessionGuards
from agentsessions.host.controller.harnesses import HarnessCatalog
from agentsessions.host.controller.journal_cache import JournalCache
from agentsessions.host.controller.leases import LeasedDriver, LeaseKeeper, LeaseSettings
from agentsessions.host.controller.live import AdmittedTurn, LiveSessions, LiveSettings
from agentsessions.host.controller.pacing import LagProbe, LoopBudget, ReadPacer
from agentsessions.host.controller.replay import ReplayReport
from agentsessions.host.controller.results import DEFAULT_CORRECTIONS, Settler
from agentsessions.host.controller.sinks import SinkFactory
from agentsessions.host.controller.state import SessionView
from agentsessions.host.controller.tools import ToolInvoker
from agentsessions.host.controller.turns import ExecParams
from agentsessions.host.controller.writer import JournalWriter
from agentsessions.host.ids import token_hex
from agentsessions.host.journal import encode_page_token
from agentsessions.host.journal.live import LiveStore
from agentsessions.host.journal.store import (
    JournalStore,
    JournalUnavailableError,
    SessionNotFoundError,
    SessionRow,
)
from agentsessions.host.limits import DEFAULT_LIMITS, ExecutionSlots, Limits
from agentsessions.host.models.provider import ModelProvider
from agentsessions.v1 import common_pb2, session_pb2

_T = TypeVar("_T")


class Controller:
    """Drives sessions. Knows the journal store, harnesses, the model and tools; not gRPC."""

    def __init__(
        self,
        store: JournalStore,
        catalog: HarnessCatalog,
        model: ModelProvider | None,
        tools: ToolInvoker | None = None,
        *,
        default_project: str = "default",
        purge_on_delete: bool = False,
        write_ahead_model_calls: bool = False,
        stream_deltas: bool = True,
        delta_batching: DeltaBatching | None = None,
        cancel_grace_s: float = 5.0,
        new_id: Callable[[], str] | None = None,
        approval_policy: ApprovalPolicy | None = None,
        access: SessionAccess | None = None,
        limits: Limits | None = None,
        live: LiveSettings | None = None,
        result_corrections: int = DEFAULT_CORRECTIONS,
        compaction: CompactionSettings | None = None,
        read_budget: LoopBudget | None = None,
        list_pacer: ReadPacer | None = None,
    ) -> None:
        self.store = store
        # Request, record and concurrency limits; the servicer checks requests against them too.
        self.limits = limits or DEFAULT_LIMITS
        self.catalog = catalog
        self.purge_on_delete = purge_on_delete
        # Host decisions at approval gates (rules, session grants, expiry): approval_policy.py.
        self.approval_policy = approval_policy or ApprovalPolicy()
        # Execution and model-call ids: 16 random hex digits (injectable for reproducible journals).
        ids: Callable[[], str] = new_id or (lambda: token_hex(8))
        cache = JournalCache(store)
        self.guards = SessionGuards(cancel_grace_s)
        # With ``live`` (and a store that keeps live tables): leases, keys, queues, Watch (live.py).
        live_store = LiveStore.of(store) if live is not None else None
        running = RunningTurns()
        driver: Driver = Driver(running)
        admission: Admission = Admission()
        keeper: LeaseKeeper | None = None
        if live is not None and live_store is not None:
            leases = LeaseSettings(live.lease_ttl_s, live.recover, live.backoff_s)
            keeper = LeaseKeeper(live_store, running, leases, cancel_grace_s=cancel_grace_s)
            driver = LeasedDriver(running, keeper)
            admission = LiveAdmission(
                live_store, keeper, recover=self._recover_first if live.recover else None
            )
        slots = ExecutionSlots(self.limits)
        congested = LagProbe().congested  # one probe of the loop for both pacers
        reads = read_budget or LoopBudget(self.limits.max_read_loop_percent / 100, congested=congested)
        listing = list_pacer or ReadPacer(self.limits.max_listed_sessions_per_s, congested=congested)
        for paced in (reads, listing):
            paced.counts(lambda: slots.running)
        # At most one execution running: nothing else waits on the loop while a commit holds it.
        store.work_inline_while(lambda: slots.running <= 1)
        self._core = Core(
            store=store,
            cache=cache,
            writer=JournalWriter(store, cache, self.limits.max_record_bytes),
            catalog=catalog,
            sinks=SinkFactory(
                model,
                tools,
                new_id=ids,
                stream_deltas=stream_deltas,
                write_ahead_model_calls=write_ahead_model_calls,
                approval_policy=self.approval_policy,
                events=cache.events,
                # Streamed model text: frames of up to 1 KiB, at most 200 ms late (controller.deltas).
                delta_batching=delta_batching,
            ),
            driver=driver,
            guards=self.guards,
            policy=self.approval_policy,
            # Who may act on which project, and who is journaled as the actor (access.py).
            access=access or OPEN_ACCESS,
            new_id=ids,
            default_project=default_project or "default",
            purge_on_delete=purge_on_delete,
            cancel_grace_s=cancel_grace_s,
            limits=self.limits,
            slots=slots,
            reads=reads,
            listing=listing,
            admission=admission,
            result_corrections=result_corrections,
            compactor=Compactor(model, compaction or CompactionSettings()),
        )
        driver.settle = Settler(self._core)  # turns bound to a result schema (results.py)
        driver.guards = self.guards  # a Cancel during a turn's admission is armed on its guard
        self.live: LiveSessions | None = None
        if live is not None and live_store is not None and keeper is not None:
            assert isinstance(admission, LiveAdmission)
            self.live = LiveSessions(self._core, live_store, keeper, admission, live)

    async def _recover_first(self, core: Core, row: SessionRow, ex: Execution) -> None:
        assert self.live is not None
        await self.live.recover(core, row, ex)

    # -- sessions -----------------------------------------------------------------------------

    async def view(self, uid: str, *, call: CallContext = ANONYMOUS) -> SessionView:
        """The session's view; looking at an awaiting session first applies the host's own
        decisions on its gate (when no operation holds the session)."""
        row = await sessions.row(self._core, call, uid)
        seen = await sessions.view(self._core, row)
        if seen.exec_state == session_pb2.EXEC_AWAITING and await approvals.settle_if_free(self._core, row):
            seen = await sessions.look(self._core, call, uid)
        return seen

    async def create_session(self, requested: SessionRow, *, call: CallContext = ANONYMOUS) -> SessionView:
        """A new session from what a caller may set on ``requested`` (see sessions.create)."""
        if self.live is not None:
            return await self.live.create_session(requested, call)
        return await sessions.create(self._core, call, requested)

    async def list_sessions(
        self, project: str, page_size: int, token: str, *, call: CallContext = ANONYMOUS
    ) -> tuple[list[SessionView], str]:
        return await sessions.page(self._core, call, project, page_size, token)

    def page_token_after(self, view: SessionView) -> str:
        """The ListSessions token of the page that continues after ``view`` (a page cut short)."""
        return encode_page_token(view.row.create_time_ns, view.row.uid)

    async def delete_session(self, uid: str, *, call: CallContext = ANONYMOUS) -> SessionView:
        if self.live is not None:
            # Delete cascades to the session's subagent children (docs/subagents.md).
            await sessions.row(self._core, call, uid)
            links = await self.live.subagents.children(uid, latest_only=False)
            if links:
                await self.live.cancel_cascading(uid, "", "session deleted", call)
            for link in links:
                with contextlib.suppress(SessionNotFoundError):
                    await self.delete_session(link.child, call=call)
        if uid in self._core.driver.running or self.guards.busy(uid):
            # A running turn (or one still being admitted) is cancelled first (END{CANCELED} and the
            # CANCEL marker are journaled); its Exec then releases the session.
            await cancel.cancel(self._core, call, uid, "", "session deleted")
        return await sessions.delete(self._core, call, uid)

    # -- turns, recovery, replay ----------------------------------------------------------------

    def admit_exec(
        self, p: ExecParams, *, call: CallContext = ANONYMOUS
    ) -> AbstractAsyncContextManager[AdmittedTurn]:
        """Route an Exec; errors raised here (or entering what it returns) precede any frame. The
        session is guarded while the turn entered is alive."""
        if self.store.health.failure is not None:
            # Nothing could be journaled: refuse before the first frame, not after it.
            raise JournalUnavailableError(self.store.health.failure)
        if self.live is not None:
            return self.live.admit_exec(p, call)
        return turns.admit(self._core, call, p)

    async def suspend(self, uid: str, *, call: CallContext = ANONYMOUS) -> SessionView:
        return await recovery.suspend(self._core, call, uid)

    async def resume(self, uid: str, *, call: CallContext = ANONYMOUS) -> SessionView:
        return await recovery.resume(self._core, call, uid)

    async def compact(
        self, uid: str, expected_last_seq: int | None = None, *, call: CallContext = ANONYMOUS
    ) -> Compacted:
        """Summarize the session at its head into a LIFECYCLE_BASELINE (compaction.py)."""
        return await compaction.compact(self._core, call, uid, expected_last_seq)

    async def replay(self, uid: str, *, call: CallContext = ANONYMOUS) -> ReplayReport:
        """Controller replay: re-run every completed execution, zero model calls, nothing written."""
        return await replay.replay(self._core, call, uid)

    def records(
        self, uid: str, from_seq: int = 1, to_seq: int = 0, *, call: CallContext = ANONYMOUS
    ) -> AsyncIterator[common_pb2.LogRecord]:
        """The session's stored records ``from_seq..to_seq`` (0: to the head), verbatim."""
        return replay.records(self._core, call, uid, from_seq, to_seq)

    def reading(self, work: Coroutine[Any, Any, _T]) -> Awaitable[_T]:
        """``work``, a call that streams records (Replay, Watch), with the time it takes on the
        event loop charged to the readers' share of it (pacing.py)."""
        return self._core.reads.timed(work)

    # -- fork, approvals, cancel ----------------------------------------------------------------

    async def fork(self, uid: str, p: ForkParams, *, call: CallContext = ANONYMOUS) -> list[SessionView]:
        if self.live is not None:
            return await self.live.fork(uid, p, call)
        return await fork.fork(self._core, call, uid, p)

    async def approve(
        self, uid: str, decision: Decision, *, call: CallContext = ANONYMOUS
    ) -> tuple[SessionView, common_pb2.LogRecord]:
        if self.live is not None:
            return await self.live.approve(uid, decision, call)
        return await approvals.approve(self._core, call, uid, decision)

    async def cancel(
        self, uid: str, execution_id: str, reason: str, *, call: CallContext = ANONYMOUS
    ) -> SessionView:
        """Stop this host's running turn of a session (or the one it is admitting), or close a
        turn parked on an approval; a no-op on an idle or finished session."""
        if self.live is not None:
            await self.live.cancel(uid, execution_id, reason, call)
        else:
            await cancel.cancel(self._core, call, uid, execution_id, reason)
        return await self.view(uid, call=call)
