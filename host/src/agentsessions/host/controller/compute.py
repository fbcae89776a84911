"""The controller's use of the Runtime SPI (``agentsessions.host.runtime``): the runtime that places
a session's harness attaches the session before its turn runs (``create``), brings it back on Resume
(``restore``, from the session's own last SUSPEND snapshot), checkpoints it on Suspend and at an
approval park (``snapshot``), gives a Fork's children their compute (``fork``) and releases it on
DeleteSession (``stop``). Placement (capabilities against the descriptor) is checked before any of
these, in ``harnesses.describe_placed``.

A request the runtime refuses as malformed (ValueError) is a precondition failure; a runtime that
cannot bring its harness up raises HarnessUnavailableError itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from agentsessions.host.controller.errors import FailedPreconditionError
from agentsessions.host.controller.eventlog import last_of_kind
from agentsessions.host.controller.harnesses import ResolvedHarness
from agentsessions.host.runtime import Incarnation, Runtime, SnapshotRef
from agentsessions.v1 import common_pb2


async def attach(resolved: ResolvedHarness, uid: str) -> Incarnation:
    """Attach ``uid`` to its harness's compute before a turn runs on it."""
    runtime = resolved.placed_on()
    with _asking(runtime, "create"):
        return await runtime.create(uid)


async def restore(resolved: ResolvedHarness, uid: str, events: Sequence[common_pb2.Event]) -> Incarnation:
    """Bring ``uid``'s compute back from the last snapshot the session itself recorded (a fork's
    copied prefix may hold its parent's), or from the session's own handle when it has none."""
    runtime = resolved.placed_on()
    with _asking(runtime, "restore"):
        return await runtime.restore(_last_snapshot(uid, events))


async def snapshot(resolved: ResolvedHarness, uid: str) -> common_pb2.Lifecycle:
    """Checkpoint ``uid``'s compute; the SUSPEND marker body that records the snapshot."""
    runtime = resolved.placed_on()
    with _asking(runtime, "snapshot"):
        ref = await runtime.snapshot(uid)
    return ref.suspend_marker()


async def fork(resolved: ResolvedHarness, parent: str, children: Sequence[str]) -> None:
    """Compute for each child, from the parent's handle; all or nothing (the ones made are
    released when one fails)."""
    runtime = resolved.placed_on()
    ref = SnapshotRef.of_session(parent)
    made: list[str] = []
    try:
        for child in children:
            with _asking(runtime, "fork"):
                await runtime.fork(ref, child)
            made.append(child)
    except BaseException:
        await release_all(resolved, made)
        raise


async def release_all(resolved: ResolvedHarness, uids: Sequence[str]) -> None:
    """Release each session's compute (DeleteSession, a fork that did not happen)."""
    runtime = resolved.placed_on()
    for uid in uids:
        with _asking(runtime, "stop"):
            await runtime.stop(uid)


def _last_snapshot(uid: str, events: Sequence[common_pb2.Event]) -> SnapshotRef:
    for _, event in last_of_kind(events, common_pb2.EVENT_LIFECYCLE, len(events)):
        lifecycle = event.lifecycle
        if lifecycle.kind == common_pb2.Lifecycle.LIFECYCLE_SUSPEND and lifecycle.snapshot_local == uid:
            return SnapshotRef.from_marker(lifecycle)
    return SnapshotRef.of_session(uid)


@contextlib.contextmanager
def _asking(runtime: Runtime, op: str) -> Iterator[None]:
    try:
        yield
    except ValueError as exc:
        raise FailedPreconditionError(f"runtime {runtime.name} refused {op}: {exc}") from exc
