"""Automatic recovery: executions whose lease expired are recovered as Resume would, by whichever
host takes the lease first.

On start-up and then every ``scan_s``, :class:`Recoverer` asks the store for the leases someone may
have to act on (``journal.live.LiveStore.candidates``): RUNNING ones whose owner stopped renewing
(or is a process of this machine that is gone), RETRY ones whose backoff has passed, PARKED ones
whose session moved. For each it takes the session's guard, re-reads the journal and decides:

* the execution ended, was superseded or its session deleted: the lease goes;
* the session was suspended on purpose (its newest record is a SUSPEND that is no park): it stays
  suspended, the lease goes (Resume completes the turn when someone asks);
* it waits at an approval gate nobody decided (the host's policy may decide it now): it stays
  parked;
* otherwise the lease is claimed (compare-and-swap on the row, so one host wins), the attempt is
  counted, and the execution is re-driven against its journal, then RESUME is journaled. Past the
  budget of attempts the turn ends ``END{FAILED}`` with an error that says why.

An Exec on a session whose last execution was cut short recovers it first, the same way
(:func:`recover_held`), under the Exec's own guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Literal

from agentsessions.host import logs
from agentsessions.host.controller import approvals, recovery, sessions
from agentsessions.host.controller.admission import busy_elsewhere
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.drive import cancelled
from agentsessions.host.controller.errors import (
    ControllerError,
    ExecutionCancelled,
    InvalidExecutionLogError,
)
from agentsessions.host.controller.executions import Execution, latest_execution, recorded_effects
from agentsessions.host.controller.leases import LeaseKeeper
from agentsessions.host.controller.state import Gate, open_gate
from agentsessions.host.journal.live import PARKED, RUNNING, Lease, LiveStore
from agentsessions.host.journal.store import SessionRow, StoreError
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2

log = logging.getLogger("agentsessions.controller")

K = common_pb2
LK = common_pb2.Lifecycle

DEFAULT_ATTEMPTS: Final = 3
DEFAULT_SCAN_S: Final = 1.0
# Recoveries one host runs at once.
CONCURRENCY: Final = 8
# Scans between purges of expired idempotency keys.
PURGE_EVERY: Final = 600
# An END{FAILED} from recovery carries INTERNAL: the turn kept failing.
GAVE_UP_CODE: Final = 13
# A decided gate is left this long to whoever decided it (``agentsessions approve`` continues the
# turn itself, at once); the recoverer continues it after that.
DECISION_GRACE_S: Final = 2.0

Outcome = Literal["completed", "parked", "gave up"]


@struct(frozen=True)
class RecoverySettings:
    enabled: bool = True
    attempts: int = DEFAULT_ATTEMPTS  # recovery attempts before the turn ends FAILED
    scan_s: float = DEFAULT_SCAN_S


def _decided_since(events: Sequence[common_pb2.Event], gate: Gate) -> float:
    """Seconds since the gate's decision was journaled (a decision without a time: long ago)."""
    effects, _ = recorded_effects(events, gate.execution)
    for effect in effects:
        if effect.kind == "tool" and effect.call.tool.id == gate.tool_call_id and effect.approval_result:
            stamp = effect.approval_result[1].ts
            if stamp.seconds or stamp.nanos:
                return time.time() - stamp.ToNanoseconds() / 1e9
    return float("inf")


def explicitly_suspended(events: Sequence[common_pb2.Event], executions: list[Execution]) -> bool:
    """The newest record is a SUSPEND marker that is not an approval park (Suspend was asked for)."""
    if not events:
        return False
    last = events[-1]
    if last.kind != K.EVENT_LIFECYCLE or last.lifecycle.kind != LK.LIFECYCLE_SUSPEND:
        return False
    return open_gate(events, executions) is None


