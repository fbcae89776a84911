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
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

from agentsessions.host.callcontext import ANONYMOUS, CallContext
from agentsessions.host.controller.access import OPEN_ACCESS, SessionAccess
from agentsessions.host.controller.approval_policy import ApprovalPolicy
from agentsessions.host.controller.approvals import Approvals
from agentsessions.host.controller.cancel import Cancels
from agentsessions.host.controller.drive import Driver, RunningTurns
from agentsessions.host.controller.fork import Forks
from agentsessions.host.controller.guard import SessionGuards
from agentsessions.host.controller.harnesses import HarnessCatalog
from agentsessions.host.controller.journal_cache import JournalCache
from agentsessions.host.controller.recovery import Recovery
from agentsessions.host.controller.replay import ReplayReport, Replays
from agentsessions.host.controller.sessions import CreateParams, Sessions
from agentsessions.host.controller.sinks import SinkFactory
from agentsessions.host.controller.state import SessionView
from agentsessions.host.controller.tools import ToolInvoker
from agentsessions.host.controller.turns import ExecParams, Turn, Turns
from agentsessions.host.controller.writer import JournalWriter
from agentsessions.host.journal.store import JournalStore
from agentsessions.host.models.provider import ModelProvider
from agentsessions.v1 import common_pb2, session_pb2


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
        stream_deltas: bool = True,
        cancel_grace_s: float = 5.0,
        new_id: Callable[[], str] | None = None,
        approval_policy: ApprovalPolicy | None = None,
        access: SessionAccess | None = None,
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.purge_on_delete = purge_on_delete
        # Host decisions at approval gates (rules, session grants, expiry): approval_policy.py.
        self.approval_policy = approval_policy or ApprovalPolicy()
        # Who may act on which project, and who is journaled as the actor (access.py).
        access = access or OPEN_ACCESS
        # Execution and model-call ids: 16 random hex digits (injectable for reproducible journals).
        ids: Callable[[], str] = new_id or (lambda: secrets.token_hex(8))
        cache = JournalCache(store)
        self.guards = SessionGuards(cancel_grace_s)
        self._running = RunningTurns()
        writer = JournalWriter(store, cache)
        sinks = SinkFactory(
            model,
            tools,
            new_id=ids,
            stream_deltas=stream_deltas,
            approval_policy=self.approval_policy,
            events=cache.events,
        )
        driver = Driver(self._running)
        self._sessions = Sessions(
            store,
            cache,
            catalog,
            access,
            self.guards,
            self._running,
            default_project=default_project or "default",
            purge_on_delete=purge_on_delete,
        )
        self._approvals = Approvals(store, self._sessions, self.guards, writer, self.approval_policy, access)
        self._recovery = Recovery(
            self._sessions, catalog, self.guards, writer, sinks, driver, self._approvals
        )
        self._turns = Turns(
            store,
            self._sessions,
            catalog,
            self.guards,
            writer,
            sinks,
            driver,
            self._approvals,
            self._recovery,
            new_id=ids,
        )
        self._replays = Replays(store, self._sessions, catalog, sinks)
        self._forks = Forks(store, self._sessions, catalog)
        self._cancels = Cancels(self._sessions, self.guards, writer, self._running, grace_s=cancel_grace_s)

    # -- sessions -----------------------------------------------------------------------------

    async def view(self, uid: str, *, call: CallContext = ANONYMOUS) -> SessionView:
        """The session's view; looking at an awaiting session first applies the host's own
        decisions on its gate (when no operation holds the session)."""
        row = await self._sessions.row(call, uid)
        view = await self._sessions.view(row)
        if view.exec_state == session_pb2.EXEC_AWAITING and await self._approvals.settle_if_free(row):
            view = await self._sessions.look(call, uid)
        return view

    async def create_session(self, p: CreateParams, *, call: CallContext = ANONYMOUS) -> SessionView:
        return await self._sessions.create(call, p)

    async def list_sessions(
        self, project: str, page_size: int, token: str, *, call: CallContext = ANONYMOUS
    ) -> tuple[list[SessionView], str]:
        return await self._sessions.list(call, project, page_size, token)

    async def delete_session(self, uid: str, *, call: CallContext = ANONYMOUS) -> SessionView:
        if uid in self._running:
            # A running turn is cancelled first (END{CANCELED} and the CANCEL marker are journaled);
            # its Exec then releases the session.
            await self._cancels.cancel(call, uid, "", "session deleted")
        return await self._sessions.delete(call, uid)

    # -- turns, recovery, replay ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def admit_exec(self, p: ExecParams, *, call: CallContext = ANONYMOUS) -> AsyncIterator[Turn]:
        """Route an Exec; errors raised here precede any frame. The session is guarded while the
        returned turn is alive."""
        async with self._turns.admit(call, p) as turn:
            yield turn

    async def suspend(self, uid: str, *, call: CallContext = ANONYMOUS) -> SessionView:
        return await self._recovery.suspend(call, uid)

    async def resume(self, uid: str, *, call: CallContext = ANONYMOUS) -> SessionView:
        return await self._recovery.resume(call, uid)

    async def replay(self, uid: str, *, call: CallContext = ANONYMOUS) -> ReplayReport:
        """Controller replay: re-run every completed execution, zero model calls, nothing written."""
        return await self._replays.replay(call, uid)

    def records(
        self, uid: str, from_seq: int = 1, to_seq: int = 0, *, call: CallContext = ANONYMOUS
    ) -> AsyncIterator[common_pb2.LogRecord]:
        """The session's stored records ``from_seq..to_seq`` (0: to the head), verbatim."""
        return self._replays.records(call, uid, from_seq, to_seq)

    # -- fork, approvals, cancel ----------------------------------------------------------------

    async def fork(
        self,
        uid: str,
        at_seq: int,
        count: int,
        child_names: Sequence[str],
        labels: Mapping[str, str],
        *,
        call: CallContext = ANONYMOUS,
    ) -> list[SessionView]:
        return await self._forks.fork(call, uid, at_seq, count, child_names, labels)

    async def approve(
        self,
        uid: str,
        execution_id: str,
        tool_call_id: str,
        request_seq: int,
        approved: bool,
        reason: str,
        identity: common_pb2.IdentityRef | None,
        *,
        call: CallContext = ANONYMOUS,
    ) -> tuple[SessionView, common_pb2.LogRecord]:
        return await self._approvals.approve(
            call, uid, execution_id, tool_call_id, request_seq, approved, reason, identity
        )

    async def cancel(
        self, uid: str, execution_id: str, reason: str, *, call: CallContext = ANONYMOUS
    ) -> SessionView:
        """Stop this host's running turn of a session, or close a turn parked on an approval;
        a no-op on an idle or finished session."""
        await self._cancels.cancel(call, uid, execution_id, reason)
        return await self.view(uid, call=call)
