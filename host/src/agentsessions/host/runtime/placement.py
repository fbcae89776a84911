"""Placement: match a harness's declared needs against its runtime's capabilities.

Runs at every Exec, Resume and Fork admission, after Describe and before anything is journaled,
so a harness the runtime cannot serve honestly is refused (FAILED_PRECONDITION) instead of running
and silently losing state.
"""

from __future__ import annotations

from agentsessions.host.runtime.protocol import Runtime
from agentsessions.v1 import harness_pb2

DOC = "docs/runtimes.md"


def placement_refusal(
    runtime: Runtime, harness: str, descriptor: harness_pb2.HarnessDescriptor
) -> str | None:
    """Why ``runtime`` cannot serve the described harness, or None when it can."""
    needs = descriptor.capabilities
    caps = runtime.capabilities()
    if needs.resumability == harness_pb2.RESUMABILITY_REQUIRES_MEMORY_SNAPSHOT and not caps.memory_snapshot:
        return (
            f"harness {harness!r} declares RESUMABILITY_REQUIRES_MEMORY_SNAPSHOT, but its runtime "
            f"({runtime.name}) cannot snapshot process memory: the harness's state would be lost "
            f"{runtime.memory_loss}. Serve it on a runtime with memory snapshots, or make the harness "
            f"STATELESS_REPLAY (rebuild its state from Start.history); see {DOC}"
        )
    if needs.requires_gpu and not caps.gpu_state:
        return (
            f"harness {harness!r} requires a GPU, but its runtime ({runtime.name}) neither provides "
            f"nor captures GPU state. Serve it on a runtime that manages GPUs, or clear requires_gpu "
            f"in its descriptor if it brings its own; see {DOC}"
        )
    return None
