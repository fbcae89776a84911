"""Exec (spec 4.2): admission, then the turn.

Admission (before any frame): the deadline, the session (created when the request names none),
the harness route (a per-turn override only between static harnesses), an open approval gate
that refuses new inputs; then the session's guard, held while the turn is alive. The turn:
Describe and placement, the session attached to its runtime, EXECUTION_START and the INPUTs
appended atomically at ``expected_last_seq`` (CAS) with a new fence, the harness driven over a
live sink. An Exec without inputs on an approval-bearing turn recovers that turn instead.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import field
from typing import Any

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import approvals, compaction, compute, recovery, results, sessions
from agentsessions.host.controller.admission import Ticket
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.drive import settled
from agentsessions.host.controller.errors import (
    ConcurrencyError,
    DeadlineExceededError,
    FailedPreconditionError,
)
from agentsessions.host.controller.executions import Execution
from agentsessions.host.controller.harnesses import ResolvedHarness, describe_placed, open_ahead
from agentsessions.host.controller.state import Gate, SessionView, open_gate
from agentsessions.host.controller.writer import ExecutionWriter
from agentsessions.host.journal.feed import DeltaGate
from agentsessions.host.journal.store import SessionRow
from agentsessions.sdk.harness import Start
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2

# Kinds through the generated module's constants: an EnumTypeWrapper attribute costs ~1.5 us.
K = common_pb2

# What an Exec stream relays: durable records, ephemeral deltas, and (after a park, or at the end
# of a recovery) the session.
Update = common_pb2.LogRecord | session_pb2.Delta | SessionView


@struct(frozen=True)
class ExecParams:
    session: str
    inputs: Sequence[common_pb2.Message] = ()
    harness: str = ""
    config: bytes = b""
    resume_from_seq: int = 0
    expected_last_seq: int | None = None
    deadline_unix: int = 0
    execution_id: str = ""  # set by the host for a turn it planned (a queued one); else minted
    ticket: Ticket | None = None  # what the host's admission carries besides the request
    result_schema: Mapping[str, Any] | None = None  # a checked JSON Schema (controller/results.py)


class Updates:
    """A turn's updates on their way to its Exec stream: an unbounded queue with one reader.

    ``asyncio.Queue`` does more for each item (task accounting, an Event cleared on every put) than
    a stream that carries seven or more of them a turn needs."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: collections.deque[Update | None] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: Update | None) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> Update | None:
        """The next item, waiting for one if there is none (one reader at a time)."""
        items = self._items
        while not items:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                if self._waiter is waiter:  # cancelled while waiting: forget it
                    self._waiter = None
        return items.popleft()


class Relay:
    """Relays a turn's records and deltas to the Exec stream, in order; a model call's deltas
    after its MODEL_CALL record (``gate``)."""

    def __init__(self) -> None:
        self.queue = Updates()
        self.gate = DeltaGate(self.queue.put_nowait)

    async def record(self, rec: common_pb2.LogRecord) -> None:
        self.queue.put_nowait(rec)
        self.gate.seen(rec)

    async def delta(self, delta: session_pb2.Delta) -> None:
        self.gate.delta(delta)