async def recover_held(
    core: Core,
    keeper: LeaseKeeper,
    settings: RecoverySettings,
    row: SessionRow,
    ex: Execution,
    lease: Lease | None,
) -> Outcome:
    """Recover ``ex`` (the session's latest, interrupted execution) as Resume would; the caller
    holds the session's guard. Raises what the re-drive raised (its lease then says what next)."""
    uid = row.uid
    live = keeper.live
    if lease is None:
        lease = await live.lease(uid, ex.id)
    if lease is not None and await keeper.live_elsewhere(lease):
        raise busy_elsewhere(uid, lease.owner)
    counted = 0 if lease is not None and lease.state == PARKED else 1
    claimed = keeper.fresh(uid, ex.id, attempts=(lease.attempts if lease is not None else 0) + counted)
    if not await live.claim(lease, claimed):
        raise busy_elsewhere(uid, "another host")
    keeper.adopted(uid, ex.id)
    try:
        if claimed.attempts > settings.attempts:
            why = (
                lease.last_error if lease is not None and lease.last_error else "the host running it stopped"
            )
            await give_up(core, keeper, row, ex, f"gave up after {claimed.attempts - 1} attempts: {why}")
            return "gave up"
        events, executions = await sessions.read(core, row)
        gate = open_gate(events, executions)
        if gate is not None:
            unblocked = await approvals.unblock(core, row, gate)
            if unblocked is None:
                await keeper.parked(uid, ex.id, (await core.store.head(uid)).seq)
                return "parked"
            ex = unblocked
        fence = await core.writer.mint_at_head(uid)
        feed = live.feed

        async def deltas(delta: session_pb2.Delta) -> None:
            feed.delta(uid, delta)

        parked = await recovery.redrive(core, row, ex, "restore", fence=fence, on_delta=deltas)
        if parked is not None:
            return "parked"
        await core.writer.marker(uid, fence, common_pb2.Lifecycle(kind=LK.LIFECYCLE_RESUME))
        return "completed"
    except InvalidExecutionLogError as exc:
        # The journal's shape refuses it: no attempt can mend that.
        if keeper.held(uid, ex.id):
            await give_up(core, keeper, row, ex, f"it cannot be recovered: {exc}")
            return "gave up"
        raise
    except BaseException as exc:
        if keeper.held(uid, ex.id):  # failed before its drive began: the drive ended nothing
            await keeper.failed(uid, ex.id, str(exc) or type(exc).__name__)
        raise


async def give_up(core: Core, keeper: LeaseKeeper, row: SessionRow, ex: Execution, why: str) -> None:
    """End the execution FAILED, saying why; the caller holds the session's guard."""
    uid = row.uid
    events = await core.cache.events(uid)
    fence = await core.writer.mint(uid, len(events))
    end = common_pb2.Event(
        execution_id=ex.id,
        kind=K.EVENT_END,
        end=common_pb2.HarnessEnd(
            state="FAILED",
            error=common_pb2.Error(code=GAVE_UP_CODE, description=f"automatic recovery {why}"),
        ),
    )
    await core.writer.append(uid, [end], len(events), fence)
    await keeper.ended(uid, ex.id)


