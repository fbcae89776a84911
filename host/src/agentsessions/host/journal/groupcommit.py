"""Group commit: queued writes leave in batches, one transaction (one durable flush) per batch.

A batch starts as soon as a write is queued and a transaction slot is free, and takes its writes
one event-loop turn later: the writers a finished batch just woke queue their next writes first,
so the next batch carries them all. Writes commit in queue order (a batch holds writes queued
earlier than any later batch's).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

__all__ = ["GroupCommit"]

_W = TypeVar("_W")


class GroupCommit(Generic[_W]):
    """A queue of writes and the batches it hands to ``commit``.

    ``commit(batch)`` runs one transaction for the batch and settles every write in it; it may
    only raise when cancelled."""

    def __init__(
        self,
        commit: Callable[[list[_W]], Coroutine[Any, Any, None]],
        *,
        max_batch: int,
        max_in_flight: int = 1,
    ) -> None:
        self._commit = commit
        self._max_batch = max(1, max_batch)
        self._max_in_flight = max(1, max_in_flight)
        self._queue: collections.deque[_W] = collections.deque()
        self._in_flight: set[asyncio.Task[None]] = set()
        # Batches started whose task has not taken its writes yet (one cancelled before its first
        # step leaves with its done callback).
        self._starting: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Writes queued and not yet in a batch."""
        return len(self._queue)

    def submit(self, write: _W) -> None:
        self._queue.append(write)
        self._start()

    def _start(self) -> None:
        # A new batch's task takes its writes at its first step, one loop turn from now, so
        # writes queued meanwhile (by callers a finished batch woke) travel with it.
        loop = asyncio.get_running_loop()
        while len(self._in_flight) < self._max_in_flight and len(self._queue) > len(self._starting):
            task = loop.create_task(self._flush())
            self._starting.add(task)
            self._in_flight.add(task)
            task.add_done_callback(self._done)

    async def _flush(self) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._starting.discard(task)
        size = min(self._max_batch, len(self._queue))
        if size:
            await self._commit([self._queue.popleft() for _ in range(size)])

    def _done(self, task: asyncio.Task[None]) -> None:
        self._in_flight.discard(task)
        self._starting.discard(task)
        if self._queue:
            self._start()

    async def drain(self) -> None:
        """Return once every write queued so far has been committed (or refused)."""
        while self._queue or self._in_flight:
            self._start()
            if self._in_flight:
                await asyncio.wait(list(self._in_flight))
