"""What the built-in runtimes share: the journal is the only durable state.

None of them can capture process memory. A snapshot is a handle naming the session
(``snapshot_local = <session uid>``, ``snapshot_memory = false``, as the reference's local backend
records it); restoring or forking re-attaches a session to the harness, and the controller rebuilds
what the harness sees from the journal (STATELESS_REPLAY). That is exactly why a harness that
declares REQUIRES_MEMORY_SNAPSHOT is refused on all of them (see ``placement``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeAlias

from agentsessions.host.runtime.protocol import Incarnation, RuntimeCapabilities, SnapshotRef
from agentsessions.v1 import session_pb2

ComputeState: TypeAlias = session_pb2.ComputeState.ValueType


class JournalBackedRuntime:
    """Session bookkeeping for a runtime without memory snapshots. Subclasses name the runtime,
    say where the harness answers, and whether it can run right now.

    It remembers the ``max_sessions`` sessions attached most recently; an older one counts as never
    attached (status NONE) until its next turn attaches it again, so the bookkeeping does not grow
    with every session a long-running host has served."""

    name = "journal-backed"
    memory_loss = "whenever its process restarts"
    max_sessions = 10_000

    def __init__(self) -> None:
        self._states: OrderedDict[str, ComputeState] = OrderedDict()

    def capabilities(self) -> RuntimeCapabilities:
        return RuntimeCapabilities()

    def worker(self) -> str:
        """Which worker runs the harness (host/pid, an address)."""
        raise NotImplementedError

    def address_for(self, session: str) -> str:
        """Where a session's harness answers."""
        raise NotImplementedError

    def reachable(self) -> bool:
        """Whether the harness can run a turn right now (a restarting process cannot)."""
        return True

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def create(self, session: str) -> Incarnation:
        _require("session", session, "create")
        self._remember(session, session_pb2.COMPUTE_LIVE)
        return Incarnation(session, self.name, self.worker(), self.address_for(session))

    async def snapshot(self, session: str) -> SnapshotRef:
        _require("session", session, "snapshot")
        self._remember(session, session_pb2.COMPUTE_COLD)
        return SnapshotRef(local=session, memory=False)

    async def restore(self, ref: SnapshotRef) -> Incarnation:
        self._check_ref(ref, "restore")
        return await self.create(ref.local)

    async def fork(self, ref: SnapshotRef, child: str) -> Incarnation:
        self._check_ref(ref, "fork")
        _require("child", child, "fork")
        return await self.create(child)

    async def stop(self, session: str) -> None:
        _require("session", session, "stop")
        if session in self._states:
            self._states[session] = session_pb2.COMPUTE_TERMINATED

    async def status(self, session: str) -> ComputeState:
        state = self._states.get(session, session_pb2.COMPUTE_NONE)
        if state == session_pb2.COMPUTE_LIVE and not self.reachable():
            return session_pb2.COMPUTE_COLD  # attached, but its harness is down until the restart
        return state

    def _remember(self, session: str, state: ComputeState) -> None:
        self._states[session] = state
        self._states.move_to_end(session)
        while len(self._states) > self.max_sessions:
            self._states.popitem(last=False)

    def _check_ref(self, ref: SnapshotRef, op: str) -> None:
        if not ref.local:
            raise ValueError(f"{self.name} runtime: {op} needs a snapshot that names its session (local)")
        if ref.memory:
            raise ValueError(
                f"{self.name} runtime: {op} of a memory snapshot is impossible here; "
                "this runtime takes none, so the snapshot came from another runtime"
            )


def _require(field: str, value: str, op: str) -> None:
    if not value:
        raise ValueError(f"{op} requires a {field} uid")
