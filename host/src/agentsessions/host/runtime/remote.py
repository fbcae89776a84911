"""The remote runtime: a harness somebody else runs, dialled at an address over Harness.Connect.

Covers ``--harness name=address`` and HarnessRegistry entries. The host does not own the process
behind the address: it cannot snapshot it, restart it or stop it; it only opens connections to it.
"""

from __future__ import annotations

from agentsessions.host.harnesslink import RemoteHarness
from agentsessions.host.runtime.journal_backed import JournalBackedRuntime
from agentsessions.sdk.harness import Harness


class RemoteRuntime(JournalBackedRuntime):
    """Places a harness that already listens at ``address``.

    With ``harness`` given (a link the caller dialled and will close), the runtime uses it;
    otherwise it dials ``address`` itself and closes that link in :meth:`close`.
    """

    name = "remote"
    memory_loss = (
        "whenever the process behind the address restarts, and the host, which does not own that "
        "process, can neither snapshot nor restore it"
    )

    def __init__(self, address: str, harness: Harness | None = None) -> None:
        super().__init__()
        self.address = address
        self._owned: RemoteHarness | None = None
        if harness is None:
            self._owned = RemoteHarness(address)
            harness = self._owned
        self.harness: Harness = harness

    def worker(self) -> str:
        return self.address

    def address_for(self, session: str) -> str:
        return self.address

    async def close(self) -> None:
        if self._owned is not None:
            await self._owned.close()