@struct
class Turn:
    """An admitted Exec: :meth:`run` streams its records, deltas and (after a park) the session."""

    core: Core
    call: CallContext
    params: ExecParams
    view: SessionView  # the session at admission (the stream's first frame)
    resolved: ResolvedHarness
    recovery: Gate | None  # the approval gate an inputless Exec recovers
    events: Sequence[common_pb2.Event]  # the journal at admission (the cache's list, grown by the turn)
    interrupted: Execution | None = None  # cut short by a crash: recovered before this turn
    _relay: Relay = field(default_factory=Relay, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    def begin(self) -> None:
        """Start the turn's work now, ahead of :meth:`run` (once): its first durable write then
        overlaps the Exec stream's session frame going out. What it yields waits for ``run``."""
        if self._task is not None:
            return
        relay = self._relay

        async def work() -> None:
            ending = await _execute(self, relay)
            if ending is not None:
                relay.queue.put_nowait(ending)

        self._task = asyncio.create_task(work())
        self._task.add_done_callback(lambda _: relay.queue.put_nowait(None))

    async def run(self) -> AsyncIterator[Update]:
        self.begin()
        task, queue = self._task, self._relay.queue
        assert task is not None
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                yield item
            task.result()
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Cut the turn's work short if it still runs (its caller went away)."""
        task = self._task
        if task is None:
            return
        if not task.done():
            task.cancel()
            await settled(task)
        elif not task.cancelled():
            task.exception()  # seen: a turn nobody streamed may have failed (its caller left first)


@contextlib.asynccontextmanager
async def admit(core: Core, call: CallContext, p: ExecParams) -> AsyncIterator[Turn]:
    """Route an Exec; errors raised here precede any frame. The session is guarded while the
    returned turn is alive."""
    if p.deadline_unix > 0 and time.time() >= p.deadline_unix:
        raise DeadlineExceededError(f"deadline_unix {p.deadline_unix} has already passed")
    found = await sessions.row(core, call, p.session) if p.session else None
    # The project's execution slot is taken before anything (even a new session) is written.
    with core.slots.hold(found.project if found is not None else core.default_project):
        if found is not None:
            row = found
            resolved = await _route(core, row, p.harness)
        else:
            created = await sessions.create(core, call, SessionRow(uid="", project="", harness=p.harness))
            row = created.row
            resolved = await core.catalog.resolve(row.harness)
        # The row was read just now (or created): its head vouches for the cached journal.
        events, executions = await sessions.read(core, row, fresh=True)
        gate = open_gate(events, executions)
        if gate is not None and p.inputs:
            if gate.decided:
                raise FailedPreconditionError(
                    f"session {row.uid}: its turn's tool call {gate.tool_call_id!r} is decided "
                    f"(request seq {gate.request_seq}) but the turn is not finished; Resume it or "
                    "Exec without inputs (the host continues it by itself shortly after the decision)"
                )
            raise FailedPreconditionError(
                f"session {row.uid} awaits a decision on tool call {gate.tool_call_id!r} "
                f"(request seq {gate.request_seq}); Approve it, then Resume or Exec without inputs"
            )
        interrupted = await core.admission.check(core, row, events, executions, p)
        async with core.guards.hold(row.uid):
            # Taking the guard did not yield: the journal read above is still this host's latest
            # (another host's write is caught by the fence mint and the append, both CAS).
            view = await sessions.view(core, row, (events, executions))
            turn = Turn(core, call, p, view, resolved, gate, events, interrupted)
            turn.begin()
            try:
                yield turn
            finally:
                await turn.stop()


async def _route(core: Core, row: SessionRow, override: str) -> ResolvedHarness:
    if not override or override == row.harness:
        return await core.catalog.resolve(row.harness)
    if not core.catalog.is_static(row.harness):
        raise FailedPreconditionError(
            f"session {row.uid} is pinned to registered harness {row.harness!r}; it cannot be overridden"
        )
    resolved = await core.catalog.resolve(override)
    if resolved.registered:
        raise FailedPreconditionError(
            f"harness override {override!r} is a registered harness; "
            "overrides are between static harnesses only"
        )
    return resolved


async def _execute(turn: Turn, relay: Relay) -> SessionView | None:
    """The admitted turn; the session when the stream must end with it (a park, or the end of a
    recovery)."""
    core, p, row, resolved = turn.core, turn.params, turn.view.row, turn.resolved
    desc = await describe_placed(resolved)
    if turn.recovery is not None:
        return await _recover(turn, turn.recovery, relay)
    # As read at admission: the guard has kept this host's writers out since.
    events, expected = await core.admission.prepare(core, row, p, turn.events, turn.interrupted)
    if expected == len(events) and await compaction.before_turn(core, row, events):
        events = await core.cache.events(row.uid)  # --compact-above-events: a baseline first
        expected = len(events)
    # The journal as admitted (from its latest baseline on), not a copy of it.
    history = compaction.history(core, row.uid, events, len(events))
    await compute.attach(resolved, row.uid)
    execution_id = p.execution_id or core.new_id()
    inputs = [common_pb2.Event(execution_id=execution_id, kind=K.EVENT_INPUT, message=m) for m in p.inputs]
    binding = results.bind_turn(p.result_schema, core.result_corrections)
    if binding is not None:  # the schema is journaled with the turn, as the host's last input
        inputs.append(results.schema_input(execution_id, binding))
    start_event = common_pb2.Event(
        execution_id=execution_id,
        kind=K.EVENT_EXECUTION_START,
        execution_start=common_pb2.ExecutionStart(
            config=p.config,
            resume_from_seq=p.resume_from_seq,
            input_count=len(inputs),
            harness=resolved.name,
            harness_version=desc.version,
        ),
    )
    start = Start(
        session=row.uid,
        execution_id=execution_id,
        inputs=[e.message for e in inputs],
        history=history,
        config=p.config,
        resume_from_seq=p.resume_from_seq,
    )
    # On an otherwise idle host the harness takes the stream's call while the first records are
    # committed; the Start goes on it once they are durable (and never, if they are not). Busy:
    # sessions in use besides this one (turns at any step, or Suspend, Resume, Approve).
    abandon = await open_ahead(resolved, start, row, others_busy=len(core.guards) > 1)
    try:
        # The incarnation's fence is minted by its first append, in the same transaction: one
        # durable commit, and only the writer that wins the head supersedes the one before it.
        records = await core.admission.start(core, row, p, [start_event, *inputs], expected)
        for rec in records:
            await relay.record(rec)
        writer = ExecutionWriter(core.writer, row.uid, records[0].fence, records[-1].seq, relay.record)
        on_delta, hold = core.admission.deltas(row.uid, relay.delta, relay.gate)
        sink = core.sinks.live(row, execution_id, writer, on_delta, descriptor=desc, delta_hold=hold)
        try:
            parked = await core.driver.drive(row.uid, resolved, start, sink, writer, p.deadline_unix)
        finally:  # frames still held wait for a MODEL_CALL whose write failed: they go now
            hold.release()
    finally:
        if abandon is not None:
            abandon()  # a stream the harness never ran on (a failed append, a Cancel first)
    return await sessions.look(core, turn.call, row.uid) if parked is not None else None


async def _recover(turn: Turn, gate: Gate, relay: Relay) -> SessionView:
    """An inputless Exec on an approval-bearing turn: decide what the host may, then re-drive the
    turn from the journal; the session as it ends (paused again, parked, or done)."""
    core, p, row = turn.core, turn.params, turn.view.row
    if p.expected_last_seq is not None:
        head = await core.store.head(row.uid)
        if head.seq != p.expected_last_seq:
            raise ConcurrencyError(f"expected_last_seq {p.expected_last_seq} does not match head {head.seq}")
    execution = await approvals.unblock(core, row, gate, on_record=relay.record)
    if execution is not None:
        await recovery.redrive(core, row, execution, "create", on_record=relay.record, on_delta=relay.delta)
    return await sessions.look(core, turn.call, row.uid)
