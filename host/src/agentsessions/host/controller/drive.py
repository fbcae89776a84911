"""Driving a harness through one execution: run it once over its sink, then journal how it ended.

``END{COMPLETED}``; or ``ERROR`` and a domain error (the turn is left interrupted for Resume); or
the approval park (the runtime's snapshot as a SUSPEND marker); or, when Cancel asked for it,
``END{CANCELED}`` and a CANCEL marker. The turns being driven on this host are listed in
:class:`RunningTurns`, which is how Cancel finds them and how a session shows as running. A Cancel
armed on the session's guard before the turn was driven (guard.ArmedCancel) ends it the same way,
before its harness runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Any

from agentsessions.host import logs
from agentsessions.host.controller import compute
from agentsessions.host.controller.errors import (
    ConcurrencyError,
    ControllerError,
    DeadlineExceededError,
    ExecutionCancelled,
    FailedPreconditionError,
    HarnessRunError,
    HarnessUnavailableError,
    ReplayDivergedError,
)
from agentsessions.host.controller.guard import SessionGuards
from agentsessions.host.controller.harnesses import ResolvedHarness
from agentsessions.host.controller.results import Settle
from agentsessions.host.controller.sink import ExecutionSink
from agentsessions.host.controller.writer import ExecutionWriter
from agentsessions.host.journal.store import ConflictError, FencedError, JournalUnavailableError, StoreError
from agentsessions.host.telemetry.genai import traced_turn
from agentsessions.host.tools.errors import MissingToolExecutorError
from agentsessions.sdk.errors import ApprovalParkedError, ExecutionCancelledError, find_park
from agentsessions.sdk.harness import Harness, Start
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2

log = logging.getLogger("agentsessions.controller")

# Kinds through the generated module's constants: an EnumTypeWrapper attribute costs ~1.5 us.
K = common_pb2
LK = common_pb2.Lifecycle


@struct
class RunningTurn:
    """A turn this host is driving: its task, and how Cancel asks it to stop."""

    execution_id: str
    task: asyncio.Task[Any]
    harness: Harness
    cancel_reason: str | None = None
    # Why the task is cut when it is not Cancel (journaled in the ERROR); None: the caller went away.
    interrupt_reason: str | None = None

    async def stop(self, reason: str, grace_s: float) -> None:
        """Ask the harness to cancel (or cut the task when it cannot), then wait, bounded, for the
        turn to journal its cancellation."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
            canceller = getattr(self.harness, "cancel", None)
            asked = False
            if canceller is not None:
                try:
                    asked = await canceller(self.execution_id, reason)
                except Exception:  # a harness's own cancel that fails: its task is cut instead
                    log.exception("harness cancel failed", extra=logs.fields(execution_id=self.execution_id))
            if not asked:
                self.task.cancel()
        if self.task is not asyncio.current_task():
            # Bounded; the task reports its own outcome, and a cancel of this waiter propagates.
            await asyncio.wait({self.task}, timeout=grace_s)


class RunningTurns:
    """The turns this host drives right now, by session uid."""

    def __init__(self) -> None:
        self._turns: dict[str, RunningTurn] = {}

    def get(self, uid: str) -> RunningTurn | None:
        return self._turns.get(uid)

    def __contains__(self, uid: str) -> bool:
        return uid in self._turns

    def add(self, uid: str, turn: RunningTurn) -> None:
        self._turns[uid] = turn

    def remove(self, uid: str) -> None:
        self._turns.pop(uid, None)

    def all(self) -> list[tuple[str, RunningTurn]]:
        return list(self._turns.items())


