"""Subagents: the host's ``task`` tool (docs/subagents.md).

A ``task`` call of a harness that asked for the tool starts a child session (a new session of a named
harness, or a fork of the parent before the delegating turn) whose first turn runs detached, and parks
the parent at the call's approval gate, as an approval does: durable, no process waiting, the parent's
lease parked, ``EXEC_AWAITING`` with the call as ``pending_approval``. When the last child of the turn
settles, the host journals its own decision (``host:subagents``) on every waiting call and recovery
continues the parent by itself; on the re-drive each call's receipt is its child's final output, or an
error result carrying the child's error and partial output.

The links are durable where the sessions are: a child's row carries labels naming its parent, the
delegating execution and the call, and its uid is derived from those three, so every step can be
repeated after a crash and finds what the previous attempt made instead of making it again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Final, TypeVar

from agentsessions.host import logs
from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import cancel, fork, sessions
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.detached import Submitter
from agentsessions.host.controller.drive import cancelled
from agentsessions.host.controller.errors import (
    ConcurrencyError,
    ControllerError,
    FailedPreconditionError,
    HarnessUnavailableError,
    InvalidArgumentError,
    PermissionDeniedError,
    ResourceExhaustedError,
    SessionBusyError,
)
from agentsessions.host.controller.executions import Effect, Execution, latest_execution, recorded_effects
from agentsessions.host.controller.fork import ForkParams
from agentsessions.host.controller.turns import ExecParams
from agentsessions.host.journal.store import SessionExistsError, SessionRow, StoreError
from agentsessions.host.tools.task import (
    TASK_TOOL,
    TaskArgs,
    TaskArgumentError,
    is_task_call,
    parse_task_args,
    result_parts,
    struct_args,
)
from agentsessions.sdk.errors import ApprovalParkedError
from agentsessions.sdk.harness import message_text, text_message
from agentsessions.sdk.modes import MODE_ANNOTATION
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

log = logging.getLogger("agentsessions.controller")

_T = TypeVar("_T")

K = common_pb2

DEFAULT_MAX_CHILDREN: Final = 8
DEFAULT_MAX_DEPTH: Final = 1
DEFAULT_WAIT_TIMEOUT_S: Final = 3600.0
# A child's labels: its parent, the delegating execution and call, its depth (1: a parent's child).
PARENT_LABEL: Final = "agentsessions.io/subagent-parent"
EXECUTION_LABEL: Final = "agentsessions.io/subagent-execution"
CALL_LABEL: Final = "agentsessions.io/subagent-call"
DEPTH_LABEL: Final = "agentsessions.io/subagent-depth"
# Scans between reads of every child row (start-up reads them first): a parent another host left
# waiting is found within about this many seconds.
ADOPT_EVERY: Final = 60
# Sessions whose link (a child's, or none) the end of a turn remembers.
LINKS_KEPT: Final = 10_000
# Every APPROVAL_REQUEST of a task call starts with this; the host's decisions are made by this actor.
WAIT_REASON: Final = "subagent"
# The reason of the host's decision when the child settled (any other reason: why the call failed).
SETTLED: Final = "the child settled"
HOST_ACTOR: Final = common_pb2.IdentityRef(principal="host:subagents", issuer="agentsessions", subject="task")

Recorder = Callable[[common_pb2.Event], Awaitable[common_pb2.LogRecord]]
Parker = Callable[[common_pb2.ApprovalRef], ApprovalParkedError]


@struct(frozen=True)
class SubagentSettings:
    """What ``agentsessions serve`` sets from its flags (docs/subagents.md)."""

    max_children: int = DEFAULT_MAX_CHILDREN  # task children per turn; the next call is refused at once
    max_depth: int = DEFAULT_MAX_DEPTH  # 1: children may not delegate further
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S  # a child not settled by then is cancelled
    scan_s: float = 1.0


@struct(frozen=True)
class Link:
    """A child session and the task call it runs for."""

    parent: str
    execution_id: str
    tool_call_id: str
    child: str
    depth: int
    fork: bool = False


@struct
class Planned:
    """A task call of one execution, proposed by the model's output or made by the harness."""

    call_id: str
    args: TaskArgs | None  # None: its arguments break a rule (``error``)
    error: str = ""
    slot: int = -1  # its place among the turn's valid task calls (children per turn)


