"""The counter harness: state that lives only in process memory.

Each execution adds one to a per-session counter held in this process and outputs the new
count. It declares RESUMABILITY_REQUIRES_MEMORY_SNAPSHOT and, per invariant I4, never rebuilds
its count from ``Start.history``: after a memory restore the history is empty by contract, and
replaying journal events into memory state would double count.

Honest degradation: without memory snapshots the count is lost whenever the process restarts
and starts again from zero. That is why a host refuses to place this harness where its runtime
cannot snapshot memory (a remote ``Harness.Connect`` address, for one), refuses approvals for it,
and forks it only at the head. Replaying one of its executions would output a different count
than the journal holds, which the host reports as divergence rather than hiding.

Serve it on its own: ``python -m agentsessions.harnesses.counter --listen 127.0.0.1:50064``
(a host will refuse it there, as above, which makes it a good check of that refusal).
"""

from __future__ import annotations

import sys

from agentsessions.sdk import Execution, HarnessDescriptor, NativeHarness, Resumability
from agentsessions.sdk.cli import serve_main


class CounterHarness(NativeHarness):
    """Counts executions per session in memory; outputs the count as text ("1", "2", ...)."""

    descriptor = HarnessDescriptor(
        id="counter", version="1", resumability=Resumability.REQUIRES_MEMORY_SNAPSHOT
    )

    def __init__(self) -> None:
        super().__init__()
        self._counts: dict[str, int] = {}

    def count(self, session: str) -> int:
        """The current count of a session (0 before its first execution)."""
        return self._counts.get(session, 0)

    async def execute(self, ex: Execution) -> None:
        # Memory is the state; the history is deliberately not read (invariant I4).
        count = self._counts.get(ex.session, 0) + 1
        await ex.output(str(count))
        # Counted only once the host has journaled it, so memory never runs ahead of the journal.
        self._counts[ex.session] = count


if __name__ == "__main__":
    sys.exit(serve_main(CounterHarness(), prog="python -m agentsessions.harnesses.counter"))
