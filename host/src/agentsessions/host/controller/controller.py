"""The single-writer core: runs turns, recovery, replay, fork, suspend and approvals against
the journal, one writer per session on this host (guard) and across hosts (fence + CAS)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import timestamp_pb2

from agentsessions.host.controller.access import OPEN_ACCESS, SessionAccess
from agentsessions.host.controller.approval_policy import ApprovalPolicy, SessionGate
from agentsessions.host.controller.errors import (
    ConcurrencyError,
    ControllerError,
    DeadlineExceededError,
    FailedPreconditionError,
    HarnessMismatchError,
    HarnessRunError,
    IncompleteInvocationError,
    InheritedToolIntentError,
    InvalidArgumentError,
    InvalidExecutionLogError,
    ReplayDivergedError,
    SessionBusyError,
    SessionNotFoundError,
    UnplaceableError,
)
from agentsessions.host.controller.executions import (
    Execution,
    latest_execution,
    legacy_execution_id,
    recorded_effects,
)
from agentsessions.host.controller.harnesses import HarnessCatalog, ResolvedHarness, describe
from agentsessions.host.controller.journal_cache import JournalCache
from agentsessions.host.controller.sink import ExecutionSink
from agentsessions.host.controller.tools import ToolInvoker
from agentsessions.host.journal import canon
from agentsessions.host.journal.store import (
    ConflictError,
    FencedError,
    InvalidPageTokenError,
    JournalStore,
    SessionRow,
)
from agentsessions.host.models.provider import ModelProvider
from agentsessions.host.runtime import placement_refusal
from agentsessions.host.telemetry.genai import journal_append, traced_turn
from agentsessions.host.tools.errors import MissingToolExecutorError
from agentsessions.sdk.errors import ApprovalParkedError, ExecutionCancelledError, find_park
from agentsessions.sdk.harness import Harness, Start
from agentsessions.v1 import common_pb2, harness_pb2, session_pb2

log = logging.getLogger("agentsessions.controller")
# Kinds through the generated module's constants: an EnumTypeWrapper attribute costs ~1.5 us.
K = common_pb2
LK = common_pb2.Lifecycle

MAX_FORK_CHILDREN = 128
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500

# What an Exec stream relays: durable records, ephemeral deltas, and (after a park) the session.
Update = common_pb2.LogRecord | session_pb2.Delta | session_pb2.Session


@dataclass(frozen=True)
class SessionView:
    """A session row with the state derived from its journal."""

    row: SessionRow
    exec_state: int
    pending_approval: common_pb2.ApprovalRef | None = None


@dataclass(frozen=True)
class CreateParams:
    project: str = ""
    name: str = ""
    harness: str = ""
    model: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    origin: common_pb2.Origin | None = None
    identity: common_pb2.IdentityRef | None = None


@dataclass(frozen=True)
class ExecParams:
    session: str
    inputs: Sequence[common_pb2.Message] = ()
    harness: str = ""
    config: bytes = b""
    resume_from_seq: int = 0
    expected_last_seq: int | None = None
    deadline_unix: int = 0


@dataclass
class Gate:
    """An owned approval gate of the latest execution that has no receipt yet."""

    execution: Execution
    tool_call_id: str
    request_seq: int  # 0 when the crash cut fell between TOOL_CALL and APPROVAL_REQUEST
    decided: bool


@dataclass
class ReplayReport:
    """What a controller replay re-executed: ``model_calls`` (sent to the provider) must be 0 (I1);
    ``served_model_calls`` were answered from the journal."""

    executions: int
    outputs: list[str]
    model_calls: int
    served_model_calls: int = 0


class _Observer:
    """Relays a turn's records and deltas to one consumer, in order."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Update | None] = asyncio.Queue()

    async def record(self, rec: common_pb2.LogRecord) -> None:
        self.queue.put_nowait(rec)

    async def delta(self, delta: session_pb2.Delta) -> None:
        self.queue.put_nowait(delta)


