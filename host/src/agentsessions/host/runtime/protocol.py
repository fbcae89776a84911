"""The Runtime seam: what the host can do with the compute a harness runs on.

A runtime places one harness (a static harness, a ``--harness-process`` child, or an address the
host dials) and answers for the sessions that run on it: create, snapshot, restore, fork, stop and
status, plus the capabilities the controller matches against the harness's descriptor before it
admits an Exec, Resume or Fork (see :mod:`agentsessions.host.runtime.placement`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentsessions.sdk.harness import Harness
from agentsessions.sdk.structs import struct
from agentsessions.v1 import common_pb2, session_pb2


@struct(frozen=True)
class RuntimeCapabilities:
    """What a runtime can do with a harness's compute (wire: ``RuntimeCapabilities``)."""

    memory_snapshot: bool = False  # capture and restore process memory
    cow_fork: bool = False  # fork compute copy-on-write
    attest: bool = False  # attest the compute environment
    gpu_state: bool = False  # provide and capture GPU state

    def to_proto(self) -> session_pb2.RuntimeCapabilities:
        return session_pb2.RuntimeCapabilities(
            memory_snapshot=self.memory_snapshot,
            cow_fork=self.cow_fork,
            attest=self.attest,
            gpu_state=self.gpu_state,
        )


@struct(frozen=True)
class SnapshotRef:
    """A snapshot handle, as the SUSPEND marker records it."""

    local: str = ""
    external_uri: str = ""
    memory: bool = False
    sealed: bool = False

    @classmethod
    def of_session(cls, session: str) -> SnapshotRef:
        """The handle of a session whose compute no snapshot captured: restoring it re-attaches
        the session and the journal rebuilds the rest (the reference's local backend)."""
        return cls(local=session)

    @classmethod
    def from_marker(cls, lifecycle: common_pb2.Lifecycle) -> SnapshotRef:
        """The snapshot a ``LIFECYCLE_SUSPEND`` marker recorded."""
        return cls(
            local=lifecycle.snapshot_local,
            external_uri=lifecycle.snapshot_external_uri,
            memory=lifecycle.snapshot_memory,
            sealed=lifecycle.snapshot_sealed,
        )

    def suspend_marker(self) -> common_pb2.Lifecycle:
        """The ``LIFECYCLE_SUSPEND`` body carrying this snapshot."""
        return common_pb2.Lifecycle(
            kind=common_pb2.Lifecycle.LIFECYCLE_SUSPEND,
            snapshot_local=self.local,
            snapshot_external_uri=self.external_uri,
            snapshot_memory=self.memory,
            snapshot_sealed=self.sealed,
        )


@struct(frozen=True)
class Incarnation:
    """A session's compute on a runtime: which runtime, which worker, where the harness answers."""

    session: str
    runtime: str
    worker: str
    address: str


@runtime_checkable
class Runtime(Protocol):
    """One harness placement. Session-scoped calls raise ValueError for a malformed request."""

    @property
    def name(self) -> str:
        """The runtime kind: ``in-process``, ``subprocess`` or ``remote``."""
        ...

    @property
    def harness(self) -> Harness:
        """How the host reaches the harness this runtime places."""
        ...

    @property
    def memory_loss(self) -> str:
        """When a harness's process memory is lost on this runtime (completes "state is lost ...")."""
        ...

    def capabilities(self) -> RuntimeCapabilities: ...

    async def start(self) -> None:
        """Make the harness reachable (start its process, if the runtime owns one)."""
        ...

    async def close(self) -> None:
        """Release what the runtime owns; a process it started is stopped."""
        ...

    async def create(self, session: str) -> Incarnation:
        """Attach a session to the harness's compute."""
        ...

    async def snapshot(self, session: str) -> SnapshotRef:
        """Checkpoint a session's compute (Suspend, an approval park)."""
        ...

    async def restore(self, ref: SnapshotRef) -> Incarnation:
        """Bring a session's compute back from a snapshot."""
        ...

    async def fork(self, ref: SnapshotRef, child: str) -> Incarnation:
        """Compute for a child session, from the parent's snapshot."""
        ...

    async def stop(self, session: str) -> None:
        """Release a session's compute."""
        ...

    async def status(self, session: str) -> session_pb2.ComputeState.ValueType:
        """The session's compute state as this runtime sees it."""
        ...