class Recoverer:
    """Scans for leases to act on and recovers what they name (see the module doc)."""

    def __init__(
        self,
        core: Core,
        keeper: LeaseKeeper,
        settings: RecoverySettings,
        *,
        on_idle: Callable[[str], None],
        purge_keys: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        self.core = core
        self.keeper = keeper
        self.live: LiveStore = keeper.live
        self.settings = settings
        self._on_idle = on_idle  # a session with nothing in flight: its queued turns may start
        self._purge_keys = purge_keys
        self._task: asyncio.Task[None] | None = None
        self._working: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(CONCURRENCY)
        self._wake = asyncio.Event()
        self.scans = 0
        self.recovered = 0  # executions this host recovered to an END (or a park)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep())

    def wake(self) -> None:
        self._wake.set()

    def pause(self) -> None:
        """Start nothing more (the host drains); recoveries under way go on until the host closes."""
        if self._task is not None:
            self._task.cancel()

    async def close(self) -> None:
        await cancelled((self._task, *self._working.values()))
        self._task = None

    async def _keep(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.scan()
            except (StoreError, ControllerError) as exc:
                log.warning("recovery scan failed", extra=logs.fields(error=type(exc).__name__))
            except Exception:  # recovery must outlive one scan's surprise; it is logged
                log.exception("recovery scan failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.scan_s):
                    await self._wake.wait()

    async def scan(self) -> None:
        """One look at the leases and queues (start-up runs one before anything else)."""
        self.scans += 1
        now = time.time_ns()
        owner = self.keeper.owner
        due, idle = await self.live.scan(owner.prefix)
        for lease in due:
            where = (lease.session, lease.execution_id)
            if where in self._working or self.keeper.held(*where):
                continue
            if lease.state == RUNNING and lease.expires_at_ns > now and not await self._dead(lease.owner):
                continue  # a live owner of this machine
            task = asyncio.get_running_loop().create_task(self._one(lease))
            self._working[where] = task
            task.add_done_callback(lambda _, where=where: self._working.pop(where, None))  # type: ignore[misc]
        for uid in idle:
            self._on_idle(uid)
        if self._purge_keys is not None and self.scans % PURGE_EVERY == 1:
            await self._purge_keys()

    async def _dead(self, owner: str) -> bool:
        mine = self.keeper.owner
        return owner != mine.name and await asyncio.to_thread(mine.is_dead, owner)

    async def _one(self, lease: Lease) -> None:
        uid, execution_id = lease.session, lease.execution_id
        try:
            async with self._slots:
                await self._recover(lease)
        except asyncio.CancelledError:
            raise
        except ExecutionCancelled:  # a Cancel (a parent's cascade, say) ended it CANCELED: not a failure
            what = logs.fields(session=uid, execution_id=execution_id, outcome="cancelled")
            log.info("execution recovered", extra=what)
        except (ControllerError, StoreError) as exc:
            what = logs.fields(session=uid, execution_id=execution_id, error=type(exc).__name__)
            log.info("recovery attempt failed", extra=what)
        except Exception:
            log.exception(
                "recovery attempt failed", extra=logs.fields(session=uid, execution_id=execution_id)
            )
        finally:
            self._on_idle(uid)

    async def _recover(self, lease: Lease) -> None:
        core, live = self.core, self.live
        uid, execution_id = lease.session, lease.execution_id
        row = await core.store.get_session(uid)
        if row is None:
            # Deleted: nothing runs on it again, queued turns included.
            await live.drop_lease(uid, execution_id)
            for queued in await live.queue(uid):
                await live.dequeue(uid, queued.execution_id)
            return
        if core.guards.busy(uid):
            return  # an operation here holds it: it deals with the session
        # Looked at without the guard first: most leases found are done with (the turn ended) or
        # wait (a gate nobody decided), and a client's turn must not find the session busy then.
        if not await self._needs_recovery(row, lease, guarded=False):
            return
        async with core.guards.hold(uid, recovery=True):
            if not await self._needs_recovery(row, lease, guarded=True):
                return
            _, executions = await sessions.read(core, row)
            ex = next(e for e in executions if e.id == execution_id)
            outcome = await recover_held(core, self.keeper, self.settings, row, ex, lease)
            if outcome != "parked":
                self.recovered += 1
            what = logs.fields(session=uid, execution_id=execution_id, outcome=outcome)
            log.info("execution recovered", extra=what)

    async def _needs_recovery(self, row: SessionRow, lease: Lease, *, guarded: bool) -> bool:
        """Whether the lease's execution is to be recovered now; a lease that is done with goes,
        a parked one is looked at again later. Writes that need the guard wait for ``guarded``."""
        core, live = self.core, self.live
        uid, execution_id = lease.session, lease.execution_id
        events, executions = await sessions.read(core, row)
        ex = next((e for e in executions if e.id == execution_id), None)
        if ex is None or ex.completed or ex is not latest_execution(executions) or ex.legacy or ex.inherited:
            await live.drop_lease(uid, execution_id)
            return False
        if explicitly_suspended(events, executions):
            await live.drop_lease(uid, execution_id)  # suspended on purpose: Resume completes it
            what = logs.fields(session=uid, execution_id=execution_id, reason="suspended")
            log.info("recovery left the execution alone", extra=what)
            return False
        gate = open_gate(events, executions)
        if gate is None or gate.request_seq == 0:
            return True
        if gate.decided:
            # Its decider may continue it itself: look again at the next scan.
            return _decided_since(events, gate) >= DECISION_GRACE_S
        decision = core.policy.settle(
            row.project, uid, row.fork_seq, events, gate.execution.id, gate.tool_call_id, gate.request_seq
        )
        if decision is None:
            # Nobody decided: parked until the session moves again (only the lease row changes).
            parked = Lease(uid, execution_id, PARKED, "", 0, lease.attempts, seen_seq=len(events))
            await live.claim(lease, parked)  # as scanned: a host that took it meanwhile keeps it
            return False
        # The host's own policy decides it: journaled under the guard, then the turn goes on.
        return not guarded or await approvals.settle(core, row)