@dataclass
class _Running:
    execution_id: str
    task: asyncio.Task[Any]
    harness: Harness
    cancel_reason: str | None = None


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
        self.model = model
        self.tools = tools
        self.default_project = default_project or "default"
        self.purge_on_delete = purge_on_delete
        self.stream_deltas = stream_deltas
        self.cancel_grace_s = cancel_grace_s
        # Execution and model-call ids: 16 random hex digits (injectable for reproducible journals).
        self.new_id: Callable[[], str] = new_id or (lambda: secrets.token_hex(8))
        self.cache = JournalCache(store)
        # Host decisions at approval gates (rules, session grants, expiry): approval_policy.py.
        self.approval_policy = approval_policy or ApprovalPolicy()
        # Who may act on which project, and who is journaled as the actor (access.py).
        self.access: SessionAccess = access or OPEN_ACCESS
        self._guards: dict[str, asyncio.Lock] = {}
        self._running: dict[str, _Running] = {}

    # -- guards, rows, state ----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _guard(self, uid: str) -> AsyncIterator[None]:
        lock = self._guards.setdefault(uid, asyncio.Lock())
        if lock.locked():
            raise SessionBusyError(uid)
        async with lock:
            yield

    @contextlib.asynccontextmanager
    async def _guard_when_free(self, uid: str) -> AsyncIterator[None]:
        """The guard, waiting (bounded by the cancel grace) for an ending operation to let go."""
        lock = self._guards.setdefault(uid, asyncio.Lock())
        try:
            async with asyncio.timeout(self.cancel_grace_s):
                await lock.acquire()
        except TimeoutError:
            raise SessionBusyError(uid) from None
        try:
            yield
        finally:
            lock.release()

    async def _row(self, uid: str) -> SessionRow:
        row = await self.store.get_session(uid)
        if row is None:
            raise SessionNotFoundError(uid)
        self.access.check_project(row.project)
        return row

    async def _executions(self, row: SessionRow) -> tuple[list[common_pb2.Event], list[Execution]]:
        return await self.cache.executions(row.uid, row.fork_seq)

    async def may_read_journal(self, uid: str) -> bool:
        """Whether ``uid``'s records may be streamed (Replay). A session without a visible row
        (unknown, or deleted with its rows kept for audit) has no records to show (False, an
        empty stream as for an unknown session); under authentication, one in a project the
        caller may not use raises PermissionDeniedError."""
        row = await self.store.get_session(uid)
        if row is None:
            return False
        if self.access.enforced:
            self.access.check_project(row.project)
        return True

    async def view(self, uid: str) -> SessionView:
        row = await self._row(uid)
        view = await self._view(row)
        if view.exec_state == session_pb2.EXEC_AWAITING and await self._settle_if_free(row):
            view = await self._view(await self._row(uid))
        return view

    async def _settle_if_free(self, row: SessionRow) -> bool:
        """Looking at an awaiting session applies the host's own decisions (an expiry above all)."""
        lock = self._guards.get(row.uid)
        if lock is not None and lock.locked():
            return False  # whoever holds the session (maybe this call's caller) acts on it
        async with self._guard(row.uid):
            return await self._settle_gate(row)

    async def _settle_gate(
        self, row: SessionRow, fence: int | None = None, obs: _Observer | None = None
    ) -> bool:
        """Journal the approval policy's decision (rule, session grant, expiry) on the latest
        execution's undecided request, if it has one; True when a decision was journaled."""
        events, executions = await self._executions(row)
        gate = _open_gate(events, executions)
        if gate is None or gate.decided or gate.request_seq == 0:
            return False
        decision = self.approval_policy.settle(
            row.project, row.uid, row.fork_seq, events, gate.execution.id, gate.tool_call_id, gate.request_seq
        )
        if decision is None:
            return False
        if fence is None:
            fence = await self._mint(row.uid, len(events))
        (rec,) = await self._append(row.uid, [decision], len(events), fence)
        if obs is not None:
            await obs.record(rec)
        return True

    def _session_gate(self, row: SessionRow) -> SessionGate:
        return SessionGate(
            self.approval_policy, row.uid, row.project, row.fork_seq, lambda: self.cache.events(row.uid)
        )

    async def _view(
        self, row: SessionRow, read: tuple[list[common_pb2.Event], list[Execution]] | None = None
    ) -> SessionView:
        """The row's view; ``read`` is the journal as the caller has just read it, if it has."""
        if row.last_seq == 0:
            return SessionView(row, session_pb2.EXEC_PENDING)
        try:
            events, executions = read if read is not None else await self._executions(row)
        except InvalidExecutionLogError:
            return SessionView(row, session_pb2.EXEC_FAILED)
        gate = _open_gate(events, executions)
        if gate is not None:
            ref = common_pb2.ApprovalRef(
                execution_id=gate.execution.id, tool_call_id=gate.tool_call_id, request_seq=gate.request_seq
            )
            return SessionView(row, session_pb2.EXEC_AWAITING, ref)
        if row.uid in self._running:
            return SessionView(row, session_pb2.EXEC_RUNNING)
        latest = latest_execution(executions)
        if latest is None:
            return SessionView(row, session_pb2.EXEC_COMPLETED)
        if latest.end_index is not None:
            state = events[latest.end_index].end.state
            if state == "CANCELED":
                return SessionView(row, session_pb2.EXEC_CANCELED)
            if state not in ("", "COMPLETED"):
                return SessionView(row, session_pb2.EXEC_FAILED)
            return SessionView(row, session_pb2.EXEC_COMPLETED)
        if latest.error_indexes:
            return SessionView(row, session_pb2.EXEC_FAILED)
        # No END and no ERROR: the turn is in flight on another host, or a crash cut it short.
        # Either way it has not finished; Resume completes an interrupted one from the journal.
        return SessionView(row, session_pb2.EXEC_RUNNING)

    # -- create / list / delete ---------------------------------------------------------------

    async def create_session(self, p: CreateParams) -> SessionView:
        resolved = await self.catalog.resolve(p.harness, for_new_session=True)
        project = p.project or self.default_project
        self.access.check_project(project)
        identity = self.access.actor(p.identity)
        now = time.time_ns()
        row = SessionRow(
            uid="sess-" + secrets.token_hex(12),
            project=project,
            name=p.name,
            harness=resolved.name,
            model=p.model,
            labels=dict(p.labels),
            annotations=dict(p.annotations),
            origin=p.origin,
            identity=identity,
            create_time_ns=now,
            update_time_ns=now,
        )
        stored = await self.store.create_session(row)
        return SessionView(stored, session_pb2.EXEC_PENDING)

    async def list_sessions(self, project: str, page_size: int, token: str) -> tuple[list[SessionView], str]:
        if page_size <= 0:
            page_size = DEFAULT_PAGE_SIZE
        page_size = min(page_size, MAX_PAGE_SIZE)
        project = project or self.default_project
        self.access.check_project(project)
        try:
            rows, next_token = await self.store.list_sessions(project, page_size, token)
        except InvalidPageTokenError as exc:
            raise InvalidArgumentError("page_token", "is not a token this host issued") from exc
        return [await self._view(r) for r in rows], next_token

    async def delete_session(self, uid: str) -> SessionView:
        if uid in self._running:
            # A running turn is cancelled first (END{CANCELED} and the CANCEL marker are journaled);
            # its Exec then releases the session.
            await self.cancel(uid, "", "session deleted")
        async with self._guard_when_free(uid):
            row = await self._row(uid)
            view = await self._view(row)
            await self.store.delete_session(uid, purge=self.purge_on_delete)
            self.cache.forget(uid)
        self._guards.pop(uid, None)
        return view

    # -- appends ----------------------------------------------------------------------------

    async def _append(
        self,
        uid: str,
        events: Sequence[common_pb2.Event],
        expected_head: int,
        fence: int,
        *,
        mint_fence: bool = False,
    ) -> list[common_pb2.LogRecord]:
        normalized = [canon.normalize_event(e) for e in events]
        try:
            with journal_append(uid, len(normalized)) as span:
                records = await self.store.append(
                    uid, normalized, expected_head=expected_head, fence=fence, mint_fence=mint_fence
                )
                span.wrote(records)
        except ConflictError as exc:
            raise ConcurrencyError(f"session {uid}: {exc}") from exc
        except FencedError as exc:
            raise ConcurrencyError(f"session {uid}: superseded by a newer writer: {exc}") from exc
        self.cache.appended(uid, records)
        return records

    async def _mint(self, uid: str, head: int) -> int:
        """A new fence for this incarnation, minted only while the journal head is ``head``:
        a writer that lost the race for the head never supersedes the one that won it."""
        try:
            return await self.store.new_fence(uid, expected_head=head)
        except ConflictError as exc:
            raise ConcurrencyError(f"session {uid}: {exc}") from exc

    def _writer(
        self,
        uid: str,
        fence: int,
        head: int,
        on_record: Callable[[common_pb2.LogRecord], Awaitable[None]] | None,
        *,
        strip_execution_id: bool = False,
    ) -> _Writer:
        return _Writer(self, uid, fence, head, on_record, strip_execution_id)

    async def _marker(
        self, uid: str, fence: int, lifecycle: common_pb2.Lifecycle, obs: _Observer | None = None
    ) -> common_pb2.LogRecord:
        head = await self.store.head(uid)
        (rec,) = await self._append(
            uid, [common_pb2.Event(kind=K.EVENT_LIFECYCLE, lifecycle=lifecycle)], head.seq, fence
        )
        if obs is not None:
            await obs.record(rec)
        return rec

    # -- Exec ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def admit_exec(self, p: ExecParams) -> AsyncIterator[Turn]:
        """Route an Exec; errors raised here precede any frame. The session is guarded
        while the returned turn is alive."""
        if p.deadline_unix > 0 and time.time() >= p.deadline_unix:
            raise DeadlineExceededError(f"deadline_unix {p.deadline_unix} has already passed")
        if p.session:
            row = await self._row(p.session)
            resolved = await self._route(row, p.harness)
        else:
            created = await self.create_session(CreateParams(harness=p.harness))
            row = created.row
            resolved = await self.catalog.resolve(row.harness)
        events, executions = await self._executions(row)
        gate = _open_gate(events, executions)
        if gate is not None and p.inputs:
            raise FailedPreconditionError(
                f"session {row.uid} awaits a decision on tool call {gate.tool_call_id!r} "
                f"(request seq {gate.request_seq}); Approve it, then Resume or Exec without inputs"
            )
        async with self._guard(row.uid):
            # Taking the guard did not yield: the journal read above is still this host's latest
            # (another host's write is caught by the fence mint and the append, both CAS).
            view = await self._view(row, (events, executions))
            yield Turn(self, p, view, resolved, recovery=gate, events=events)

    async def _route(self, row: SessionRow, override: str) -> ResolvedHarness:
        if not override or override == row.harness:
            return await self.catalog.resolve(row.harness)
        if not self.catalog.is_static(row.harness):
            raise FailedPreconditionError(
                f"session {row.uid} is pinned to registered harness {row.harness!r}; it cannot be overridden"
            )
        resolved = await self.catalog.resolve(override)
        if resolved.registered:
            raise FailedPreconditionError(
                f"harness override {override!r} is a registered harness; "
                "overrides are between static harnesses only"
            )
        return resolved

    def _check_placement(self, resolved: ResolvedHarness, desc: harness_pb2.HarnessDescriptor) -> None:
        # The runtime decides (agentsessions.host.runtime.placement): capabilities vs the descriptor.
        refusal = placement_refusal(resolved.placed_on(), resolved.name, desc)
        if refusal is not None:
            raise UnplaceableError(refusal)

    async def _run_turn(self, turn: Turn, obs: _Observer) -> session_pb2.Session | None:
        p, row, resolved = turn.params, turn.view.row, turn.resolved
        desc = await describe(resolved)
        self._check_placement(resolved, desc)
        if turn.recovery is not None:
            if p.expected_last_seq is not None:
                head = await self.store.head(row.uid)
                if head.seq != p.expected_last_seq:
                    raise ConcurrencyError(
                        f"expected_last_seq {p.expected_last_seq} does not match head {head.seq}"
                    )
            gate = turn.recovery
            if not gate.decided:
                if gate.request_seq == 0:
                    await self._repair_gate(row.uid, gate)
                if not await self._settle_gate(row, obs=obs):
                    return session_view_proto(await self.view(row.uid))
                gate.execution = latest_execution((await self._executions(row))[1]) or gate.execution
            parked = await self._recover(row, gate.execution, obs)
            return parked if parked is not None else session_view_proto(await self.view(row.uid))
        # As read at admission: the guard has kept this host's writers out since.
        events = turn.events
        expected = p.expected_last_seq if p.expected_last_seq is not None else len(events)
        history = list(events)
        execution_id = self.new_id()
        start_event = common_pb2.Event(
            execution_id=execution_id,
            kind=K.EVENT_EXECUTION_START,
            execution_start=common_pb2.ExecutionStart(
                config=p.config,
                resume_from_seq=p.resume_from_seq,
                input_count=len(p.inputs),
                harness=resolved.name,
                harness_version=desc.version,
            ),
        )
        inputs = [
            common_pb2.Event(execution_id=execution_id, kind=K.EVENT_INPUT, message=m) for m in p.inputs
        ]
        # The incarnation's fence is minted by its first append, in the same transaction: one
        # durable commit, and only the writer that wins the head supersedes the one before it.
        records = await self._append(row.uid, [start_event, *inputs], expected, 0, mint_fence=True)
        fence = records[0].fence
        for rec in records:
            await obs.record(rec)
        start = Start(
            session=row.uid,
            execution_id=execution_id,
            inputs=list(p.inputs),
            history=history,
            config=p.config,
            resume_from_seq=p.resume_from_seq,
        )
        writer = self._writer(row.uid, fence, records[-1].seq, obs.record)
        sink = ExecutionSink(
            session=row.uid,
            execution_id=execution_id,
            append=writer.append,
            model=self.model,
            tools=self.tools,
            on_delta=obs.delta if self.stream_deltas else None,
            new_id=self.new_id,
            gate=self._session_gate(row),
        )
        return await self._drive(row.uid, resolved, start, sink, writer, obs, p.deadline_unix)

    @traced_turn(cancelled=lambda exc: isinstance(exc, ExecutionCancelled))
    async def _drive(
        self,
        uid: str,
        resolved: ResolvedHarness,
        start: Start,
        sink: ExecutionSink,
        writer: _Writer,
        obs: _Observer | None,
        deadline_unix: int = 0,
    ) -> session_pb2.Session | None:
        """Run the harness once over the sink, then journal END (or ERROR, or the park).
        Returns the parked Session when the execution parked on an approval."""
        fence = writer.fence

        async def tail(event: common_pb2.Event) -> None:
            event.execution_id = start.execution_id
            await writer.append(event)

        task = asyncio.current_task()
        assert task is not None
        running = _Running(start.execution_id, task, resolved.harness)
        self._running[uid] = running
        failure: BaseException | None = None
        try:
            try:
                if deadline_unix > 0:
                    remaining = deadline_unix - time.time()
                    async with asyncio.timeout(max(remaining, 0)):
                        await resolved.harness.run(start, sink)
                else:
                    await resolved.harness.run(start, sink)
            except ApprovalParkedError:
                pass
            except asyncio.CancelledError:
                if running.cancel_reason is None:
                    raise
                task.uncancel()  # Cancel asked for it: finish journaling the cancellation
            except ExecutionCancelledError:
                if running.cancel_reason is None:
                    running.cancel_reason = "the harness cancelled the execution"
            except TimeoutError as exc:
                failure = DeadlineExceededError(f"deadline_unix {deadline_unix} passed during the turn")
                failure.__cause__ = exc
            except Exception as exc:  # a park a framework wrapped is still the park
                failure = None if sink.parked is not None and find_park(exc) is sink.parked else exc
        except asyncio.CancelledError:
            sink.close()
            with contextlib.suppress(Exception):
                await asyncio.shield(
                    tail(
                        common_pb2.Event(
                            kind=K.EVENT_ERROR,
                            error=common_pb2.Error(
                                code=1, description="execution cancelled: the caller went away"
                            ),
                        )
                    )
                )
            raise
        finally:
            sink.close()
            self._running.pop(uid, None)
        if running.cancel_reason is not None:
            reason = running.cancel_reason or "cancelled"
            await tail(
                common_pb2.Event(
                    kind=K.EVENT_END,
                    end=common_pb2.HarnessEnd(
                        state="CANCELED", error=common_pb2.Error(code=1, description=reason)
                    ),
                )
            )
            await self._marker(uid, fence, common_pb2.Lifecycle(kind=LK.LIFECYCLE_CANCEL, detail=reason), obs)
            raise ExecutionCancelled(reason)
        if sink.parked is not None and failure is None:
            snapshot = await resolved.placed_on().snapshot(uid)
            await self._marker(uid, fence, snapshot.suspend_marker(), obs)
            view = await self.view(uid)
            return session_view_proto(view)
        if failure is None and sink.unconsumed() > 0:
            failure = ReplayDivergedError(
                f"execution {start.execution_id}: harness left {sink.unconsumed()} "
                "recorded effects unconsumed"
            )
        if failure is not None:
            err = _classify(failure)
            if not isinstance(err, ConcurrencyError):
                with contextlib.suppress(ControllerError):
                    await tail(
                        common_pb2.Event(kind=K.EVENT_ERROR, error=common_pb2.Error(description=str(failure)))
                    )
            raise err from failure
        await tail(common_pb2.Event(kind=K.EVENT_END, end=common_pb2.HarnessEnd(state="COMPLETED")))
        return None

    # -- Resume / recovery -------------------------------------------------------------------------

    async def resume(self, uid: str) -> SessionView:
        async with self._guard(uid):
            row = await self._row(uid)
            events, executions = await self._executions(row)
            latest = latest_execution(executions)
            fence = await self._mint(uid, len(events))
            if latest is not None and not latest.completed:
                gate = _open_gate(events, executions)
                if gate is not None and not gate.decided:
                    if gate.request_seq == 0:
                        await self._repair_gate(uid, gate, fence)
                    if not await self._settle_gate(row, fence):
                        return await self.view(uid)
                    latest = latest_execution((await self._executions(row))[1]) or latest
                parked = await self._recover(row, latest, None, fence=fence)
                if parked is not None:
                    return await self.view(uid)
            await self._marker(uid, fence, common_pb2.Lifecycle(kind=LK.LIFECYCLE_RESUME))
            return await self.view(uid)

    async def _repair_gate(self, uid: str, gate: Gate, fence: int | None = None) -> None:
        head = await self.store.head(uid)
        if fence is None:
            fence = await self._mint(uid, head.seq)
        await self._append(
            uid,
            [
                common_pb2.Event(
                    execution_id=gate.execution.id,
                    kind=K.EVENT_APPROVAL_REQUEST,
                    approval=common_pb2.ApprovalRequest(tool_call_id=gate.tool_call_id),
                )
            ],
            head.seq,
            fence,
        )

    async def _recover(
        self, row: SessionRow, ex: Execution, obs: _Observer | None, *, fence: int | None = None
    ) -> session_pb2.Session | None:
        """Re-drive an interrupted execution from the journal (spec 4.4)."""
        events = await self.cache.events(row.uid)
        effects, usage = recorded_effects(events, ex)
        if ex.legacy and effects and effects[-1].kind == "model" and effects[-1].reply is None:
            # The v0.1.2 writer lost this completion and a legacy turn is never re-driven past its
            # MODEL_CALL (spec 4.9): a log-shape refusal, before the harness runs or anything is written.
            raise InvalidExecutionLogError(
                f"legacy turn at seq {ex.first_index + 1}: recorded completion missing "
                "(MODEL_CALL without OUTPUT)"
            )
        if ex.inherited and any(e.kind == "tool" and e.reply is None for e in effects):
            # Re-driving a fork-copied intent under this session's uid could repeat the parent's
            # effect: refuse from the journal's shape, before the harness runs or anything is written.
            call = next(e.call.tool for e in effects if e.kind == "tool" and e.reply is None)
            raise InheritedToolIntentError(
                f"tool call {call.id!r} was copied from the parent by a fork and has no result; "
                "fork at or after the TOOL_RESULT, or Exec a new turn"
            )
        start, resolved = await self._reconstruct(row, ex, events)
        if fence is None:
            fence = await self._mint(row.uid, len(events))
        writer = self._writer(
            row.uid, fence, len(events), obs.record if obs else None, strip_execution_id=ex.legacy
        )
        sink = ExecutionSink(
            session=row.uid,
            execution_id=start.execution_id,
            append=writer.append,
            model=self.model,
            tools=self.tools,
            recorded=effects,
            recorded_usage=usage,
            on_delta=obs.delta if obs is not None and self.stream_deltas else None,
            inherited_prefix=ex.inherited,
            redrive_trailing_model=not ex.legacy,
            new_id=self.new_id,
            gate=self._session_gate(row),
        )
        return await self._drive(row.uid, resolved, start, sink, writer, obs)

    async def _reconstruct(
        self, row: SessionRow, ex: Execution, events: list[common_pb2.Event]
    ) -> tuple[Start, ResolvedHarness]:
        """The journal's Start for an execution, and its recorded harness (checked)."""
        if ex.legacy:
            if not ex.inputs:
                raise InvalidExecutionLogError("legacy turn has no INPUT to resume from")
            first = ex.first_index
            content = canon.content_hash(events[first], "", first + 1)
            resolved = await self.catalog.resolve(row.harness)
            desc = await describe(resolved)
            self._check_placement(resolved, desc)
            start = Start(
                session=row.uid,
                execution_id=legacy_execution_id(row.uid, first + 1, content),
                inputs=[ex.inputs[-1]],
                history=list(events[:first]),
            )
            return start, resolved
        es = ex.start
        if es is None:
            raise InvalidExecutionLogError(f"execution {ex.id} has no EXECUTION_START")
        if not es.HasField("input_count") or es.input_count < 0:
            raise InvalidExecutionLogError(f"execution {ex.id}: EXECUTION_START lacks a valid input_count")
        if es.input_count != len(ex.inputs) or any(not m.parts and not m.role for m in ex.inputs):
            raise IncompleteInvocationError(
                f"execution {ex.id} committed {len(ex.inputs)} of {es.input_count} inputs; "
                "call Exec again with all inputs"
            )
        try:
            resolved = await self.catalog.resolve(es.harness or row.harness)
        except InvalidArgumentError as exc:
            raise FailedPreconditionError(
                f"execution {ex.id} ran on harness {es.harness!r}, which this host does not serve"
            ) from exc
        desc = await describe(resolved)
        self._check_placement(resolved, desc)
        if es.harness_version and desc.version != es.harness_version:
            raise HarnessMismatchError(
                f"execution {ex.id} ran on {es.harness!r} version {es.harness_version!r}; "
                f"the served harness reports version {desc.version!r}"
            )
        start = Start(
            session=row.uid,
            execution_id=ex.id,
            inputs=list(ex.inputs),
            history=list(events[: ex.first_index]),
            config=es.config,
            resume_from_seq=es.resume_from_seq,
        )
        return start, resolved

    # -- controller replay (read-only) ----------------------------------------------------------

    async def replay(self, uid: str) -> ReplayReport:
        """Re-run every completed execution against its recorded effects: zero model calls,
        nothing written; divergence raises ReplayDivergedError."""
        row = await self._row(uid)
        events, executions = await self._executions(row)
        # A cancelled execution stopped wherever the Cancel found it: there is nothing to re-run.
        completed = [
            ex
            for ex in executions
            if ex.completed and not (ex.legacy and not ex.inputs) and not _cancelled(events, ex)
        ]
        plans = [await self._reconstruct(row, ex, events) for ex in completed]
        outputs: list[str] = []
        calls = 0
        served = 0

        async def refuse(event: common_pb2.Event) -> common_pb2.LogRecord:
            raise ReplayDivergedError("replay attempted to write to the journal")

        for ex, (start, resolved) in zip(completed, plans, strict=True):
            effects, usage = recorded_effects(events, ex)
            sink = ExecutionSink(
                session=uid,
                execution_id=start.execution_id,
                append=refuse,
                model=None,
                tools=None,
                recorded=effects,
                recorded_usage=usage,
                live=False,
            )
            try:
                await resolved.harness.run(start, sink)
            except ReplayDivergedError:
                raise
            except Exception as exc:
                raise ReplayDivergedError(f"execution {ex.id}: harness failed on replay: {exc}") from exc
            finally:
                sink.close()
            if sink.unconsumed():
                raise ReplayDivergedError(
                    f"execution {ex.id}: harness left {sink.unconsumed()} recorded effects unconsumed"
                )
            calls += sink.counters.model_calls
            for eff in effects:
                if eff.kind == "model":
                    served += 1
                    if eff.reply is not None:
                        outputs.append(_text(eff.reply.message))
                elif eff.kind == "output":
                    outputs.append(_text(eff.call.message))
        return ReplayReport(len(completed), outputs, calls, served)

    # -- Suspend / Fork / Approve / Cancel ----------------------------------------------------

    async def suspend(self, uid: str) -> SessionView:
        async with self._guard(uid):
            row = await self._row(uid)
            resolved = await self.catalog.resolve(row.harness)
            snapshot = await resolved.placed_on().snapshot(uid)
            fence = await self._mint(uid, (await self.store.head(uid)).seq)
            await self._marker(uid, fence, snapshot.suspend_marker())
            return await self.view(uid)

    async def fork(
        self,
        uid: str,
        at_seq: int,
        count: int,
        child_names: Sequence[str],
        labels: Mapping[str, str],
    ) -> list[SessionView]:
        if count <= 0:
            count = 1
        if count > MAX_FORK_CHILDREN:
            raise InvalidArgumentError("count", f"must be at most {MAX_FORK_CHILDREN}, got {count}")
        if child_names and len(child_names) != count:
            raise InvalidArgumentError(
                "child_names", f"must be empty or hold exactly count ({count}) names, got {len(child_names)}"
            )
        parent = await self._row(uid)
        head = await self.store.head(uid)
        if at_seq <= 0:
            at_seq = head.seq
        if at_seq > head.seq:
            raise InvalidArgumentError("at_seq", f"{at_seq} is beyond the session head {head.seq}")
        resolved = await self.catalog.resolve(parent.harness)
        desc = await describe(resolved)
        self._check_placement(resolved, desc)
        if (
            desc.capabilities.resumability == harness_pb2.RESUMABILITY_REQUIRES_MEMORY_SNAPSHOT
            and at_seq != head.seq
        ):
            raise UnplaceableError(
                f"harness {resolved.name!r} keeps memory state: it forks only at the head ({head.seq})"
            )
        now = time.time_ns()
        children = [
            SessionRow(
                uid="sess-" + secrets.token_hex(12),
                project=parent.project,
                name=child_names[i] if child_names else "",
                harness=parent.harness,
                model=parent.model,
                labels=dict(labels),
                annotations=dict(parent.annotations),
                origin=parent.origin,
                parent_uid=uid,
                fork_seq=at_seq,
                create_time_ns=now + i,
                update_time_ns=now + i,
            )
            for i in range(count)
        ]
        marker = canon.normalize_event(
            common_pb2.Event(
                kind=K.EVENT_LIFECYCLE,
                lifecycle=common_pb2.Lifecycle(kind=LK.LIFECYCLE_FORK, detail=f"parent@{at_seq}"),
            )
        )
        try:
            rows = await self.store.fork(uid, at_seq, children, marker)
        except (ConflictError, FencedError) as exc:
            raise ConcurrencyError(str(exc)) from exc
        return [await self._view(r) for r in rows]

    async def approve(
        self,
        uid: str,
        execution_id: str,
        tool_call_id: str,
        request_seq: int,
        approved: bool,
        reason: str,
        identity: common_pb2.IdentityRef | None,
    ) -> tuple[SessionView, common_pb2.LogRecord]:
        # With authentication the decision's actor is the authenticated caller (access.py).
        actor = self.access.actor(identity) or common_pb2.IdentityRef()
        async with self._guard(uid):
            row = await self._row(uid)
            events, executions = await self._executions(row)
            target = next((ex for ex in executions if ex.id == execution_id and not ex.legacy), None)
            if target is None:
                raise FailedPreconditionError(
                    f"execution {execution_id!r} has no approval request in session {uid}"
                )
            if target.inherited:
                raise FailedPreconditionError(
                    f"approval request {request_seq} was copied from the parent session by a fork; "
                    "it cannot be decided here (Exec a new turn instead)"
                )
            effects, _ = recorded_effects(events, target)
            effect = next(
                (
                    e
                    for e in effects
                    if e.kind == "tool"
                    and e.call.tool.id == tool_call_id
                    and e.approval_request is not None
                    and e.approval_request[0] == request_seq
                ),
                None,
            )
            if effect is None:
                raise FailedPreconditionError(
                    f"no approval request for tool call {tool_call_id!r} at seq {request_seq} "
                    f"in execution {execution_id!r}"
                )
            if effect.approval_result is not None:
                seq, decision = effect.approval_result
                d = decision.approval_result
                if d.approved == approved and d.reason == reason and decision.actor == actor:
                    (rec,) = await self.store.read(uid, seq, seq)
                    return await self.view(uid), rec
                by = f" by {decision.actor.principal}" if decision.actor.principal else ""
                raise FailedPreconditionError(
                    f"tool call {tool_call_id!r} was already decided at seq {seq}{by} with different values"
                )
            if effect.reply is not None:
                raise FailedPreconditionError(f"tool call {tool_call_id!r} already has a receipt")
            latest = latest_execution(executions)
            if latest is not target or target.completed:
                raise FailedPreconditionError(
                    f"approval request {request_seq} is stale: "
                    f"execution {execution_id!r} is no longer the live turn"
                )
            assert effect.approval_request is not None
            expired = self.approval_policy.expired(row.project, uid, effect.approval_request[1], request_seq)
            if expired is not None:
                fence = await self._mint(uid, len(events))
                denial = expired.event(execution_id, tool_call_id, request_seq)
                (rec,) = await self._append(uid, [denial], len(events), fence)
                raise FailedPreconditionError(
                    f"approval request {request_seq} {expired.reason}: the host denied it at seq {rec.seq}"
                )
            ts = timestamp_pb2.Timestamp()
            ts.GetCurrentTime()
            event = common_pb2.Event(
                execution_id=execution_id,
                kind=K.EVENT_APPROVAL_RESULT,
                ts=ts,
                approval_result=common_pb2.ApprovalResult(
                    tool_call_id=tool_call_id, approved=approved, reason=reason, request_seq=request_seq
                ),
                actor=actor,
            )
            (rec,) = await self._append(uid, [event], len(events), 0, mint_fence=True)
            return await self.view(uid), rec

    async def cancel(self, uid: str, execution_id: str, reason: str) -> SessionView:
        """Stop this host's running turn of a session, or close a turn parked on an approval;
        a no-op on an idle or finished session."""
        await self._row(uid)
        running = self._running.get(uid)
        if running is None:
            await self._close_parked(uid, execution_id, reason or "cancelled by request")
        if running is not None and (not execution_id or execution_id == running.execution_id):
            if running.cancel_reason is None:
                running.cancel_reason = reason or "cancelled by request"
                canceller = getattr(running.harness, "cancel", None)
                if canceller is None or not await canceller(running.execution_id, running.cancel_reason):
                    running.task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(_settled(running.task)), self.cancel_grace_s)
        return await self.view(uid)

    async def _close_parked(self, uid: str, execution_id: str, reason: str) -> None:
        """Journal END{CANCELED} and the CANCEL marker for a parked execution: its request can no
        longer be decided, and the session takes new inputs."""
        row = await self._row(uid)
        events, executions = await self._executions(row)
        if _open_gate(events, executions) is None:
            return
        async with self._guard(uid):
            events, executions = await self._executions(await self._row(uid))
            gate = _open_gate(events, executions)
            if gate is None or (execution_id and execution_id != gate.execution.id):
                return
            fence = await self._mint(uid, len(events))
            end = common_pb2.Event(
                execution_id=gate.execution.id,
                kind=K.EVENT_END,
                end=common_pb2.HarnessEnd(
                    state="CANCELED", error=common_pb2.Error(code=1, description=reason)
                ),
            )
            await self._append(uid, [end], len(events), fence)
            await self._marker(uid, fence, common_pb2.Lifecycle(kind=LK.LIFECYCLE_CANCEL, detail=reason))


