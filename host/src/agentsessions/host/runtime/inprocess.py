"""The in-process runtime: the harness is an object inside the host process.

Cheapest placement, and the least durable: whatever the harness keeps in memory lives exactly as
long as the host process. The journal survives a host restart; the harness's memory does not.
"""

from __future__ import annotations

import os
import socket

from agentsessions.host.runtime.journal_backed import JournalBackedRuntime
from agentsessions.sdk.harness import Harness


class InProcessRuntime(JournalBackedRuntime):
    """Places a harness object the host calls directly (no wire in between)."""

    name = "in-process"
    memory_loss = "whenever the host process stops or restarts, because the harness object lives in the host"

    def __init__(self, harness: Harness) -> None:
        super().__init__()
        self.harness = harness
        self._worker = f"{socket.gethostname() or 'localhost'}/{os.getpid()}"

    def worker(self) -> str:
        return self._worker

    def address_for(self, session: str) -> str:
        return f"inproc://{session}"