def child_uid(parent: str, execution_id: str, tool_call_id: str) -> str:
    """The child's uid, derived from the call it runs for: a repeated step finds it."""
    digest = hashlib.sha256(f"{parent}\x00{execution_id}\x00{tool_call_id}".encode()).hexdigest()
    return "sess-" + digest[:24]


def link_of(row: SessionRow) -> Link | None:
    """The task call a session runs for, from its labels (None: not a child)."""
    labels = row.labels
    parent = labels.get(PARENT_LABEL, "")
    if not parent:
        return None
    depth = labels.get(DEPTH_LABEL, "1")
    return Link(
        parent,
        labels.get(EXECUTION_LABEL, ""),
        labels.get(CALL_LABEL, ""),
        row.uid,
        int(depth) if depth.isdigit() else 1,
        fork=bool(row.parent_uid),
    )


def depth_of(row: SessionRow) -> int:
    link = link_of(row)
    return link.depth if link is not None else 0


def planned_calls(events: Sequence[common_pb2.Event], ex: Execution) -> list[Planned]:
    """The execution's task calls in the order they first appear (a model output's proposed calls,
    then the harness's calls), each with its arguments checked and its slot counted."""
    seen: dict[str, Planned] = {}
    for index in ex.indexes:
        ev = events[index]
        proposed: list[common_pb2.ToolCall] = []
        if ev.kind == K.EVENT_OUTPUT:
            proposed = [p.tool_call for p in ev.message.parts if p.WhichOneof("part") == "tool_call"]
            proposed = [c for c in proposed if c.tool == TASK_TOOL and c.id]
        elif ev.kind == K.EVENT_TOOL_CALL and is_task_call(ev.tool):
            proposed = [ev.tool]
        for call in proposed:
            if call.id in seen:
                continue
            try:
                seen[call.id] = Planned(call.id, parse_task_args(struct_args(call.args)))
            except TaskArgumentError as exc:
                seen[call.id] = Planned(call.id, None, str(exc))
    slot = 0
    for planned in seen.values():
        if planned.args is not None:
            planned.slot = slot
            slot += 1
    return list(seen.values())


def deleted(child: str) -> str:
    return f"subagent {child} was deleted"


def _error_result(call_id: str, error: str, *, request_seq: int, decision_seq: int) -> common_pb2.ToolResult:
    """A failed task call's receipt (an approved call whose run failed: EXECUTOR_ERROR)."""
    return common_pb2.ToolResult(
        id=call_id,
        is_error=True,
        code=common_pb2.ToolResult.EXECUTOR_ERROR,
        error=error,
        content=[common_pb2.Part(text=common_pb2.TextPart(text=error))],
        approval_request_seq=request_seq,
        approval_decision_seq=decision_seq,
    )


def receipt(
    call_id: str,
    child: str,
    events: Sequence[common_pb2.Event],
    ex: Execution | None,
    args: TaskArgs,
    decision: common_pb2.ApprovalResult,
    request_seq: int,
    decision_seq: int,
) -> common_pb2.ToolResult:
    """The parent's tool result of a settled child: its final output, or an error result with the
    child's error and partial output (also when the wait timed out)."""
    outputs = [
        events[i].message for i in (ex.indexes if ex is not None else []) if events[i].kind == K.EVENT_OUTPUT
    ]
    end = events[ex.end_index].end if ex is not None and ex.end_index is not None else None
    if decision.reason == SETTLED and end is not None and end.state in ("", "COMPLETED"):
        final = outputs[-1] if outputs else None
        return common_pb2.ToolResult(
            id=call_id,
            content=result_parts(final, args.result_schema),
            approval_request_seq=request_seq,
            approval_decision_seq=decision_seq,
        )
    if decision.reason != SETTLED:
        why = decision.reason
    elif end is not None:
        why = f"subagent {child} ended {end.state}: {end.error.description or 'no description'}"
    else:
        errors = [events[i].error.description for i in (ex.error_indexes if ex is not None else [])]
        why = f"subagent {child} failed: {errors[-1] if errors else 'its turn did not end'}"
    result = _error_result(call_id, why, request_seq=request_seq, decision_seq=decision_seq)
    partial = "\n".join(text for text in (message_text(m) for m in outputs) if text)
    if partial:
        result.content.append(common_pb2.Part(text=common_pb2.TextPart(text=f"partial output: {partial}")))
    return result