class _Writer:
    """Appends one execution's records in order, each extending the previous one (CAS)."""

    def __init__(
        self,
        controller: Controller,
        uid: str,
        fence: int,
        head: int,
        on_record: Callable[[common_pb2.LogRecord], Awaitable[None]] | None,
        strip_execution_id: bool,
    ) -> None:
        self._controller = controller
        self.uid = uid
        self.fence = fence
        self.head = head
        self._on_record = on_record
        self._strip = strip_execution_id

    async def append(self, event: common_pb2.Event) -> common_pb2.LogRecord:
        if self._strip:
            event.execution_id = ""  # legacy turns stay id-less in the journal
        (rec,) = await self._controller._append(self.uid, [event], self.head, self.fence)
        self.head = rec.seq
        if self._on_record is not None:
            await self._on_record(rec)
        return rec


class ExecutionCancelled(ControllerError):
    """The turn was stopped by Cancel; END{CANCELED} and a CANCEL marker were journaled."""


async def _settled(task: asyncio.Task[Any]) -> None:
    with contextlib.suppress(BaseException):
        await task


class Turn:
    """An admitted Exec: run() streams its records, deltas and (after a park) the Session."""

    def __init__(
        self,
        controller: Controller,
        params: ExecParams,
        view: SessionView,
        resolved: ResolvedHarness,
        recovery: Gate | None,
        events: list[common_pb2.Event],
    ) -> None:
        self.controller = controller
        self.params = params
        self.view = view
        self.resolved = resolved
        self.recovery = recovery
        self.events = events  # the journal at admission (the cache's list, which grows as the turn appends)

    async def run(self) -> AsyncIterator[Update]:
        obs = _Observer()

        async def work() -> None:
            parked = await self.controller._run_turn(self, obs)
            if parked is not None:
                obs.queue.put_nowait(parked)

        task = asyncio.create_task(work())
        task.add_done_callback(lambda _: obs.queue.put_nowait(None))
        try:
            while True:
                item = await obs.queue.get()
                if item is None:
                    break
                yield item
            task.result()
        finally:
            if not task.done():
                task.cancel()
                await _settled(task)


