"""Whether the journal takes writes, as its writer last found out.

A store's :class:`JournalHealth` turns unwritable when a write transaction fails because the
journal cannot be written (``JournalUnavailableError``: a read-only or full disk, an immutable
file, a database role without write privilege, a database that cannot be reached) and writable
again when any write commits, the store's probe write included (``DialectStore.probe``). The host
watches it to report ``agentsessions.v1.Sessions`` NOT_SERVING meanwhile and to probe until the
journal takes writes again (``agentsessions.host.journalwatch``).
"""

from __future__ import annotations

import asyncio

__all__ = ["JournalHealth"]


class JournalHealth:
    """The journal's writability: ``failure`` is why the last write failed (None: writable)."""

    def __init__(self) -> None:
        self.failure: str | None = None
        self._changed = asyncio.Event()

    @property
    def writable(self) -> bool:
        return self.failure is None

    def failed(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            self._notify()

    def recovered(self) -> None:
        if self.failure is not None:
            self.failure = None
            self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self) -> None:
        """Until the writability changes (unbounded: callers bound it or cancel it)."""
        await self._changed.wait()
