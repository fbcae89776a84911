"""Every write the controller makes to the journal: appends under a fence at an expected head
(CAS), fence mints, lifecycle markers, and the writer one execution appends its records through.

A refused CAS or a superseded fence becomes ConcurrencyError (ABORTED); whatever is made durable
extends the journal cache, so the next read of the session costs nothing. Every event is checked
first (``agentsessions.host.recordable`` and the record size limit), whoever produced it: one that
cannot be journaled or read back is refused before anything is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from agentsessions.host import recordable
from agentsessions.host.controller.errors import ConcurrencyError, RecordTooLargeError, UnrecordableError
from agentsessions.host.controller.journal_cache import JournalCache
from agentsessions.host.journal import canon
from agentsessions.host.journal.store import ConflictError, FencedError, JournalStore, StoreError
from agentsessions.host.limits import DEFAULT_LIMITS
from agentsessions.host.telemetry.genai import journal_append
from agentsessions.v1 import common_pb2

# Called with each record an execution made durable (relayed to the Exec stream, in order).
OnRecord = Callable[[common_pb2.LogRecord], Awaitable[None]]


class JournalWriter:
    """Appends, fences and markers for every session of this host."""

    def __init__(
        self,
        store: JournalStore,
        cache: JournalCache,
        max_record_bytes: int = DEFAULT_LIMITS.max_record_bytes,
    ) -> None:
        self._store = store
        self._cache = cache
        self._max_record_bytes = max_record_bytes

    async def append(
        self, uid: str, events: Sequence[common_pb2.Event], head: int, fence: int, *, mint_fence: bool = False
    ) -> list[common_pb2.LogRecord]:
        """Append ``events`` after record ``head`` under ``fence`` (or, with ``mint_fence``, under a
        fence minted in the same transaction); ConcurrencyError when another writer won the head."""
        return await self.append_checked(uid, self.checked(events), head, fence, mint_fence=mint_fence)

    def checked(self, events: Sequence[common_pb2.Event]) -> list[common_pb2.Event]:
        """``events`` as the journal stores them, each checked (RecordTooLargeError,
        UnrecordableError) before anything is written."""
        normalized = [canon.normalize_event(e) for e in events]
        for event in normalized:
            self._check(event)
        return normalized

    async def append_checked(
        self,
        uid: str,
        normalized: Sequence[common_pb2.Event],
        head: int,
        fence: int,
        *,
        mint_fence: bool = False,
    ) -> list[common_pb2.LogRecord]:
        """:meth:`append` of events :meth:`checked` already made ready."""
        try:
            with journal_append(uid, len(normalized)) as span:
                records = await self._store.append(
                    uid, normalized, expected_head=head, fence=fence, mint_fence=mint_fence
                )
                span.wrote(records)
        except ConflictError as exc:
            raise ConcurrencyError(f"session {uid}: {exc}") from exc
        except FencedError as exc:
            raise ConcurrencyError(f"session {uid}: superseded by a newer writer: {exc}") from exc
        self._cache.appended(uid, records)
        return records

    def _check(self, event: common_pb2.Event) -> None:
        size = event.ByteSize()
        if size > self._max_record_bytes:
            raise RecordTooLargeError(
                f"{_kind(event)} record of {size} bytes exceeds the record size limit "
                f"(--max-record-bytes {self._max_record_bytes}); it was not journaled"
            )
        found = recordable.fault(event)
        if found is not None:
            raise UnrecordableError(f"{_kind(event)} record cannot be journaled: {found.path}: {found.rule}")

    async def mint(self, uid: str, head: int) -> int:
        """A new fence for this incarnation, minted only while the journal head is ``head``:
        a writer that lost the race for the head never supersedes the one that won it."""
        try:
            return await self._store.new_fence(uid, expected_head=head)
        except ConflictError as exc:
            raise ConcurrencyError(f"session {uid}: {exc}") from exc

    async def mint_at_head(self, uid: str) -> int:
        """A new fence at the head as the store reports it now."""
        return await self.mint(uid, (await self._store.head(uid)).seq)

    async def marker(
        self, uid: str, fence: int, lifecycle: common_pb2.Lifecycle, on_record: OnRecord | None = None
    ) -> common_pb2.LogRecord:
        """Append a lifecycle marker (no execution id) at the current head."""
        head = await self._store.head(uid)
        (rec,) = await self.append(
            uid, [common_pb2.Event(kind=common_pb2.EVENT_LIFECYCLE, lifecycle=lifecycle)], head.seq, fence
        )
        if on_record is not None:
            await on_record(rec)
        return rec


@dataclass
class ExecutionWriter:
    """Appends one execution's records in order, each extending the previous one (CAS).

    :meth:`append` returns once the record is durable (and relayed). :meth:`append_soon` is for a
    record nothing outside the journal acts on before the execution's next record: it is checked
    and ordered at once, made durable and relayed in the background, and every later append,
    marker or :meth:`flushed` of this execution waits for it first and raises its failure (which
    stays: the execution's head is then unknown). The host answers a model call that way: the
    harness gets the completion while its OUTPUT is flushed, and whatever the harness does with
    it reaches the journal, the client or an effect only after that OUTPUT is durable. A crash in
    between leaves the trailing MODEL_CALL a crash during the model call leaves (re-driven once).
    """

    journal: JournalWriter
    uid: str
    fence: int
    head: int  # the execution's last record so far (ordered; durable once ``flushed``)
    on_record: OnRecord | None = None
    strip_execution_id: bool = False  # legacy turns stay id-less in the journal
    _soon: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def append(self, event: common_pb2.Event) -> common_pb2.LogRecord:
        await self.flushed()
        if self.strip_execution_id:
            event.execution_id = ""
        (rec,) = await self.journal.append(self.uid, [event], self.head, self.fence)
        self.head = rec.seq
        if self.on_record is not None:
            await self.on_record(rec)
        return rec

    def append_soon(self, event: common_pb2.Event) -> None:
        """Order ``event`` after the execution's records now; see the class docstring. Raises
        what :meth:`JournalWriter.checked` raises (nothing is written then)."""
        if self.strip_execution_id:
            event.execution_id = ""
        (checked,) = self.journal.checked([event])
        before, head = self._soon, self.head
        self.head = head + 1

        async def flush() -> None:
            if before is not None:
                await before
            (rec,) = await self.journal.append_checked(self.uid, [checked], head, self.fence)
            if self.on_record is not None:
                await self.on_record(rec)

        task = asyncio.get_running_loop().create_task(flush())
        task.add_done_callback(_retrieved)
        self._soon = task

    async def flushed(self) -> None:
        """Return once every record :meth:`append_soon` ordered is durable and relayed; raise the
        failure of one that was not. A cancel of the caller leaves the flush running."""
        soon = self._soon
        if soon is None:
            return
        if not soon.done():
            await asyncio.wait({soon})
        if soon.cancelled():
            raise StoreError("journal write abandoned: the host is stopping")
        failure = soon.exception()
        if failure is not None:
            raise failure
        self._soon = None

    async def marker(self, lifecycle: common_pb2.Lifecycle) -> common_pb2.LogRecord:
        """A lifecycle marker after the execution's records, under its fence."""
        await self.flushed()
        return await self.journal.marker(self.uid, self.fence, lifecycle, self.on_record)


def _retrieved(task: asyncio.Task[None]) -> None:
    # The failure is raised to whoever appends next; nobody may be left to (the turn was cut).
    if not task.cancelled():
        task.exception()


def _kind(event: common_pb2.Event) -> str:
    name = (
        common_pb2.EventKind.Name(event.kind)
        if event.kind in common_pb2.EventKind.values()
        else str(event.kind)
    )
    return name.removeprefix("EVENT_")