def _open_gate(events: list[common_pb2.Event], executions: list[Execution]) -> Gate | None:
    latest = latest_execution(executions)
    if latest is None or latest.completed or latest.legacy or latest.inherited:
        return None
    try:
        effects, _ = recorded_effects(events, latest)
    except InvalidExecutionLogError:
        return None
    for eff in effects:
        if eff.kind != "tool" or eff.reply is not None:
            continue
        if eff.call.tool.mediation != common_pb2.MEDIATION_REQUIRES_APPROVAL:
            continue
        request_seq = eff.approval_request[0] if eff.approval_request else 0
        return Gate(latest, eff.call.tool.id, request_seq, eff.approval_result is not None)
    return None


def _cancelled(events: list[common_pb2.Event], ex: Execution) -> bool:
    return ex.end_index is not None and events[ex.end_index].end.state == "CANCELED"


def _text(message: common_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("part") == "text")


def _classify(exc: BaseException) -> ControllerError:
    if isinstance(exc, ControllerError):
        return exc
    if isinstance(exc, MissingToolExecutorError):
        return FailedPreconditionError(str(exc))
    if isinstance(exc, ConflictError | FencedError):
        return ConcurrencyError(str(exc))
    return HarnessRunError(f"harness run failed: {exc}")


def session_view_proto(view: SessionView) -> session_pb2.Session:
    """The wire Session for a view (one place, shared by the service and park frames)."""
    row = view.row
    s = session_pb2.Session(
        harness=row.harness,
        model=row.model,
        exec_state=view.exec_state,  # type: ignore[arg-type]
        last_seq=row.last_seq,
        parent_uid=row.parent_uid,
        fork_seq=row.fork_seq,
        labels=dict(row.labels),
        annotations=dict(row.annotations),
    )
    s.metadata.project = row.project
    s.metadata.name = row.name
    s.metadata.uid = row.uid
    if row.create_time_ns:
        s.metadata.create_time.FromNanoseconds(row.create_time_ns)
    if row.update_time_ns:
        s.metadata.update_time.FromNanoseconds(row.update_time_ns)
    s.compute_state = _COMPUTE.get(row.compute_state, session_pb2.COMPUTE_NONE)
    if view.pending_approval is not None:
        s.pending_approval.CopyFrom(view.pending_approval)
    if row.origin is not None:
        s.origin.CopyFrom(row.origin)
    if row.identity is not None:
        s.identity.CopyFrom(row.identity)
    return s


_COMPUTE = {
    "NONE": session_pb2.COMPUTE_NONE,
    "LIVE": session_pb2.COMPUTE_LIVE,
    "COLD": session_pb2.COMPUTE_COLD,
}