class Subagents:
    """The task tool's gate (called by the execution sink), the wake of waiting parents, the cascade
    of Cancel and Delete to children, and the links for ``agentsessions.ext.v1.Subagents``."""

    def __init__(
        self,
        core: Core,
        submitter: Submitter,
        settings: SubagentSettings,
        host: CallContext,
        on_decided: Callable[[], None],
    ) -> None:
        self.core = core
        self.submitter = submitter
        self.settings = settings
        self.host = host  # children are made with the host's authority (the parent's caller was checked)
        self._on_decided = on_decided  # the recoverer continues a decided parent
        self._waiting: set[str] = set()  # parents this host knows wait (found again by the scan)
        self._again: set[str] = set()  # children the last scan could not deal with: the next one tries
        self._task: asyncio.Task[None] | None = None
        self._looking: set[asyncio.Task[None]] = set()
        self._kick = asyncio.Event()
        self.children_started = 0  # child turns this host submitted
        # Each session's link, as its row says (labels never change and uids are never reused), so
        # the end of a turn costs no row read after the session's first: the most recent LINKS_KEPT.
        self._links: collections.OrderedDict[str, Link | None] = collections.OrderedDict()
        self._closed = False

    # -- the host's lifetime ---------------------------------------------------------------------

    async def start(self) -> None:
        """Start watching: first (in the background, so the host serves meanwhile) the children a
        previous incarnation left, found by their rows."""
        self._task = asyncio.get_running_loop().create_task(self._keep())

    async def close(self) -> None:
        self._closed = True  # a turn that ends during the drain starts no look after this
        await cancelled((self._task, *self._looking))
        self._task = None

    async def _adopt(self, uids: Iterable[str] | None = None) -> None:
        """Look at children by their rows (``uids``; None: every session): cancel those of an ended
        turn, start those a waiting turn planned and nobody started. A child that cannot be dealt
        with now is looked at again at the next scan, not only at the next full one."""
        store = self.core.store
        for uid in await store.session_uids() if uids is None else list(uids):
            retried = uid in self._again
            self._again.discard(uid)
            try:
                await _foreign_cancel_as_error(self._adopt_one(uid))
            except (StoreError, ControllerError, _ForeignCancel) as exc:
                self._again.add(uid)
                if not retried:  # said once; the scans that try again say nothing new
                    what = logs.fields(session=uid, error=str(exc))
                    log.warning("subagent not dealt with yet", extra=what)
            except Exception:  # one child's surprise must not stop the scan of the others; it is logged
                self._again.add(uid)
                if not retried:
                    log.exception("subagent scan of a child failed", extra=logs.fields(session=uid))
        self._kick.set()

    async def _adopt_one(self, uid: str) -> None:
        store = self.core.store
        row = await store.get_session(uid)
        link = link_of(row) if row is not None else None
        if link is None:
            return
        parent = await store.get_session(link.parent)
        if parent is None:
            return
        events, executions = await sessions.read(self.core, parent)
        ex = next((e for e in executions if e.id == link.execution_id), None)
        if ex is None:
            return
        if ex.completed:
            await self._orphaned(link, events, ex)
            return
        planned = {p.call_id: p for p in planned_calls(events, ex)}
        wanted = planned.get(link.tool_call_id)
        self._waiting.add(parent.uid)
        if wanted is not None and wanted.args is not None:
            await self._start_child(parent, ex, wanted.call_id, wanted.args)

    async def _orphaned(self, link: Link, events: Sequence[common_pb2.Event], ex: Execution) -> None:
        """The parent's turn that started the child has ended (cancelled, interrupted, or done
        without waiting for it): the child's task turn, still unfinished, is cancelled naming the
        parent, with its own children in turn (a host killed between that END and the cascade left
        it running; Cancel of a finished child journals nothing)."""
        row = await self.core.store.get_session(link.child)
        if row is None:
            return
        _, executions = await sessions.read(self.core, row)
        own = [e for e in executions if not e.inherited]
        if len(own) != 1 or own[0].completed:
            return  # the task's turn (the child's first own) ended, was never started, or was followed
        assert ex.end_index is not None
        end = events[ex.end_index].end
        why = f": {end.error.description}" if end.error.description else ""
        reason = (
            f"its parent session {link.parent} ended the turn that started it {end.state or 'COMPLETED'}{why}"
        )
        log.info(
            "subagent of an ended turn cancelled", extra=logs.fields(session=link.child, parent=link.parent)
        )
        await self._cancel_child(link.child, reason)

    async def _keep(self) -> None:
        scans = 0
        while True:
            try:
                await self._adopt(None if scans % ADOPT_EVERY == 0 else sorted(self._again))
            except (StoreError, ControllerError) as exc:
                log.warning("subagent scan of children failed", extra=logs.fields(error=type(exc).__name__))
            scans += 1
            self._kick.clear()
            for uid in sorted(self._waiting):
                try:
                    await _foreign_cancel_as_error(self.wake(uid))
                except (StoreError, ControllerError, _ForeignCancel) as exc:
                    what = logs.fields(session=uid, error=type(exc).__name__)
                    log.info("subagent wake not done yet", extra=what)
                except Exception:  # the loop must outlive one parent's surprise; it is logged
                    log.exception("subagent wake failed", extra=logs.fields(session=uid))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.scan_s):
                    await self._kick.wait()

    def ended(self, uid: str) -> None:
        """A turn ended on this host (its lease went): if it was a child's, look at its parent now."""
        if self._closed:
            return  # the host is stopping: the next start's scan finds a parent left waiting
        links = self._links
        if uid in links:
            links.move_to_end(uid)
            self._wake_parent(links[uid])
            return
        task = asyncio.get_running_loop().create_task(self._child_ended(uid))
        self._looking.add(task)
        task.add_done_callback(self._looking.discard)

    async def _child_ended(self, uid: str) -> None:
        with contextlib.suppress(StoreError):
            row = await self.core.store.get_session(uid)
            if row is None:
                return  # deleted: it wakes nobody
            link = link_of(row)
            self._links[uid] = link
            while len(self._links) > LINKS_KEPT:
                self._links.popitem(last=False)
            self._wake_parent(link)

    def _wake_parent(self, link: Link | None) -> None:
        if link is not None:
            self._waiting.add(link.parent)
            self._kick.set()

    # -- the gate (ExecutionSink) ------------------------------------------------------------------

    async def gate(
        self,
        session: str,
        execution_id: str,
        call: common_pb2.ToolCall,
        effect: Effect | None,
        record: Recorder,
        park: Parker,
    ) -> common_pb2.ToolResult:
        """Answer a task call of the parent's execution: at once (bad arguments, a limit, a child that
        already settled, a decision already journaled), or by parking the parent until its children
        settle. ``effect`` is what the journal recorded of the call (None: a new call)."""
        core = self.core
        row = await core.store.get_session(session)
        if row is None:
            raise FailedPreconditionError(f"session {session} is gone")
        events, executions = await sessions.read(core, row)
        ex = next((e for e in executions if e.id == execution_id), None)
        planned = {p.call_id: p for p in planned_calls(events, ex)} if ex else {}
        if effect is None:
            intent = common_pb2.ToolCall()
            intent.CopyFrom(call)
            await record(common_pb2.Event(kind=K.EVENT_TOOL_CALL, tool=intent))
            events, executions = await sessions.read(core, row)
            ex = next(e for e in executions if e.id == execution_id)
            planned = {p.call_id: p for p in planned_calls(events, ex)}
        assert ex is not None
        uid = child_uid(session, execution_id, call.id)
        mine = planned.get(call.id)
        refusal = await self._refusal(row, mine, call)
        if refusal:
            log.info(
                "task call refused", extra=logs.fields(session=session, tool_call_id=call.id, error=refusal)
            )
            return await self._refuse(execution_id, call.id, refusal, effect, record)
        assert mine is not None and mine.args is not None
        if effect is not None and effect.approval_result is not None:
            return await self._receipt(call.id, uid, mine.args, effect, record)
        # Intent is durable: start this call's child and those of the calls the model proposed with it
        # (they fan out now; their own calls find them started).
        try:
            await self._start_child(row, ex, call.id, mine.args)
        except _NOT_STARTED as exc:
            if effect is not None and effect.approval_request is not None:
                raise  # it waits already: the next attempt starts it
            return await self._refuse(
                execution_id, call.id, f"subagent {uid} could not start: {exc}", effect, record
            )
        for other in planned.values():
            if (
                other.call_id != call.id
                and other.args is not None
                and 0 <= other.slot < self.settings.max_children
            ):
                try:
                    await self._start_child(row, ex, other.call_id, other.args)
                except ControllerError as exc:
                    # Its own call starts it, or answers why it cannot.
                    log.info("subagent not started yet", extra=logs.fields(session=uid, error=str(exc)))
        if effect is None or effect.approval_request is None:
            request = common_pb2.Event(
                kind=K.EVENT_APPROVAL_REQUEST,
                approval=common_pb2.ApprovalRequest(
                    tool_call_id=call.id, reason=f"{WAIT_REASON} {uid}: waits for the child session's turn"
                ),
            )
            request.ts.GetCurrentTime()  # the wait timeout counts from here
            request_seq = (await record(request)).seq
        else:
            request_seq = effect.approval_request[0]
        child = await self._child(uid)
        if child is not None and child[1] is not None and child[1].completed:
            decided = self._decision(execution_id, call.id, request_seq, SETTLED)
            rec = await record(decided)
            result = receipt(
                call.id, uid, child[0], child[1], mine.args, decided.approval_result, request_seq, rec.seq
            )
            await record(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=result))
            return result
        self._waiting.add(session)
        self._kick.set()
        raise park(
            common_pb2.ApprovalRef(execution_id=execution_id, tool_call_id=call.id, request_seq=request_seq)
        )

    async def _refuse(
        self, execution_id: str, call_id: str, why: str, effect: Effect | None, record: Recorder
    ) -> common_pb2.ToolResult:
        """Answer the call at once with an error receipt saying why, through the gate's records (its
        request and the host's decision), as every REQUIRES_APPROVAL call is answered."""
        if effect is not None and effect.approval_request is not None:
            request_seq = effect.approval_request[0]
        else:
            request = common_pb2.ApprovalRequest(tool_call_id=call_id, reason=f"{WAIT_REASON}: {why}")
            asked = common_pb2.Event(kind=K.EVENT_APPROVAL_REQUEST, approval=request)
            request_seq = (await record(asked)).seq
        if effect is not None and effect.approval_result is not None:
            decision_seq = effect.approval_result[0]
        else:
            decision_seq = (await record(self._decision(execution_id, call_id, request_seq, why))).seq
        result = _error_result(call_id, why, request_seq=request_seq, decision_seq=decision_seq)
        await record(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=result))
        return result

    async def _refusal(self, row: SessionRow, mine: Planned | None, call: common_pb2.ToolCall) -> str:
        if mine is None or mine.args is None:
            if mine is not None:
                return mine.error
            try:
                parse_task_args(struct_args(call.args))
            except TaskArgumentError as exc:
                return str(exc)
            return f"task call {call.id!r} is not in its execution"
        try:
            args = parse_task_args(struct_args(call.args))
        except TaskArgumentError as exc:
            return str(exc)
        if args != mine.args:
            return (
                f"task call {call.id!r}: its arguments differ from the ones the model proposed, "
                "from which the host started its child"
            )
        depth = depth_of(row) + 1
        if depth > self.settings.max_depth:
            return (
                f"task refused: a child at depth {depth} would pass the subagent depth limit "
                f"{self.settings.max_depth} (--subagent-max-depth)"
            )
        if mine.slot >= self.settings.max_children:
            return (
                f"task refused: the turn already started {self.settings.max_children} children, "
                "the limit per turn (--subagent-max-children)"
            )
        if args.harness and args.harness not in await self.core.catalog.names():
            return f"task argument 'harness' names {args.harness!r}, which this host does not serve"
        return ""

    async def _receipt(
        self, call_id: str, uid: str, args: TaskArgs, effect: Effect, record: Recorder
    ) -> common_pb2.ToolResult:
        assert effect.approval_request is not None and effect.approval_result is not None
        decision_seq, decided = effect.approval_result
        request_seq = effect.approval_request[0]
        child = await self._child(uid)
        if child is None:
            result = _error_result(call_id, deleted(uid), request_seq=request_seq, decision_seq=decision_seq)
        else:
            result = receipt(call_id, uid, *child, args, decided.approval_result, request_seq, decision_seq)
        await record(common_pb2.Event(kind=K.EVENT_TOOL_RESULT, result=result))
        return result

    @staticmethod
    def _decision(execution_id: str, call_id: str, request_seq: int, reason: str) -> common_pb2.Event:
        """The host's decision on a task call: always approved (the call ran: its receipt, an error
        result unless ``reason`` is SETTLED, says how); no time stamp, so recovery continues at once
        (it leaves a person's decision 2 s)."""
        return common_pb2.Event(
            execution_id=execution_id,
            kind=K.EVENT_APPROVAL_RESULT,
            approval_result=common_pb2.ApprovalResult(
                tool_call_id=call_id, approved=True, reason=reason, request_seq=request_seq
            ),
            actor=HOST_ACTOR,
        )

    # -- children ----------------------------------------------------------------------------------

    async def _child(self, uid: str) -> tuple[Sequence[common_pb2.Event], Execution | None] | None:
        """The child's journal and its own latest execution (None: no such session)."""
        row = await self.core.store.get_session(uid)
        if row is None:
            return None
        events, executions = await sessions.read(self.core, row)
        own = [e for e in executions if not e.inherited]
        return events, latest_execution(own)

    async def _start_child(self, parent: SessionRow, ex: Execution, call_id: str, args: TaskArgs) -> str:
        """Make the child session (once) and submit its turn (once: at its head as made)."""
        core = self.core
        uid = child_uid(parent.uid, ex.id, call_id)
        depth = depth_of(parent) + 1
        labels = {
            PARENT_LABEL: parent.uid,
            EXECUTION_LABEL: ex.id,
            CALL_LABEL: call_id,
            DEPTH_LABEL: str(depth),
        }
        row = await core.store.get_session(uid)
        if row is None:
            try:
                if args.fork and ex.first_index > 0:
                    # The parent as it stood before the delegating turn: the child does not inherit the
                    # turn itself (its recovery would re-run the parent's turn in the child).
                    params = ForkParams(at_seq=ex.first_index, count=1, child_uids=[uid], labels=labels)
                    await fork.fork(core, self.host, parent.uid, params)
                else:
                    annotations = {k: v for k, v in parent.annotations.items() if k == MODE_ANNOTATION}
                    requested = SessionRow(
                        uid=uid,
                        project=parent.project,
                        harness=args.harness or parent.harness,
                        labels=labels,
                        annotations=annotations,
                    )
                    await sessions.create(core, self.host, requested)
            except SessionExistsError:
                pass
            row = await core.store.get_session(uid)
            if row is None:  # deleted as soon as it was made (a cascade, a DeleteSession)
                raise FailedPreconditionError(f"subagent session {uid} was deleted as it was made")
        child = await self._child(uid)
        if child is None or child[1] is not None:
            return uid  # its turn was submitted before
        head = (await core.store.head(uid)).seq
        p = ExecParams(
            session=uid,
            inputs=[text_message("user", args.prompt)],
            expected_last_seq=head,
            result_schema=args.result_schema,  # the child's turn settles against it (docs/results.md)
        )
        try:
            await self.submitter.submit(p, "reject", self.host)
            self.children_started += 1
            log.info(
                "subagent started", extra=logs.fields(session=uid, parent=parent.uid, tool_call_id=call_id)
            )
        except (ConcurrencyError, SessionBusyError):
            pass  # another attempt submitted it meanwhile (the CAS on its head lets one through)
        return uid

    # -- the wake ----------------------------------------------------------------------------------

    async def wake(self, uid: str) -> bool:
        """Journal the host's decision on the parent's waiting task calls once every one of their
        children settled (or its wait timed out); True when it did."""
        core = self.core
        row = await core.store.get_session(uid)
        if row is None:
            self._waiting.discard(uid)
            return False
        if core.guards.busy(uid) or uid in core.driver.running:
            return False  # its turn runs here (it parks in a moment, or finds its children settled)
        # Looked at without the guard first, as the recoverer does: most looks decide nothing, and a
        # turn admitted on the parent (a Submit that interrupts it, say) must not find it busy then.
        if await self._decisions(row) is None:
            return False
        if core.guards.busy(uid) or uid in core.driver.running:
            return False
        async with core.guards.hold(uid):
            decided = await self._decisions(row)  # again under the guard: what is journaled
            if decided is None:
                return False
            ex, head, decisions, expired = decided
            fence = await core.writer.mint(uid, head)
            await core.writer.append(uid, decisions, head, fence)
        self._waiting.discard(uid)
        why = f"its wait timed out after {self.settings.wait_timeout_s:g} s"
        for child in expired:
            try:
                await self._cancel_child(child, why)
            except (StoreError, ControllerError) as exc:  # decided all the same: the parent goes on
                what = logs.fields(session=child, parent=uid, error=type(exc).__name__)
                log.warning("subagent whose wait timed out not cancelled", extra=what)
        log.info("subagent parent decided", extra=logs.fields(session=uid, execution_id=ex.id))
        self._on_decided()
        return True

    async def _decisions(
        self, row: SessionRow
    ) -> tuple[Execution, int, list[common_pb2.Event], list[str]] | None:
        """The parent's latest execution, the head read, the host's decisions on its waiting task
        calls and the children whose wait expired; None while there is nothing to decide yet (and a
        parent that waits for nothing any more is forgotten)."""
        uid = row.uid
        events, executions = await sessions.read(self.core, row)
        ex = latest_execution(executions)
        if ex is None or ex.completed:
            self._waiting.discard(uid)
            return None
        waiting = [e for e in recorded_effects(events, ex)[0] if _waits(e)]
        undecided = [e for e in waiting if e.approval_request is not None and e.approval_result is None]
        if not undecided:
            if not waiting:
                self._waiting.discard(uid)
            return None
        decisions: list[common_pb2.Event] = []
        expired: list[str] = []
        now = time.time()
        for effect in undecided:
            assert effect.approval_request is not None
            request_seq, request = effect.approval_request
            call_id = effect.call.tool.id
            child = child_uid(uid, ex.id, call_id)
            state = await self._child(child)
            if state is not None and state[1] is not None and state[1].completed:
                decisions.append(self._decision(ex.id, call_id, request_seq, SETTLED))
                continue
            if state is None:  # someone deleted the child: it never settles
                decisions.append(self._decision(ex.id, call_id, request_seq, deleted(child)))
                continue
            asked = request.ts.ToNanoseconds() / 1e9 if request.HasField("ts") else now
            if now - asked >= self.settings.wait_timeout_s:
                why = (
                    f"subagent {child} did not settle within {self.settings.wait_timeout_s:g} s "
                    "(--subagent-wait-timeout); it was cancelled"
                )
                decisions.append(self._decision(ex.id, call_id, request_seq, why))
                expired.append(child)
                continue
            return None  # the last child has not settled yet
        if not expired and not await self._siblings_settled(uid, events, ex, undecided):
            return None  # a child the model proposed with them still runs: they resume together
        return ex, len(events), decisions, expired

    async def _siblings_settled(
        self, uid: str, events: Sequence[common_pb2.Event], ex: Execution, gated: list[Effect]
    ) -> bool:
        """Whether every other child the execution started (a proposed call without its own gate yet)
        settled."""
        skip = {e.call.tool.id for e in gated}
        for planned in planned_calls(events, ex):
            if planned.call_id in skip or planned.args is None or planned.slot >= self.settings.max_children:
                continue
            state = await self._child(child_uid(uid, ex.id, planned.call_id))
            if state is not None and (state[1] is None or not state[1].completed):
                return False
        return True

    # -- cascade -----------------------------------------------------------------------------------

    async def children(self, uid: str, *, latest_only: bool) -> list[Link]:
        """The children the session's task calls started (of its latest execution, or of all)."""
        row = await self.core.store.get_session(uid)
        if row is None:
            return []
        events, executions = await sessions.read(self.core, row)
        chosen = executions if not latest_only else [e for e in [latest_execution(executions)] if e]
        found: list[Link] = []
        for ex in chosen:
            if ex.inherited:
                continue
            for planned in planned_calls(events, ex):
                child = await self.core.store.get_session(child_uid(uid, ex.id, planned.call_id))
                if child is not None:
                    link = link_of(child)
                    if link is not None and link.parent == uid:
                        found.append(link)
        return found

    async def _cancel_child(self, uid: str, reason: str) -> None:
        """Cancel a child as Cancel does, with its own children in turn (and its turn on another
        host through its lease); without the live parts, this host's turn of it only."""
        cascade = self.submitter.cancel_child
        if cascade is not None:
            await cascade(uid, reason, self.host)
            return
        with contextlib.suppress(ControllerError, StoreError):
            await cancel.cancel(self.core, self.host, uid, "", reason)

    async def links(
        self, uid: str, call: CallContext
    ) -> tuple[tuple[Link, int] | None, list[tuple[Link, int]]]:
        """The task call the session runs for and the children its calls started, each with the child's
        exec state; the caller's access is checked (an unknown or hidden session: NOT_FOUND)."""
        core = self.core
        row = await sessions.row(core, call, uid)
        parent: tuple[Link, int] | None = None
        link = link_of(row)
        if link is not None:
            parent = (link, (await sessions.view(core, row)).exec_state)
        children: list[tuple[Link, int]] = []
        for child in await self.children(uid, latest_only=False):
            child_row = await core.store.get_session(child.child)
            if child_row is not None:
                children.append((child, (await sessions.view(core, child_row)).exec_state))
        return parent, children

    async def waiting_child(self, uid: str, execution_id: str, tool_call_id: str) -> str | None:
        """The child a parent's task call waits for, when there is one."""
        child = child_uid(uid, execution_id, tool_call_id)
        row = await self.core.store.get_session(child)
        if row is None:
            return None
        link = link_of(row)
        return child if link is not None and link.parent == uid else None


# Why a child's turn may not start, answered to its task call (a call already waiting retries instead).
_NOT_STARTED = (
    HarnessUnavailableError,
    InvalidArgumentError,
    FailedPreconditionError,
    ResourceExhaustedError,
    PermissionDeniedError,
)


class _ForeignCancel(Exception):
    """A CancelledError the scan's own task was not asked for: grpc raises one from a call whose
    channel was closed under it (a harness process that went away mid-Describe, say)."""


async def _foreign_cancel_as_error(work: Awaitable[_T]) -> _T:
    """``await work``; a CancelledError the current task was not asked for comes out as
    :class:`_ForeignCancel`, so a loop that must outlive one session's trouble goes on."""
    try:
        return await work
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        raise _ForeignCancel("a call was cancelled under the scan") from exc


def _waits(effect: Effect) -> bool:
    return effect.kind == "tool" and effect.reply is None and is_task_call(effect.call.tool)
