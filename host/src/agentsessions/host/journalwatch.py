"""While the journal takes no writes, the host says so: its services report NOT_SERVING on
``grpc.health.v1.Health`` and a probe write is tried until one commits (issue #15 item 4).

The store's :class:`~agentsessions.host.journal.health.JournalHealth` turns unwritable when a
write fails for want of storage (callers get UNAVAILABLE "journal not writable: ..."). Then every
service of every listener reports NOT_SERVING (the overall "" status stays SERVING: the process
is alive, only its journal is not, so a liveness probe does not restart it while a readiness
probe takes it out of rotation), and the store's probe write is retried, backing off from
``first_wait_s`` to ``max_wait_s``, until it commits (or any other write does); then the
services report SERVING again. Nothing is lost meanwhile: a refused write was never
acknowledged, and a turn it cut short is left interrupted for Resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from agentsessions.host import logs
from agentsessions.host.health import NOT_SERVING, SERVING, HealthServicer
from agentsessions.host.journal.store import JournalStore, StoreError

__all__ = ["FIRST_WAIT_S", "MAX_WAIT_S", "JournalWatch"]

log = logging.getLogger("agentsessions.host.journal")

FIRST_WAIT_S = 0.5
MAX_WAIT_S = 5.0


class JournalWatch:
    """Mirrors the journal's writability into the listeners' health (see the module docstring)."""

    def __init__(
        self,
        store: JournalStore,
        healths: Sequence[HealthServicer],
        *,
        first_wait_s: float = FIRST_WAIT_S,
        max_wait_s: float = MAX_WAIT_S,
    ) -> None:
        self._store = store
        self._healths = list(healths)
        self._first_wait_s = first_wait_s
        self._max_wait_s = max_wait_s
        self.probes = 0  # probe writes tried (for tests and diagnostics)

    async def run(self) -> None:
        """Until cancelled (the drain cancels it)."""
        health = self._store.health
        while True:
            if health.failure is None:
                await health.changed()
                continue
            log.error("journal not writable", extra=logs.fields(error=health.failure))
            await self._report(NOT_SERVING)
            await self._probe_until_writable()
            log.info("journal writable again")
            await self._report(SERVING)

    async def _probe_until_writable(self) -> None:
        health = self._store.health
        wait = self._first_wait_s
        while health.failure is not None:
            # A regular write that commits meanwhile ends the wait early.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(health.changed(), timeout=wait)
            if health.failure is None:
                return
            self.probes += 1
            with contextlib.suppress(StoreError):
                await self._store.probe()
            wait = min(wait * 2, self._max_wait_s)

    async def _report(self, status: object) -> None:
        for servicer in self._healths:
            await servicer.set_services(status, servicer.services())
