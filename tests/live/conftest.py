"""The live-session tests' host: a SQLite journal in the test's directory and a live host on it
(a module that needs other harnesses or a model defines its own ``host``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentsessions.host.journal.store import JournalStore
from tests.live.world import LiveHost, live_host


@pytest.fixture
async def host(store: JournalStore) -> AsyncIterator[LiveHost]:
    async with live_host(store) as h:
        yield h
