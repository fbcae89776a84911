"""The live host's background loops (lease renewal, the recovery scan) outlive a step that fails in a
way nobody foresaw: the failure is logged with its traceback and the next period runs as usual. (A
loop that died once left a host renewing no lease, so every turn it ran was taken over elsewhere,
or recovering nothing until it restarted.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agentsessions.host.journal.live import LiveStore
from tests.live.world import WAIT_S, LiveHost, ends, exec_request


class FailsFirst:
    """Wraps one of the live store's methods: the first call raises, later ones pass through; an
    event is set once ``enough`` calls were made."""

    def __init__(self, store: LiveStore, name: str, enough: int) -> None:
        self.wrapped: Callable[..., Awaitable[Any]] = getattr(store, name)
        self.calls = 0
        self.enough = enough
        self.reached = asyncio.Event()
        setattr(store, name, self)

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls >= self.enough:
            self.reached.set()
        if self.calls == 1:
            raise RuntimeError("a surprise")
        return await self.wrapped(*args, **kwargs)


def live_store(host: LiveHost) -> LiveStore:
    live = host.controller.live
    assert live is not None
    return live.keeper.live


async def test_lease_renewal_goes_on_after_a_renewal_fails_unexpectedly(
    host: LiveHost, caplog: pytest.LogCaptureFixture
) -> None:
    uid = await host.create()
    call = host.sessions.Exec(exec_request(uid, "hold"))
    assert await host.harness.next_started() == "hold"  # a turn runs here: its lease is renewed
    with caplog.at_level(logging.ERROR, "agentsessions.controller"):
        renew = FailsFirst(live_store(host), "renew", enough=3)
        async with asyncio.timeout(WAIT_S):
            await renew.reached.wait()
    assert any(r.message == "lease renewal failed" and r.exc_info for r in caplog.records)
    host.harness.open("hold")
    assert [u async for u in call][-1].WhichOneof("update") is not None
    assert [e.event.end.state for e in ends(await host.records(uid))] == ["COMPLETED"]


async def test_the_recovery_scan_goes_on_after_a_scan_fails_unexpectedly(
    host: LiveHost, caplog: pytest.LogCaptureFixture
) -> None:
    live = host.controller.live
    assert live is not None and live.recoverer is not None
    with caplog.at_level(logging.ERROR, "agentsessions.controller"):
        scan = FailsFirst(live_store(host), "scan", enough=3)
        async with asyncio.timeout(WAIT_S):
            await scan.reached.wait()
    assert any(r.message == "recovery scan failed" and r.exc_info for r in caplog.records)


async def test_a_turn_that_ends_after_the_queue_closed_advances_nothing(host: LiveHost) -> None:
    """A turn ending during the drain starts no queue advance after the queue's close (the task
    outlived close): queued turns stay queued for the next start."""
    live = host.controller.live
    assert live is not None
    await live.queue.close()
    live.queue.kick("sess-anything")
    assert not live.queue._advancing
