"""The Runtime seam: where a harness runs and what the host can do with its compute.

Three runtimes, one protocol (:class:`Runtime`), one shared conformance suite (``tests/runtime``):

- :class:`InProcessRuntime` — a harness object inside the host process;
- :class:`ProcessRuntime` — a harness process the host starts (``--harness-process``), restarts
  after a crash and stops on shutdown;
- :class:`RemoteRuntime` — a harness at an address somebody else runs (``--harness``, registry).

None of them can snapshot process memory, so :func:`placement_refusal` turns a harness that
needs memory snapshots away on all three. docs/runtimes.md says what each can and cannot do.
"""

from agentsessions.host.runtime.inprocess import InProcessRuntime
from agentsessions.host.runtime.placement import placement_refusal
from agentsessions.host.runtime.process import HarnessProcessError, HarnessProcesses, ProcessRuntime
from agentsessions.host.runtime.protocol import Incarnation, Runtime, RuntimeCapabilities, SnapshotRef
from agentsessions.host.runtime.remote import RemoteRuntime

__all__ = [
    "HarnessProcessError",
    "HarnessProcesses",
    "InProcessRuntime",
    "Incarnation",
    "ProcessRuntime",
    "RemoteRuntime",
    "Runtime",
    "RuntimeCapabilities",
    "SnapshotRef",
    "placement_refusal",
]
