"""Fork: children that share the parent's journal prefix up to ``at_seq`` (each child's chain
continues the parent's), with compute from the parent's runtime, all or nothing."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import field

from agentsessions.host.callcontext import CallContext
from agentsessions.host.controller import compute, sessions
from agentsessions.host.controller.core import Core
from agentsessions.host.controller.errors import ConcurrencyError, InvalidArgumentError, UnplaceableError
from agentsessions.host.controller.harnesses import describe_placed
from agentsessions.host.controller.sessions import new_session_uid
from agentsessions.host.controller.state import SessionView
from agentsessions.host.journal import canon
from agentsessions.host.journal.store import ConflictError, FencedError, SessionRow
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, harness_pb2

MAX_FORK_CHILDREN = 128


@struct(frozen=True)
class ForkParams:
    at_seq: int = 0  # <= 0: the parent's head
    count: int = 1  # <= 0: one child
    child_names: Sequence[str] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    child_uids: Sequence[str] = ()  # planned by the host (an idempotent retry); else minted


async def fork(core: Core, call: CallContext, uid: str, p: ForkParams) -> list[SessionView]:
    """The children, sharing the parent's records up to ``at_seq``; all or nothing."""
    at_seq, count, child_names = p.at_seq, p.count, p.child_names
    if count <= 0:
        count = 1
    if count > MAX_FORK_CHILDREN:
        raise InvalidArgumentError("count", f"must be at most {MAX_FORK_CHILDREN}, got {count}")
    if child_names and len(child_names) != count:
        raise InvalidArgumentError(
            "child_names", f"must be empty or hold exactly count ({count}) names, got {len(child_names)}"
        )
    parent = await sessions.row(core, call, uid)
    head = await core.store.head(uid)
    if at_seq <= 0:
        at_seq = head.seq
    if at_seq > head.seq:
        raise InvalidArgumentError("at_seq", f"{at_seq} is beyond the session head {head.seq}")
    resolved = await core.catalog.resolve(parent.harness)
    desc = await describe_placed(resolved)
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
            uid=p.child_uids[i] if p.child_uids else new_session_uid(),
            project=parent.project,
            name=child_names[i] if child_names else "",
            harness=parent.harness,
            model=parent.model,
            labels=dict(p.labels),
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
            kind=common_pb2.EVENT_LIFECYCLE,
            lifecycle=common_pb2.Lifecycle(
                kind=common_pb2.Lifecycle.LIFECYCLE_FORK, detail=f"parent@{at_seq}"
            ),
        )
    )
    child_uids = [child.uid for child in children]
    await compute.fork(resolved, uid, child_uids)
    try:
        rows = await core.store.fork(uid, at_seq, children, marker)
    except BaseException as exc:
        await compute.release_all(resolved, child_uids)
        if isinstance(exc, ConflictError | FencedError):
            raise ConcurrencyError(str(exc)) from exc
        raise
    return [await sessions.view(core, r) for r in rows]