class Driver:
    """Runs harnesses over their sinks and journals each execution's ending."""

    def __init__(self, running: RunningTurns) -> None:
        self.running = running
        # How a completed execution bound to a result schema ends (results.Settler); None: END.
        self.settle: Settle | None = None
        # Where a Cancel that came before the turn was driven is armed (the Controller sets it).
        self.guards: SessionGuards | None = None

    @traced_turn(cancelled=lambda exc: isinstance(exc, ExecutionCancelled))
    async def drive(
        self,
        uid: str,
        resolved: ResolvedHarness,
        start: Start,
        sink: ExecutionSink,
        writer: ExecutionWriter,
        deadline_unix: int = 0,
    ) -> common_pb2.LogRecord | None:
        """Run the harness once over the sink, then journal END (or ERROR, or the park).
        Returns the SUSPEND marker when the execution parked on an approval."""

        async def tail(event: common_pb2.Event) -> None:
            event.execution_id = start.execution_id
            await writer.append(event)

        task = asyncio.current_task()
        assert task is not None
        running = RunningTurn(start.execution_id, task, resolved.harness)
        self.running.add(uid, running)
        armed = self.guards.armed(uid) if self.guards is not None else None
        if armed is not None:  # Cancel came during the admission: the harness does not run
            running.cancel_reason = armed.take(start.execution_id)
        failure: BaseException | None = None
        try:
            try:
                if running.cancel_reason is not None:
                    pass  # cancelled before it was driven: it ends CANCELED below, the harness unrun
                elif deadline_unix > 0:
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
                                code=1,
                                description=running.interrupt_reason
                                or "execution cancelled: the caller went away",
                            ),
                        )
                    )
                )
            raise
        finally:
            sink.close()
            self.running.remove(uid)
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
            await writer.marker(common_pb2.Lifecycle(kind=LK.LIFECYCLE_CANCEL, detail=reason))
            raise ExecutionCancelled(reason)
        if sink.parked is not None and failure is None:
            return await writer.marker(await compute.snapshot(resolved, uid))
        if failure is None and sink.unconsumed() > 0:
            failure = ReplayDivergedError(
                f"execution {start.execution_id}: harness left {sink.unconsumed()} "
                "recorded effects unconsumed"
            )
        if failure is not None:
            err = _classify(failure)
            if not isinstance(err, ConcurrencyError):
                with contextlib.suppress(ControllerError, StoreError):  # best effort (spec 1.1 Exec 8)
                    await tail(
                        common_pb2.Event(kind=K.EVENT_ERROR, error=common_pb2.Error(description=str(failure)))
                    )
            raise err from failure
        if self.settle is not None:
            settled_by = await self.settle(uid, start, sink, writer)
            if settled_by is not None:
                return settled_by.parked
        await tail(common_pb2.Event(kind=K.EVENT_END, end=common_pb2.HarnessEnd(state="COMPLETED")))
        return None


async def settled(task: asyncio.Task[Any]) -> None:
    """Wait for ``task`` to end, whatever it ends with (its outcome is seen, not raised). A cancel of
    the waiter itself is raised: a part that is stopping while it waits here stops (swallowing it
    left a background loop running that its owner's close then waited for forever)."""
    if not task.done():
        await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # retrieved: nothing logs it as never seen


async def cancelled(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel each of ``tasks`` (None: none there), then wait for each to end: how the host's
    background parts (recoverer, subagents, queues, lease renewal) stop."""
    present = [t for t in tasks if t is not None]
    for task in present:
        task.cancel()
    for task in present:
        await settled(task)


def _classify(exc: BaseException) -> ControllerError | JournalUnavailableError:
    if isinstance(exc, JournalUnavailableError):
        return exc  # the journal refused the write (UNAVAILABLE); the turn is left for Resume
    if isinstance(exc, HarnessUnavailableError):
        # The harness went away mid-turn: the turn is interrupted (INTERNAL), not refused.
        return HarnessRunError(f"harness run failed: {exc}")
    if isinstance(exc, ControllerError):
        return exc
    if isinstance(exc, MissingToolExecutorError):
        return FailedPreconditionError(str(exc))
    if isinstance(exc, ConflictError | FencedError):
        return ConcurrencyError(str(exc))
    return HarnessRunError(f"harness run failed: {exc}")
